"""Smoothing factors of an attention output folded into the V projection instead of a new ``Mul``.

The attention output is ``softmax(QKᵀ)·V`` moved through head transposes and reshapes; for a
per-channel factor ``s`` of that output, ``P·(V·diag(1/s)) = (P·V)·diag(1/s)``, so dividing the
V projection's output columns (weight and bias) by ``s`` is exact and adds no node. That matters
beyond saving a ``Mul``: rknn-toolkit2 2.5.0 crashes (SIGSEGV in OpEmit) on a ``Mul`` inserted
after SegFormer's one-head attention output.

Which V column lands in which channel of the site is not guessed from the op sequence: the column
index of every element of the projection's output is carried through the actual Reshape /
Transpose / Split / Gather / Slice nodes (with their constant arguments) to the site. The fold is
made only where that proves, for every element, a single column → channel map, and where no V
column leaves the path anywhere else (a fused QKV's Q and K slices may).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from ..graph.query import attr, const_array, static_shape
from .annotate import attention_role

__all__ = ["ValueFold", "find_value_fold", "is_attention_output"]

#: ops that only move elements (their other inputs constant): labels go through them exactly
_MOVE_OPS = frozenset({"Reshape", "Transpose", "Flatten", "Identity", "Squeeze", "Unsqueeze", "Split", "Gather", "Slice"})
#: between attn·V and the site only ops that keep every element (none dropped, none duplicated)
_KEEP_OPS = frozenset({"Reshape", "Transpose", "Flatten", "Identity", "Squeeze", "Unsqueeze"})
_DEPTH = 12


@dataclass(frozen=True)
class ValueFold:
    """Where an attention-output site's factors go.

    Attributes:
        refs: (node name, input index, output-channel axis) of the V projection's weight and bias.
        columns: for each V projection output column, the site channel it becomes (-1: none, e.g. Q/K).
    """

    refs: tuple[tuple[str, int, int], ...]
    columns: tuple[int, ...]

    def factors(self, inv_s: np.ndarray) -> np.ndarray:
        """Per V column: ``1/s`` of its site channel, 1 for columns that are not V's."""
        cols = np.asarray(self.columns)
        return np.where(cols >= 0, np.asarray(inv_s, np.float32)[np.maximum(cols, 0)], 1.0).astype(np.float32)


def _ints(node: ir.Node, idx: int, name: str) -> list[int] | None:
    """A node's integer argument: the input ``idx`` (opset >= 13) or the attribute ``name``."""
    if len(node.inputs) > idx and node.inputs[idx] is not None:
        a = const_array(node.inputs[idx])
        return None if a is None else [int(x) for x in np.asarray(a).reshape(-1)]
    v = attr(node, name, None)
    return None if v is None else [int(x) for x in (v if isinstance(v, (list, tuple)) else [v])]


def _move(node: ir.Node, x: np.ndarray) -> list[np.ndarray] | None:
    """``node`` applied to the label array ``x`` (its input 0), one array per output; None if unsure."""
    op, outs = node.op_type, [static_shape(o) for o in node.outputs]
    if any(s is None for s in outs):
        return None
    if op == "Transpose":
        perm = attr(node, "perm", None)
        return [np.transpose(x, perm)] if perm is not None else None
    if op in ("Reshape", "Flatten", "Identity", "Squeeze", "Unsqueeze"):  # row-major: the element order is kept
        return [x.reshape(outs[0])] if x.size == int(np.prod(outs[0])) else None
    if op == "Gather":
        idx = const_array(node.inputs[1])
        return None if idx is None else [np.take(x, np.asarray(idx, np.int64), axis=attr(node, "axis", 0))]
    if op == "Split":
        axis = attr(node, "axis", 0) % x.ndim
        sizes = [s[axis] for s in outs]
        return np.split(x, np.cumsum(sizes)[:-1], axis=axis) if sum(sizes) == x.shape[axis] else None
    if op == "Slice":
        starts, ends = _ints(node, 1, "starts"), _ints(node, 2, "ends")
        axes = _ints(node, 3, "axes") or list(range(len(starts or [])))
        steps = _ints(node, 4, "steps") or [1] * len(axes)
        if starts is None or ends is None:
            return None
        sl = [slice(None)] * x.ndim
        for a, b, e, st in zip(axes, starts, ends, steps):
            sl[a % x.ndim] = slice(b, e, st)
        y = x[tuple(sl)]
        return [y] if y.shape == outs[0] else None
    return None


def _projection(value: ir.Value) -> tuple[tuple[tuple[str, int, int], ...], int] | None:
    """(weight/bias refs, output columns) when ``value`` is a Linear's output (MatMul [+ Add], Gemm)."""
    p = value.producer()
    if p is None:
        return None
    bias = None
    if p.op_type == "Add":
        ci = next((i for i in (0, 1) if const_array(p.inputs[i]) is not None), None)
        other = p.inputs[1 - ci].producer() if ci is not None else None
        if other is None or other.op_type != "MatMul" or len(p.inputs[1 - ci].uses()) != 1:
            return None
        bias, p = (p, ci), other
    w = const_array(p.inputs[1]) if p.op_type in ("MatMul", "Gemm") and len(p.inputs) > 1 else None
    if w is None or w.ndim != 2 or const_array(p.inputs[0]) is not None:
        return None
    out_axis = 0 if p.op_type == "Gemm" and attr(p, "transB", 0) else 1
    cols = w.shape[out_axis]
    refs = [(p.name, 1, out_axis)]
    if p.op_type == "Gemm" and len(p.inputs) > 2 and p.inputs[2] is not None:
        bias = (p, 2)
    if bias is not None:
        b = const_array(bias[0].inputs[bias[1]])
        if b is None or b.size != cols or b.shape[-1] != cols:
            return None  # a scalar or full-matrix bias: not one value per column
        refs.append((bias[0].name, bias[1], b.ndim - 1))
    return tuple(refs), cols


def _path_back(site: ir.Value) -> tuple[list[ir.Node], ir.Node] | None:
    """The element-keeping nodes from attn·V to ``site`` (in graph order) and the attn·V MatMul."""
    chain, v = [], site
    for _ in range(_DEPTH):
        p = v.producer()
        if p is None or v.is_graph_output() or (v is not site and len(v.uses()) != 1):
            return None
        if p.op_type == "MatMul" and attention_role(p) == "pv":
            return chain[::-1], p
        if p.op_type not in _KEEP_OPS:
            return None
        chain.append(p)
        v = p.inputs[0]
    return None


def is_attention_output(value: ir.Value) -> bool:
    """Whether ``value`` is attn·V moved only by reshapes / transposes (each read once)."""
    return _path_back(value) is not None


def _v_chain(pv: ir.Node) -> tuple[list[ir.Node], ir.Value] | None:
    """The element-moving nodes from the V projection's output to attn·V's right operand, and that output."""
    chain, v = [], pv.inputs[1]
    for _ in range(_DEPTH):
        if _projection(v) is not None:
            return chain[::-1], v
        p = v.producer()
        if p is None or p.op_type not in _MOVE_OPS:
            return None
        chain.append(p)
        v = p.inputs[0]
    return None


def _escapes(value: ir.Value, labels: np.ndarray, on_path: set[str]) -> list[np.ndarray]:
    """The labels of ``value`` read off the path (a fused QKV's Q / K slices; V read elsewhere)."""
    if value.is_graph_output():
        return [labels]
    out = []
    for use in value.uses():
        if use.node.name in on_path:
            continue
        moved = _move(use.node, labels) if use.node.op_type in _MOVE_OPS and use.idx == 0 else None
        out.extend(moved if moved is not None else [labels])
    return out


def find_value_fold(site: ir.Value, channels: int) -> ValueFold | None:
    """The fold of a site's factors into the V projection, or None when it is not provably exact.

    Args:
        site: the site tensor (every reader of it must be on the smoothed Linears' branch).
        channels: its last dimension.
    """
    back = _path_back(site)
    fwd = _v_chain(back[1]) if back else None
    if fwd is None:
        return None
    (post, pv), (pre, proj_out) = back, fwd
    refs, ncols = _projection(proj_out)
    shape = static_shape(proj_out)
    if shape is None or shape[-1] != ncols:
        return None
    labels, escaped = {proj_out.name: np.broadcast_to(np.arange(ncols), shape)}, []
    on_path = {n.name for n in pre} | {pv.name}
    for node in pre:  # forward: every output computed, every reader off the path noted
        moved = _move(node, labels[node.inputs[0].name])
        if moved is None:
            return None
        labels.update({o.name: a for o, a in zip(node.outputs, moved)})
    values = {proj_out.name: proj_out} | {o.name: o for n in pre for o in n.outputs}
    for name, a in labels.items():
        escaped.extend(_escapes(values[name], a, on_path))
    vl = labels.get(pv.inputs[1].name)
    if vl is None or vl.ndim < 2 or not (vl == vl[..., :1, :]).all():
        return None  # a column must be constant along the summed (token) axis
    x = np.broadcast_to(vl[..., :1, :], static_shape(pv.outputs[0]) or ())
    for node in post:
        moved = _move(node, x)
        if moved is None:
            return None
        x = moved[0]
    if x.shape[-1:] != (channels,):
        return None
    flat = x.reshape(-1, channels)
    columns = np.full(ncols, -1, np.int64)
    for j in range(channels):
        for c in np.unique(flat[:, j]):
            if columns[c] not in (-1, j):
                return None  # one column in two channels: no single factor for it
            columns[c] = j
    moved_cols = columns >= 0
    if any(moved_cols[np.unique(a)].any() for a in escaped if a.size):
        return None
    return ValueFold(refs, tuple(int(c) for c in columns))
