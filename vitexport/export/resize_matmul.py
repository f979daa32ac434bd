"""A linear Resize by a fractional factor on a small map, written as one MatMul with its constant interpolation
matrix (an onnx-ir pass; ``export.fractional_resize``).

RKNN 2.5.0 runs a linear ``Resize`` on its NPU when each spatial factor is an integer or the inverse of one, and on
its CPU otherwise (its op table, half-pixel, 2026-12-07: 3→2, 3→16 and 6→16 on the CPU; 2→16, 6→2 and 16→64 on
the NPU). UperNet's pyramid pooling brings its 1, 2, 3 and 6-cell maps back to the feature map's size, so a 16x16
map takes factors 16/3 and 8/3. Linear interpolation is linear in its input: along each axis it is a constant
``(out, in)`` matrix ``R`` (two taps per row, clamped at the edges as ONNX Runtime does), and on the flattened map
``y = x · kron(R_h, R_w)ᵀ``. So ``Reshape → MatMul → Reshape``, which the NPU runs like any Linear, computes the
same values up to float rounding. Only where the constant has at most :data:`MAX_KERNEL` entries (a pyramid's
small maps; a large map's matrix would outweigh the layer), for 4-D float inputs with constant scales or sizes
on H and W, and the coordinate modes ``half_pixel``, ``pytorch_half_pixel``, ``align_corners`` and
``asymmetric`` without antialiasing. Integer factors and their inverses are left as they are.
"""
from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from ..graph.query import attr, static_shape
from .op_lowering import NodeWriter, rewrite_each
from .resize import resize_factors

__all__ = ["MAX_KERNEL", "fractional_resize_as_matmul", "linear_matrix"]

#: the largest interpolation matrix written (entries): a 16x16 map from 6x6 is 36 x 256
MAX_KERNEL = 1 << 18
_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")


def linear_matrix(size: int, out: int, scale: float, mode: str) -> np.ndarray:
    """The (out, size) matrix of ONNX's linear Resize along one axis (``scale``: the factor the node uses)."""
    rows = np.zeros((out, size), np.float64)
    for i in range(out):
        if mode == "align_corners":
            x = i * (size - 1) / (out - 1) if out > 1 else 0.0
        elif mode == "asymmetric":
            x = i / scale
        elif mode == "pytorch_half_pixel" and out == 1:
            x = 0.0
        else:
            x = (i + 0.5) / scale - 0.5
        x = min(max(x, 0.0), size - 1.0)
        lo = int(math.floor(x))
        hi, t = min(lo + 1, size - 1), x - lo
        rows[i, lo] += 1.0 - t
        rows[i, hi] += t
    return rows


def _npu_factor(size: int, out: int) -> bool:
    return out % size == 0 or size % out == 0


def _rewrite(w: NodeWriter) -> bool:
    node = w.node
    x = node.inputs[0]
    shape = static_shape(x)
    mode = attr(node, "coordinate_transformation_mode", "half_pixel")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if (shape is None or len(shape) != 4 or attr(node, "mode", "nearest") not in ("linear", b"linear")
            or mode not in _MODES or attr(node, "antialias", 0) or x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16)):
        return False
    scales = resize_factors(node, shape)
    if scales is None or scales[:2] != [1.0, 1.0]:
        return False
    (h, w_), (oh, ow) = shape[2:], [int(math.floor(s * f + 1e-6)) for s, f in zip(shape[2:], scales[2:])]
    if (_npu_factor(h, oh) and _npu_factor(w_, ow)) or h * w_ * oh * ow > MAX_KERNEL:
        return False
    dtype = ir.DataType(x.dtype).numpy()
    kernel = np.kron(linear_matrix(h, oh, scales[2], mode), linear_matrix(w_, ow, scales[3], mode)).T.astype(dtype)
    n, c = shape[:2]
    flat = w.op("Reshape", [x, w.const(np.asarray([n, c, h * w_], np.int64), "flat_shape")])
    flat.shape = ir.Shape([n, c, h * w_])
    mixed = w.op("MatMul", [flat, w.const(kernel, "interpolation")])
    mixed.shape = ir.Shape([n, c, oh * ow])
    w.swap(w.op("Reshape", [mixed, w.const(np.asarray([n, c, oh, ow], np.int64), "out_shape")]))
    return True


def fractional_resize_as_matmul(model: ir.Model) -> int:
    """Rewrite, in place, every linear Resize by a fractional factor on a small map (module docstring).
    Returns how many were rewritten."""
    return rewrite_each(model, "Resize", _rewrite)
