"""Ops a target's ``contract.allowed_ops`` lacks, written exactly with ops it has (an onnx-ir pass).

The exported graph is rewritten after onnxsim, before the contract is checked, and only where the
contract lists the ops of the rewrite and not the op itself (a target without ``allowed_ops`` keeps
every op). Each rewrite computes the same function with the same float32 arithmetic up to rounding
(1e-6 relative), so the simplify stage's parity gate holds:

* ``GlobalAveragePool(x)`` → ``ReduceMean(x, axes=[2, …], keepdims=1)`` (timm's classifier pooling);
* ``ReduceL2(x, axes)`` → ``Sqrt(ReduceMean(x * x, axes) * n)``, n the number of reduced elements
  (``F.normalize``, Swin V2's cosine attention, TinyViT);
* ``Clip(x, lo, hi)`` → ``lo + Relu(x - lo) - Relu(x - hi)`` (either bound alone: ``lo + Relu(x - lo)``,
  ``hi - Relu(hi - x)``; ``F.normalize``'s ``clamp_min(eps)``, ReLU6);
* a constant ``Pad`` (windowed attention padding its tokens to whole windows) → ``Concat`` with
  blocks of the pad value along each padded axis.

Shapes are static (the contract demands it), so ``n`` is a constant.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import numpy as np
import onnx_ir as ir

from ..graph.query import attr, const_array, opset_version, static_shape

__all__ = ["GRAPH_LOWERABLE", "lower_to_allowed_ops", "NodeWriter", "rewrite_each"]

#: op -> (the ops its rewrite writes, how the report says it)
GRAPH_LOWERABLE: dict[str, tuple[frozenset[str], str]] = {
    "GlobalAveragePool": (frozenset({"ReduceMean"}), "ReduceMean over the spatial axes"),
    "ReduceL2": (frozenset({"Mul", "ReduceMean", "Sqrt"}), "Sqrt(ReduceMean(x * x) * n)"),
    "Clip": (frozenset({"Relu", "Add", "Sub"}), "Relu, Add and Sub"),
    "Pad": (frozenset({"Concat"}), "Concat with constant blocks"),
}


class NodeWriter:
    """Builds the replacement nodes of one node (named after it) and swaps them in."""

    def __init__(self, model: ir.Model, node: ir.Node):
        self.model, self.node, self.new = model, node, []
        self.opset = opset_version(model)

    def op(self, op_type: str, inputs: list, attributes: dict | None = None) -> ir.Value:
        n = ir.node(op_type, inputs, attributes or {}, name=f"{self.node.name}_{op_type}_{len(self.new)}")
        n.outputs[0].dtype = self.node.outputs[0].dtype
        self.new.append(n)
        return n.outputs[0]

    def const(self, value: np.ndarray, suffix: str) -> ir.Value:
        name = f"{self.node.name}_{suffix}"
        v = ir.Value(name=name, const_value=ir.tensor(value, name=name), shape=ir.Shape(value.shape),
                     type=ir.TensorType(ir.DataType.from_numpy(value.dtype)))
        self.model.graph.register_initializer(v)
        return v

    def reduce_mean(self, x: ir.Value, axes: list[int], keepdims: int) -> ir.Value:
        if self.opset >= 18:  # axes became an input at opset 18
            return self.op("ReduceMean", [x, self.const(np.asarray(axes, np.int64), "axes")], {"keepdims": keepdims})
        return self.op("ReduceMean", [x], {"axes": axes, "keepdims": keepdims})

    def swap(self, out: ir.Value) -> None:
        out.shape = self.node.outputs[0].shape
        ir.convenience.replace_nodes_and_values(self.model.graph, self.node, [self.node], self.new,
                                                [self.node.outputs[0]], [out])


def rewrite_each(model: ir.Model, op_type: str, rewrite: Callable[[NodeWriter], bool]) -> int:
    """Run ``rewrite`` on every standard-domain ``op_type`` node of ``model`` (it swaps the node or returns False);
    returns how many it rewrote."""
    done = 0
    for node in list(model.graph):
        if node.op_type == op_type and node.domain in ("", "ai.onnx") and rewrite(NodeWriter(model, node)):
            done += 1
    return done


def _axes(node: ir.Node, rank: int, opset: int) -> list[int] | None:
    """A reduction's axes (all of them when none are given), or None when they are not constant."""
    if opset >= 18 and len(node.inputs) > 1 and node.inputs[1] is not None:
        given = const_array(node.inputs[1])
        if given is None:
            return None
        axes = [int(a) for a in given.reshape(-1)]
    else:
        axes = list(attr(node, "axes", []) or [])
    if not axes:
        if attr(node, "noop_with_empty_axes", 0):
            return None
        axes = list(range(rank))
    return sorted(a % rank for a in axes)


def _global_average_pool(w: NodeWriter) -> bool:
    shape = static_shape(w.node.inputs[0])
    if shape is None or len(shape) < 3:
        return False
    w.swap(w.reduce_mean(w.node.inputs[0], list(range(2, len(shape))), 1))
    return True


def _reduce_l2(w: NodeWriter) -> bool:
    x = w.node.inputs[0]
    shape = static_shape(x)
    axes = _axes(w.node, len(shape), w.opset) if shape is not None else None
    if axes is None or x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE):
        return False
    count = int(np.prod([shape[a] for a in axes]))
    mean = w.reduce_mean(w.op("Mul", [x, x]), axes, int(attr(w.node, "keepdims", 1)))
    n = w.const(np.asarray(count, ir.DataType(x.dtype).numpy()), "count")
    w.swap(w.op("Sqrt", [w.op("Mul", [mean, n])]))
    return True


def _clip(w: NodeWriter) -> bool:
    x = w.node.inputs[0]
    lo = w.node.inputs[1] if len(w.node.inputs) > 1 else None
    hi = w.node.inputs[2] if len(w.node.inputs) > 2 else None
    if w.opset < 11 or x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE):
        return False  # opset 6's Clip keeps its bounds in attributes: not rewritten
    if lo is None and hi is None:
        return False  # no bounds: an identity, left to the contract
    if hi is None:
        w.swap(w.op("Add", [lo, w.op("Relu", [w.op("Sub", [x, lo])])]))
    elif lo is None:
        w.swap(w.op("Sub", [hi, w.op("Relu", [w.op("Sub", [hi, x])])]))
    else:
        above_lo = w.op("Add", [lo, w.op("Relu", [w.op("Sub", [x, lo])])])
        w.swap(w.op("Sub", [above_lo, w.op("Relu", [w.op("Sub", [x, hi])])]))
    return True


def _pad_amounts(node: ir.Node, rank: int, opset: int) -> tuple[list[int], float] | None:
    """(pads as [begin..., end...] over every axis, the pad value), or None when not constant."""
    if opset < 11:
        pads, value, axes = list(attr(node, "pads", [])), float(attr(node, "value", 0.0)), None
    else:
        given = const_array(node.inputs[1]) if len(node.inputs) > 1 else None
        cval = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else np.zeros(())
        axes_in = const_array(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
        if given is None or cval is None or (len(node.inputs) > 3 and node.inputs[3] is not None and axes_in is None):
            return None
        pads, value = [int(v) for v in given.reshape(-1)], float(cval.reshape(-1)[0]) if cval.size else 0.0
        axes = None if axes_in is None else [int(a) % rank for a in axes_in.reshape(-1)]
    if axes is not None:  # opset 18: pads name only these axes
        full = [0] * (2 * rank)
        for i, a in enumerate(axes):
            full[a], full[rank + a] = pads[i], pads[len(axes) + i]
        pads = full
    return (pads, value) if len(pads) == 2 * rank and min(pads, default=0) >= 0 else None


def _pad(w: NodeWriter) -> bool:
    x = w.node.inputs[0]
    shape = static_shape(x)
    if shape is None or attr(w.node, "mode", "constant") not in ("constant", b"constant") or x.dtype is None:
        return False
    found = _pad_amounts(w.node, len(shape), w.opset)
    if found is None:
        return False
    pads, value = found
    rank, current, out = len(shape), list(shape), x
    for axis in range(rank):
        parts = []
        for side, amount in (("before", pads[axis]), ("after", pads[rank + axis])):
            block = list(current)
            block[axis] = amount
            parts.append(w.const(np.full(block, value, ir.DataType(x.dtype).numpy()), f"pad{axis}_{side}") if amount else None)
        if parts[0] is None and parts[1] is None:
            continue
        out = w.op("Concat", [p for p in (parts[0], out, parts[1]) if p is not None], {"axis": axis})
        current[axis] += pads[axis] + pads[rank + axis]
    if out is x:
        return False
    w.swap(out)
    return True


_REWRITES: dict[str, Callable[[NodeWriter], bool]] = {
    "GlobalAveragePool": _global_average_pool, "ReduceL2": _reduce_l2, "Clip": _clip, "Pad": _pad,
}


def lower_to_allowed_ops(model: ir.Model, allowed_ops: list[str] | None) -> Counter[str]:
    """Rewrite, in place, every op of :data:`GRAPH_LOWERABLE` missing from ``allowed_ops`` whose
    rewrite uses only allowed ops. Nothing changes when ``allowed_ops`` is None (every op allowed).

    Returns:
        op → how many nodes were rewritten.
    """
    done: Counter[str] = Counter()
    if allowed_ops is None:
        return done
    allowed = set(allowed_ops)
    wanted = {op for op, (uses, _) in GRAPH_LOWERABLE.items() if op not in allowed and uses <= allowed}
    for node in list(model.graph):
        if node.op_type in wanted and node.domain in ("", "ai.onnx") and _REWRITES[node.op_type](NodeWriter(model, node)):
            done[node.op_type] += 1
    return done
