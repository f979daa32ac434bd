"""Where does a NaN or an Inf come from? The first op (ONNX) or module (torch) that produces one.

A non-finite intermediate is not always a fault (a ``-inf`` attention mask becomes finite after
Softmax), so the source is searched backwards from the non-finite *outputs*: the earliest node on a
chain of non-finite tensors that reaches a graph output.
"""
from __future__ import annotations

from dataclasses import field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import onnx
import onnx_ir as ir

from ..results import Data, result
from ..runners.ort_runner import OnnxRuntimeRunner
from ..runners.reference_runner import OnnxReferenceRunner
from ..runners.sessions import Session, SessionConfig
from .onnx_graph import OnnxGraph, load_onnx

__all__ = ["NonFiniteSource", "find_nonfinite", "first_nonfinite_op", "first_nonfinite_module", "locate_nonfinite"]


@result
class NonFiniteSource(Data):
    """The first node whose output holds NaN/Inf on a path to a non-finite graph output (for a torch
    model: the first module, ``op_type='module'``).

    Attributes:
        node: the node's name (``'#<index> <op>'`` when unnamed).
        op_type: its ONNX op.
        output: the non-finite tensor it produced.
        scope: the torch module it was exported from, when the graph says.
        nonfinite_inputs: its inputs that were already non-finite (initializers, graph inputs).
    """

    node: str
    op_type: str
    output: str
    scope: str | None = None
    nonfinite_inputs: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if self.op_type == "module":
            return f"torch module '{self.node}'"
        s = f"node '{self.node}' ({self.op_type})"
        if self.scope:
            s += f" in module '{self.scope}'"
        if self.nonfinite_inputs:
            s += f"; non-finite input(s) {', '.join(self.nonfinite_inputs)}"
        return s


_FLOAT = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16)


def _session(model: ir.Model, outputs: list[str] | None = None):
    # no fusion: every node of the file must exist in the session for its output to be observed
    return Session(model, SessionConfig(optimization="disable"), outputs=outputs)


def _cast_feed(sess, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    types = sess.input_types()
    return {k: np.asarray(feed[k]).astype(t, copy=False) for k, t in types.items()}


def _nonfinite(value: Any) -> bool:
    a = np.asarray(value)
    return bool(np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all())


def find_nonfinite(model: str | Path | bytes | onnx.ModelProto, feed: Mapping[str, np.ndarray], *,
                   chunk: int = 512) -> NonFiniteSource | None:
    """Locate the first op producing NaN/Inf that reaches a graph output.

    Args:
        model: the ONNX model (path, bytes or ModelProto).
        feed: one batch (input name → array).
        chunk: how many intermediate tensors to observe per ONNX Runtime session (memory bound).
    Returns:
        The :class:`NonFiniteSource`, or None when every graph output is finite.
    """
    proto = load_onnx(model)
    graph = OnnxGraph(proto)
    sess = _session(proto)
    feed = _cast_feed(sess, feed)
    outputs = sess.output_names
    bad: set[str] = {n for n, v in zip(outputs, sess.run(outputs, feed)) if _nonfinite(v)}
    if not bad:
        return None
    bad_outputs = set(bad)
    floats = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE)
    for v in proto.graph.initializers.values():
        if v.const_value is not None and v.const_value.dtype in floats and _nonfinite(v.const_value.numpy()):
            bad.add(v.name)
    bad.update(k for k, v in feed.items() if _nonfinite(v))
    inits = graph.initializers
    candidates = [o for n in graph.nodes for o in n.output
                  if o and o not in inits and o not in bad_outputs and graph.elem_type(o) in _FLOAT]
    for start in range(0, len(candidates), chunk):
        names = candidates[start:start + chunk]
        s = _session(proto, names)
        values = s.run(names, feed)
        bad.update(n for n, v in zip(names, values) if _nonfinite(v))
        del values
    # walk back from the non-finite outputs along non-finite tensors
    on_path: set[int] = set()
    stack = list(bad_outputs)
    seen: set[str] = set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        i = graph.producer.get(t)
        if i is None:
            continue
        on_path.add(i)
        stack.extend(x for x in graph.nodes[i].input if x in bad)
    if not on_path:
        return None
    first = min(on_path)
    node = graph.nodes[first]
    out = next((o for o in node.output if o in bad), node.output[0])
    return NonFiniteSource(
        node.name or f"#{first} {node.op_type}",
        node.op_type,
        out,
        graph.scopes[first] or None,
        [x for x in node.input if x in bad and graph.producer.get(x) is None],
    )


def first_nonfinite_op(onnx_path: str | Path | bytes | onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> str | None:
    """The name of the first node (topological order) whose NaN/Inf output reaches a graph output,
    or None when the outputs are finite. See :func:`find_nonfinite` for the details."""
    src = find_nonfinite(onnx_path, feed)
    return src.node if src else None


def _tensors(obj: Any) -> list:
    import torch  # torch loads on first use (~2 s, 0.5 GB): comparing ONNX files never needs it

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, Mapping):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    if hasattr(obj, "to_tuple"):
        return _tensors(obj.to_tuple())
    return []


def _any_nonfinite(obj: Any) -> bool:
    return any(t.is_floating_point() and not bool(t.isfinite().all()) for t in _tensors(obj))


def first_nonfinite_module(module, feed: Mapping[str, np.ndarray]) -> str | None:
    """The first torch module (execution order) whose output holds NaN/Inf while its inputs did not.

    When a module is *called* with non-finite inputs that no earlier module produced, the source is
    functional code of its parent; that is reported as ``'<parent> (before <child>)'``.
    Returns None when the model's output is finite.
    """
    import torch  # torch loads on first use (~2 s, 0.5 GB): comparing ONNX files never needs it

    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in feed.items()}
    for k, v in tensors.items():
        if v.is_floating_point() and not bool(v.isfinite().all()):
            return f"input '{k}'"
    found: list[str] = []
    handles = []

    def pre(name):
        def hook(mod, args, kwargs):
            if not found and (_any_nonfinite(args) or _any_nonfinite(kwargs)):
                parent = name.rpartition(".")[0] or "<root>"
                found.append(f"{parent} (before {name})")
        return hook

    def post(name):
        def hook(mod, args, kwargs, output):
            if not found and _any_nonfinite(output):
                found.append(name)
        return hook

    for name, sub in module.named_modules():
        if not name:
            continue
        handles.append(sub.register_forward_pre_hook(pre(name), with_kwargs=True))
        handles.append(sub.register_forward_hook(post(name), with_kwargs=True))
    try:
        with torch.no_grad():
            out = module(**tensors)
    finally:
        for h in handles:
            h.remove()
    if not _any_nonfinite(out):
        return None
    return found[0] if found else "<root> (functional op)"


def locate_nonfinite(runner, feed: Mapping[str, np.ndarray]) -> str | None:
    """Best-effort source of NaN/Inf for any runner, as text; None when not found or the runner
    cannot be inspected (TensorRT)."""
    source = locate_nonfinite_source(runner, feed)
    return str(source) if source is not None else None


def locate_nonfinite_source(runner, feed: Mapping[str, np.ndarray]) -> NonFiniteSource | None:
    """An ONNX node (ONNX Runtime / reference runners) or a torch module (TorchRunner)."""
    from ..runners.torch_runner import TorchRunner  # torch loads on first use (~2 s, 0.5 GB): comparing ONNX files never needs it

    if isinstance(runner, (OnnxRuntimeRunner, OnnxReferenceRunner)):
        return find_nonfinite(runner.model, feed)
    if isinstance(runner, TorchRunner):
        name = first_nonfinite_module(runner.module, feed)
        return NonFiniteSource(name, "module", "", name) if name else None
    return None
