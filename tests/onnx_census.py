"""What a saved ONNX file carries that no output needs, counted on the protobuf itself (independent
of vitexport's lint, which works on onnx-ir): the test of "every file vitexport writes is clean"."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx

__all__ = ["census", "assert_clean"]


def census(path: str | Path) -> dict[str, list[str]]:
    """Unused initializers, dead nodes, unused inputs, dangling value_info, nameless and duplicate
    node names of the file's main graph, each a list of names."""
    g = onnx.load(str(path), load_external_data=False).graph
    producer = {o: n for n in g.node for o in n.output}
    needed, live, stack = set(), set(), [o.name for o in g.output]
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        node = producer.get(name)
        if node is not None and id(node) not in live:
            live.add(id(node))
            stack += [i for i in node.input if i]
    tensors = {o for n in g.node for o in n.output} | {i.name for i in g.input} | {t.name for t in g.initializer}
    names = Counter(n.name for n in g.node if n.name)
    return {
        "unused_initializers": [t.name for t in g.initializer if t.name not in needed],
        "dead_nodes": [n.name or n.op_type for n in g.node if id(n) not in live],
        "unused_inputs": [i.name for i in g.input if i.name not in needed],
        "dangling_value_info": [v.name for v in g.value_info if v.name not in tensors],
        "nameless_nodes": [n.op_type for n in g.node if not n.name],
        "duplicate_node_names": [k for k, c in names.items() if c > 1],
    }


def assert_clean(path: str | Path, *, shapes: bool = True) -> None:
    """The file passes the ONNX checker (topological order included), carries nothing dead and, with
    ``shapes``, types every intermediate tensor in its value_info."""
    onnx.checker.check_model(str(path), full_check=True)
    found = {k: v for k, v in census(path).items() if v}
    assert not found, f"{Path(path).name}: {found}"
    if shapes:
        g = onnx.load(str(path), load_external_data=False).graph
        typed = {v.name for v in g.value_info} | {o.name for o in g.output}
        untyped = [o for n in g.node for o in n.output if o and o not in typed]
        assert not untyped, f"{Path(path).name}: no inferred type for {untyped[:5]}"
