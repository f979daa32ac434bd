"""Outlier output channels of a Linear, scaled into the Linear's output Q/DQ range for RKNN.

RKNN runs a Linear in INT8 only with its output Q/DQ'd (:mod:`.qdq`), and an activation Q/DQ has one
scale per tensor. Trained transformers have a few output channels far larger than the rest: in
all-MiniLM-L6-v2 the second FFN Linear of layer 0 outputs up to 192 on one channel where the others stay
within a few units, so one uint8 step (0.76) is larger than most channels' values and the laid-out file
scored cosine 0.81 where the Q/DQ file itself scored 0.995. (vitexport's Q/DQ file does not quantize that
output at all: on TensorRT and ONNX Runtime it stays float into the residual Add.)

:class:`ScaledLinearOutputs` divides each such channel ``c`` by ``s_c`` inside the Linear, exactly: its
per-channel weight scale (the int8 weights unchanged) and its bias are divided by ``s_c``; a ``Mul`` by
``s_c`` after the output Q/DQ restores the values (an element-wise float16 op on the NPU). The output
Q/DQ then holds every channel at the resolution of the typical ones: per-channel output quantization,
written in ops RKNN runs.
"""
from __future__ import annotations

from typing import Mapping, MutableMapping

import numpy as np
import onnx_ir as ir

from ...graph.passes import GraphPass, GraphPassReport
from ...graph.query import const_array
from .graph import append_after, new_initializer
from .qdq import LinearSite, linear_sites

__all__ = ["channel_scales", "ScaledLinearOutputs", "SPREAD"]

#: a channel whose largest magnitude exceeds SPREAD × the median channel's is scaled down to that bound.
#: Measured on all-MiniLM-L6-v2 (laid-out file in ONNX Runtime, worst / mean cosine over 16 parity samples;
#: the Q/DQ file itself 0.9953 / 0.9974): none 0.811 / 0.866, 8: 0.9918 / 0.9946, 4: 0.9934 / 0.9957,
#: 2: 0.9934 / 0.9966, 1: 0.9945 / 0.9969; every channel equalised to the median (small ones scaled up
#: too) 0.9943 / 0.9971, no better
SPREAD = 1.0


def channel_scales(lo: np.ndarray, hi: np.ndarray, spread: float = SPREAD) -> np.ndarray | None:
    """``s_c`` ≥ 1 per channel bringing every channel within ``spread`` × the median channel's magnitude;
    None when no channel is that far out (nothing to gain)."""
    mag = np.maximum(np.abs(lo), np.abs(hi)).astype(np.float64)
    bound = spread * float(np.median(mag))
    if bound <= 0 or float(mag.max()) <= 2.0 * bound:
        return None
    return np.maximum(mag / bound, 1.0).astype(np.float32)


def _divide_weight(model: ir.Model, site: LinearSite, s: np.ndarray) -> bool:
    """The weight's DequantizeLinear with each output channel's scale divided by ``s``; False when the
    weight is not stored as constant int8 values with a scale along the output channel (or a single scale)."""
    wq, ws = const_array(site.w_dq.inputs[0]), const_array(site.w_dq.inputs[1])
    if wq is None or ws is None or wq.ndim != 2 or len(site.w_dq.inputs) < 3:
        return False
    out_axis = 0 if site.weight_out_in else 1
    if wq.shape[out_axis] != len(s):
        return False
    axis_attr = site.w_dq.attributes.get("axis")
    axis = axis_attr.as_int() if axis_attr is not None else 1
    if np.ndim(ws) and axis % 2 != out_axis:
        return False
    scale = np.broadcast_to(np.asarray(ws, np.float32).reshape(-1), (len(s),)) / s
    zp = const_array(site.w_dq.inputs[2])
    if zp is None:
        return False
    zp_full = np.broadcast_to(np.asarray(zp).reshape(-1), (len(s),)).astype(zp.dtype)
    name = site.matmul.name or "linear"
    site.w_dq.replace_input_with(1, new_initializer(model, f"{name}_w_scale_per_channel", scale.astype(np.float32)))
    site.w_dq.replace_input_with(2, new_initializer(model, f"{name}_w_zp_per_channel", zp_full))
    site.w_dq.attributes["axis"] = ir.AttrInt64("axis", out_axis)
    return True


def _divide_bias(model: ir.Model, site: LinearSite, s: np.ndarray) -> None:
    b = site.bias()
    if b is None:
        return
    node, idx = (site.matmul, 2) if site.matmul.op_type == "Gemm" else (
        site.bias_add, 1 if site.bias_add.inputs[0] is site.matmul.outputs[0] else 0)
    node.replace_input_with(idx, new_initializer(model, f"{node.name}_bias_scaled", (b / s).astype(np.float32)))


class ScaledLinearOutputs(GraphPass):
    """Outlier output channels of each Linear divided inside it and multiplied back after it (module
    docstring); ``ranges`` (output name → (lo, hi), what the output Q/DQ will hold) updated in place to
    the scaled outputs' range."""

    name = "rknn_scaled_linear_outputs"

    def __init__(self, per_channel: Mapping[str, tuple[np.ndarray, np.ndarray]],
                 ranges: MutableMapping[str, tuple[float, float]], spread: float = SPREAD):
        super().__init__()
        self.per_channel, self.ranges, self.spread = per_channel, ranges, spread

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        for site in linear_sites(model):
            out = site.output
            if out.name not in self.per_channel:
                continue
            lo, hi = self.per_channel[out.name]
            s = channel_scales(lo, hi, self.spread)
            if s is None:
                continue
            if out.is_graph_output():
                report.skipped[site.matmul.name] = "its output is a graph output: its outlier channels are left as they are"
                continue
            if not _divide_weight(model, site, s):
                report.skipped[site.matmul.name] = "its weight has no per-output-channel scale to divide"
                continue
            _divide_bias(model, site, s)
            mul = ir.node("Mul", [out, new_initializer(model, f"{out.name}_channel_scale", s)],
                          name=f"{site.matmul.name}_channel_scale")
            mul.outputs[0].name = f"{out.name}_rescaled"
            mul.outputs[0].shape, mul.outputs[0].dtype = out.shape, out.dtype
            append_after(model, out, [mul])
            self.ranges[out.name] = (float((lo / s).min()), float((hi / s).max()))
            report.changed += 1
