"""A ``ScatterND`` that overwrites one slice of a tensor, written as ``Slice`` and ``Concat`` (an onnx-ir pass;
``export.slice_scatter``).

An in-place slice assignment in torch (``boxes[..., :2] += reference``, Conditional DETR's box update) exports as
``ScatterND(data, indices, updates)`` with constant ``indices`` that enumerate one box of positions. RKNN 2.5.0's
graph optimiser ran over 20 minutes on Conditional DETR's two such nodes without finishing, and an NPU runs scatters
on its CPU if at all. Where the written positions are exactly a contiguous range on one axis and everything on the
axes before the update's trailing dimensions, and the updates are listed in that box's row-major order once each,
the node is ``Concat(data[.., :start], updates, data[.., stop:])`` along that axis, the updates reshaped to the box
where their shape differs. The rewrite moves values, never computes them: it is exact.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..graph.query import attr, const_array, static_shape
from .op_lowering import NodeWriter, rewrite_each

__all__ = ["slice_scatter_as_concat"]


def _box(indices: np.ndarray, lead: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(axis, start, stop) where ``indices`` (…, q) write, once each and in row-major order, every position of
    ``lead`` (the data's first q dimensions) whose coordinate on ``axis`` is in [start, stop) and none other, with
    exactly one axis partly written; None otherwise."""
    q = indices.shape[-1]
    rows = indices.reshape(-1, q).astype(np.int64)
    size = np.asarray(lead, np.int64)
    rows = np.where(rows < 0, rows + size, rows)
    if rows.size == 0 or (rows < 0).any() or (rows >= size).any():
        return None
    low, high = rows.min(axis=0), rows.max(axis=0) + 1
    partial = [a for a in range(q) if low[a] != 0 or high[a] != lead[a]]
    if len(partial) != 1:
        return None
    box = tuple(int(h - l) for l, h in zip(low, high))
    if rows.shape[0] != int(np.prod(box)):
        return None
    expected = np.stack(np.unravel_index(np.arange(rows.shape[0]), box), axis=-1) + low
    if not np.array_equal(rows, expected):
        return None
    axis = partial[0]
    return axis, int(low[axis]), int(high[axis])


def _rewrite(w: NodeWriter) -> bool:
    node = w.node
    if attr(node, "reduction", "none") not in ("none", b"none") or len(node.inputs) != 3:
        return False
    data, index_value, updates = node.inputs
    indices = const_array(index_value)
    shape, update_shape = static_shape(data), static_shape(updates)
    if indices is None or shape is None or update_shape is None or indices.ndim < 1 or indices.shape[-1] > len(shape):
        return False
    q = indices.shape[-1]
    found = _box(indices, tuple(shape[:q]))
    if found is None:
        return False
    axis, start, stop = found
    box = list(shape)
    box[axis] = stop - start
    if int(np.prod(update_shape)) != int(np.prod(box)):
        return False
    part = updates
    if list(update_shape) != box:
        part = w.op("Reshape", [updates, w.const(np.asarray(box, np.int64), "box")])
        part.shape = ir.Shape(box)

    def piece(lo: int, hi: int, suffix: str) -> ir.Value:
        bounds = [w.const(np.asarray([v], np.int64), f"{suffix}_{k}") for k, v in (("starts", lo), ("ends", hi), ("axes", axis))]
        out = w.op("Slice", [data, *bounds])
        out.shape = ir.Shape([*shape[:axis], hi - lo, *shape[axis + 1:]])
        return out

    parts = ([piece(0, start, "before")] if start > 0 else []) + [part] + (
        [piece(stop, shape[axis], "after")] if stop < shape[axis] else [])
    w.swap(w.op("Concat", parts, {"axis": axis}))
    if index_value.is_initializer() and not index_value.uses():
        w.model.graph.initializers.pop(index_value.name)
    return True


def slice_scatter_as_concat(model: ir.Model) -> int:
    """Rewrite, in place, every ``ScatterND`` whose constant indices write one contiguous slice (module docstring).
    Returns how many were rewritten."""
    return rewrite_each(model, "ScatterND", _rewrite)
