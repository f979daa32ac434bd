"""Lint: what a runtime accepts but a careful user would not ship, in the spirit of ``polygraphy
check lint`` (which warns about unused nodes and inputs and fails on duplicate node names).

Grading rule: a finding is an **error** (``vitexport check`` exits 2) when the file breaks the ONNX
standard or a hard limit, so that a runtime may refuse or misread it; it is a **warning** (exit 0)
when every runtime loads and runs the file but it carries dead weight, slows a runtime down or hides
a mistake. Every finding names the node or tensor.

======================================  ========  =============================================
rule                                    severity  what
======================================  ========  =============================================
``lint.unused_initializer``             warning   an initializer no live node reads (ONNX
                                                  Runtime prints a warning line for each)
``lint.dead_node``                      warning   a node none of whose outputs reaches a graph
                                                  output
``lint.dead_value_info``                warning   a ``value_info`` entry naming no tensor of
                                                  the graph
``lint.unused_input``                   warning   a graph input no node reads (the model's
                                                  interface: vitexport keeps it, see
                                                  :mod:`vitexport.graph.clean`)
``lint.node_name``                      warning   a node without a name (TensorRT names layers,
                                                  profiles and per-layer precisions after nodes)
``lint.duplicate_node_name``            error     two nodes of one graph share a name (the ONNX
                                                  IR spec: names in a namespace MUST be unique)
``lint.input_shadows_initializer``      warning   a graph input that is also an initializer (ONNX
                                                  Runtime then cannot fold the weight)
``lint.float64``                        warning   where float64 enters the graph (an initializer,
                                                  input or node making float64 from other types)
``lint.qdq_noop``                       warning   a Q/DQ pair that does nothing (below)
``lint.inline_2gb``                     error     inline constants of 2 GB or more (protobuf
                                                  cannot serialise them: external data needed)
======================================  ========  =============================================

A Q/DQ pair *does nothing* when (1) its QuantizeLinear re-quantizes a value a DequantizeLinear made,
directly or through ops that only move data, with the same scale, zero point and axis: the values
are already on that grid, so the pair is an identity; or (2) no node reads its DequantizeLinear, only
a graph output: no INT8 kernel consumes it, it only rounds the output. A pair in front of an op the
target runs in float is the target's rule, not a lint (TensorRT's, an error:
:mod:`vitexport.targets.tensorrt.rules`). The lint is the same for every target.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterable

import numpy as np
import onnx
import onnx_ir as ir

from ..graph.query import PASS_THROUGH_OPS, attr, const_array, producer_through
from .contract import all_nodes
from .violation import Severity, Violation, node_label

__all__ = ["LINT_RULES", "lint_model", "value_info_names", "liveness", "PROTOBUF_LIMIT"]

W, E = Severity.warning, Severity.error
#: every lint rule and its severity (the table in the module docstring and docs/check.md)
LINT_RULES: dict[str, Severity] = {
    "lint.unused_initializer": W, "lint.dead_node": W, "lint.dead_value_info": W, "lint.unused_input": W,
    "lint.node_name": W, "lint.duplicate_node_name": E, "lint.input_shadows_initializer": W,
    "lint.float64": W, "lint.qdq_noop": W, "lint.inline_2gb": E,
}
#: protobuf serialises no message of 2 GiB or more
PROTOBUF_LIMIT = 2**31
_MOVES = PASS_THROUGH_OPS | {"Transpose"}  # ops that move a quantized value without changing it
_DEAD_HINT = "remove it (vitexport writes none; onnx-ir's RemoveUnusedNodesPass does it for any file)"


def _lint(rule: str, subject: str, problem: str, hint: str, node: ir.Node | None = None) -> Violation:
    return Violation(rule, subject, problem, hint, node.name if node else None, node.op_type if node else None,
                     LINT_RULES[rule])


def liveness(graph: ir.Graph) -> tuple[set[ir.Node], set[ir.Value]]:
    """The main graph's nodes that some graph output depends on, and every value they read (an If /
    Loop body's reads of the outer graph included)."""
    live: set[ir.Node] = set()
    read: set[ir.Value] = set()
    stack = [v.producer() for v in graph.outputs]
    while stack:
        node = stack.pop()
        if node is None or node in live:
            continue
        live.add(node)
        reads = [v for v in node.inputs if v is not None]
        for a in node.attributes.values():
            if a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
                bodies = [a.as_graph()] if a.type == ir.AttributeType.GRAPH else a.as_graphs()
                reads += [v for body in bodies for n in ir.traversal.RecursiveGraphIterator(body)
                          for v in n.inputs if v is not None]
        read.update(reads)
        stack += [v.producer() for v in reads]
    return live, read


def _dead(model: ir.Model, value_info: Iterable[str]) -> list[Violation]:
    g = model.graph
    (live, read), outputs = liveness(g), set(g.outputs)
    out = [_lint("lint.dead_node", node_label(n), "reaches no graph output", _DEAD_HINT, n) for n in g if n not in live]
    inputs = set(g.inputs)
    out += [_lint("lint.unused_initializer", f"initializer '{v.name}'", "is read by no node that reaches an output",
                  _DEAD_HINT + "; ONNX Runtime warns about each such tensor when it loads the file")
            for v in g.initializers.values() if v not in inputs and v not in read and v not in outputs]
    out += [_lint("lint.unused_input", f"input '{v.name}'", "is read by no node that reaches an output",
                  "users must still feed it: make the model read it, or drop it from the model's inputs "
                  "(vitexport keeps a model's inputs as its interface)")
            for v in g.inputs if v.name not in g.initializers and v not in read and v not in outputs]
    known = {v.name for v in g.inputs} | set(g.initializers) | {o.name for n in all_nodes(model) for o in n.outputs}
    out += [_lint("lint.dead_value_info", f"value_info '{name}'", "names no tensor of the graph",
                  "drop the entry (an editor removed the tensor and left its type behind)")
            for name in value_info if name not in known]
    return out


def _names(model: ir.Model) -> list[Violation]:
    out, counts = [], Counter(n.name for n in all_nodes(model) if n.name)
    for i, n in enumerate(all_nodes(model)):
        if not n.name:
            first = n.outputs[0].name if n.outputs and n.outputs[0].name else "?"
            out.append(_lint("lint.node_name", f"node #{i} ({n.op_type}) writing '{first}'", "has no name",
                             "name every node: engine compilers name their layers, profiles and per-layer precisions "
                             "after them (vitexport names a nameless node <Op>_<first output>)", n))
    dup = {name for name, k in counts.items() if k > 1}
    out += [_lint("lint.duplicate_node_name", f"node '{name}'", f"names {counts[name]} nodes",
                  "give each node its own name (the ONNX IR spec requires it; onnx-ir's NameFixPass does it)")
            for name in sorted(dup)]
    return out


def _shadows(model: ir.Model) -> list[Violation]:
    g = model.graph
    return [_lint("lint.input_shadows_initializer", f"input '{v.name}'", "is also an initializer",
                  "a weight as graph input can be overridden, so ONNX Runtime folds no constant through it: drop it "
                  "from the inputs (torch.onnx.export(..., keep_initializers_as_inputs=False))")
            for v in g.inputs if v.name in g.initializers]


def _float64(model: ir.Model) -> list[Violation]:
    hint = ("GPU engines and NPUs run no float64 and INT8 quantization leaves it alone: export in float32 "
            "(model.float()) or cast once at the input")
    g, f64 = model.graph, ir.DataType.DOUBLE
    out = [_lint("lint.float64", f"{kind} '{v.name}'", "is float64", hint)
           for kind, values in (("input", g.inputs), ("initializer", g.initializers.values())) for v in values
           if v.dtype == f64 and not (kind == "initializer" and v in g.inputs)]
    for n in all_nodes(model):
        makes = any(o.dtype == f64 for o in n.outputs) or (n.op_type == "Cast" and attr(n, "to") == f64)
        if makes and not any(v is not None and v.dtype == f64 for v in n.inputs):
            out.append(_lint("lint.float64", node_label(n), "makes float64 from other types", hint, n))
    return out


def _same_grid(q: ir.Node, dq: ir.Node, moved: bool) -> bool:
    if moved and const_array(q.inputs[1]) is not None and const_array(q.inputs[1]).size > 1:
        return False  # a per-channel grid moved by a Transpose / Reshape is another grid
    for i in (1, 2):
        a = const_array(q.inputs[i]) if len(q.inputs) > i else None
        b = const_array(dq.inputs[i]) if len(dq.inputs) > i else None
        if (a is None) != (b is None) or (a is not None and (a.dtype != b.dtype or not np.array_equal(a, b))):
            return False
    return attr(q, "axis", 1) == attr(dq, "axis", 1)


def _qdq_noop(model: ir.Model) -> list[Violation]:
    out = []
    for n in all_nodes(model):
        if n.op_type != "QuantizeLinear" or len(n.inputs) < 2 or n.inputs[0] is None:
            continue
        src, value = producer_through(n.inputs[0], _MOVES)
        if src is not None and src.op_type == "DequantizeLinear" and _same_grid(n, src, value is not n.inputs[0]):
            out.append(_lint("lint.qdq_noop", node_label(n), f"re-quantizes what {node_label(src)} dequantized, on "
                             "the same scale and zero point", "remove this Q/DQ pair: the values are on its grid already", n))
        dqs = [u.node for u in n.outputs[0].uses() if u.node.op_type == "DequantizeLinear"]
        if dqs and all(not dq.outputs[0].uses() and dq.outputs[0].is_graph_output() for dq in dqs):
            out.append(_lint("lint.qdq_noop", node_label(n), "feeds only a graph output through its DequantizeLinear",
                             "remove this Q/DQ pair: no INT8 kernel reads it, it only rounds the output", n))
    return out


def _inline(model: ir.Model) -> list[Violation]:
    sizes = {v.name: v.const_value.nbytes for v in model.graph.initializers.values()
             if v.const_value is not None and not isinstance(v.const_value, ir.ExternalTensor)}
    for n in all_nodes(model):
        t = attr(n, "value") if n.op_type == "Constant" else None
        if t is not None and hasattr(t, "nbytes"):
            sizes[n.outputs[0].name or n.name] = t.nbytes
    total = sum(sizes.values())
    if total < PROTOBUF_LIMIT:
        return []
    top = ", ".join(f"'{k}' {b / 1e9:.2f} GB" for k, b in sorted(sizes.items(), key=lambda kv: -kv[1])[:3])
    return [_lint("lint.inline_2gb", "the inline constants", f"hold {total / 1e9:.2f} GB, over protobuf's 2 GB "
                  f"limit (largest: {top})", "save the weights as external data (onnx.save_model(..., "
                  "save_as_external_data=True)); vitexport writes weights from 64 MB to <name>.data")]


def lint_model(model: ir.Model, *, value_info: Iterable[str] = ()) -> list[Violation]:
    """Every lint finding on ``model`` (rules and grading in the module docstring).

    Args:
        model: the graph.
        value_info: the names of the file's ``value_info`` entries (onnx-ir drops an entry that
            names no tensor when it loads a file: :func:`value_info_names` reads them).
    Returns:
        The findings, rule by rule in :data:`LINT_RULES` order.
    """
    found = _dead(model, value_info) + _names(model) + _shadows(model) + _float64(model) + _qdq_noop(model)
    found += _inline(model)
    order = {rule: i for i, rule in enumerate(LINT_RULES)}
    return sorted(found, key=lambda v: order[v.rule])


def value_info_names(path: str | Path) -> list[str]:
    """The names of the ``value_info`` entries of the ONNX file ``path`` (its weights are not read)."""
    return [vi.name for vi in onnx.load(str(path), load_external_data=False).graph.value_info]
