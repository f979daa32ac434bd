"""Align-corners linear upsampling by 2, written in ops an NPU runs (an onnx-ir pass; ``export.align_corners_resize``).

``F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)`` (DPT's fusion stages and depth head)
exports as ``Resize(coordinate_transformation_mode=align_corners)``. RKNN 2.5.0 runs that Resize on the CPU, in
INT8 and in float16 alike, at every size tried from 3x3 up (its op table; a 2x2 input is the one exception), while
an ``asymmetric`` or ``half_pixel`` linear Resize by an integer factor runs on the NPU. A round trip to the CPU per
upsampling is what the ``cpu_compute_ops`` gate refuses.

The rewrite is exact. Along an axis of ``n`` values, align-corners output ``i`` (of ``2n``) reads the input at
``p_i = i·(n−1)/(2n−1)``; the asymmetric Resize by 2 gives ``g_j``, the input's linear interpolant at ``j/2`` (the
last one clamped). ``p_i`` lies in ``[(i−1)/2, i/2]``, and those two points always share one unit interval of the
input, where the interpolant is linear, so ``y_i = g_i + t_i·(g_{i−1} − g_i)`` with ``t_i = i/(2n−1)`` (``t_0 = 0``
never reads ``g_{−1}``, ``t_{2n−1} = 1`` never reads the clamped ``g_{2n−1}``). Per axis that is a depthwise
``Conv`` with the kernel ``[1, −1]`` (padded before by one), a ``Mul`` by the constant ``t`` and an ``Add``; RKNN runs
all three on the NPU. Axes resized by 1 get no correction; a Resize by another factor is left as it is.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ..graph.query import attr, const_array, static_shape
from .op_lowering import NodeWriter, rewrite_each

__all__ = ["align_corners_as_asymmetric", "resize_factors"]

_LINEAR = ("linear", b"linear")
_ALIGN = ("align_corners", b"align_corners")


def resize_factors(node: ir.Node, shape: tuple[int, ...]) -> list[float] | None:
    """The factor per axis a Resize uses (its constant ``scales``, or ``sizes`` over the input's), None when
    neither is constant."""
    scales = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
    sizes = const_array(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    if scales is not None and scales.size == len(shape):
        return [float(s) for s in scales.reshape(-1)]
    if sizes is not None and sizes.size == len(shape):
        return [int(o) / i for o, i in zip(sizes.reshape(-1), shape)]
    return None


def _factors(node: ir.Node, shape: tuple[int, ...]) -> list[int] | None:
    """Integer factor per axis (from ``scales`` or ``sizes``), or None when not constant integers."""
    f = resize_factors(node, shape)
    return [int(v) for v in f] if f is not None and all(v == int(v) for v in f) else None


def _rewrite(w: NodeWriter) -> bool:
    node = w.node
    x = node.inputs[0]
    shape = static_shape(x)
    if (shape is None or len(shape) != 4 or attr(node, "mode", "nearest") not in _LINEAR
            or attr(node, "coordinate_transformation_mode", "half_pixel") not in _ALIGN
            or x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16)):
        return False
    factors = _factors(node, shape)
    if factors is None or factors[:2] != [1, 1] or any(f not in (1, 2) for f in factors[2:]) or factors[2:] == [1, 1]:
        return False
    dtype = ir.DataType(x.dtype).numpy()
    channels = shape[1]
    size = [s * f for s, f in zip(shape, factors)]
    out = w.op("Resize", list(node.inputs), {"mode": "linear", "coordinate_transformation_mode": "asymmetric"})
    for axis in (2, 3):
        if factors[axis] != 2:
            continue
        n = shape[axis]
        taps = np.zeros((channels, 2), dtype)
        taps[:, 0], taps[:, 1] = 1.0, -1.0  # g_{i-1} - g_i
        kernel = taps.reshape((channels, 1, 2, 1) if axis == 2 else (channels, 1, 1, 2))
        diff = w.op("Conv", [out, w.const(kernel, f"ac_kernel{axis}")],
                    {"group": channels, "pads": [1, 0, 0, 0] if axis == 2 else [0, 1, 0, 0],
                     "kernel_shape": list(kernel.shape[2:])})
        t = (np.arange(2 * n, dtype=np.float64) / max(2 * n - 1, 1)).astype(dtype)
        weighted = w.op("Mul", [diff, w.const(t.reshape((1, 1, 2 * n, 1) if axis == 2 else (1, 1, 1, 2 * n)), f"ac_weight{axis}")])
        out = w.op("Add", [out, weighted])
    for made in w.new:
        made.outputs[0].shape = ir.Shape(size)
    w.swap(out)
    return True


def align_corners_as_asymmetric(model: ir.Model) -> int:
    """Rewrite, in place, every align-corners linear Resize by 2 (on H, W or both) of a 4-D float tensor with
    constant scales or sizes (module docstring). Returns how many were rewritten."""
    return rewrite_each(model, "Resize", _rewrite)
