"""Outlier-channel smoothing on the ONNX graph (SmoothQuant's migration, RepQ-ViT's
reparameterisation), symmetric so TensorRT accepts it: an onnx-ir pass.

A LayerNorm whose affine makes a few channels huge ruins a per-tensor activation scale for the
Linear(s) it feeds. For each such *site* a per-channel factor ``s`` is folded into the graph:

    LN scale γ_j, bias β_j  →  γ_j / s_j, β_j / s_j          (the LN output channel j shrinks by s_j)
    W[j, :] of every consuming Linear  →  W[j, :] · s_j       (its output is unchanged)

with ``s_j = max|X_j|^α / max|W_j|^(1−α)`` from calibration statistics. The function is exactly the
same in float; only the quantization noise moves from the activation to the weights.

A site is the output of a ``LayerNormalization`` node, or of a decomposed LayerNorm's final
``Mul(γ)`` [→ ``Add(β)``] with constant per-channel vectors, whose every consumer (through
Reshape / Flatten / Identity that keep the last dimension) is a quantized MatMul / Gemm with a
constant weight. A LayerNorm whose output also feeds a residual Add (post-LN BERT) is not a site.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx_ir as ir

from ..graph.passes import GraphPass, GraphPassReport
from ..graph.query import PASS_THROUGH_OPS, attr, const_array, is_const, static_shape
from .spec import NodeKind, QuantPlan

__all__ = ["SmoothSite", "find_sites", "compute_factors", "SmoothPass"]

_MIN_S, _MAX_S = 1e-4, 1e4


@dataclass(frozen=True)
class SmoothSite:
    """One LayerNorm (or affine Mul/Add) output and the Linears it feeds.

    Attributes:
        tensor: the site's output tensor (observed per channel during calibration).
        name: the LayerNorm node's name (or the Mul's for a decomposed LN).
        scale_ref: (node name, input index) of γ; ``bias_ref`` the same for β (None when absent).
        linears: (node name, weight initializer, input-channel axis) of every consumer.
        channels: the channel count.
    """

    tensor: str
    name: str
    scale_ref: tuple[str, int]
    bias_ref: tuple[str, int] | None
    linears: tuple[tuple[str, str, int], ...]
    channels: int


def _vec(value: ir.Value | None, channels: int) -> bool:
    v = const_array(value)
    return v is not None and v.dtype == np.float32 and v.size == channels and v.shape[-1:] == (channels,)


def _const_input(node: ir.Node) -> int | None:
    if is_const(node.inputs[1]):
        return 1
    return 0 if is_const(node.inputs[0]) else None


def _affine_source(value: ir.Value, channels: int) -> tuple[str, tuple[str, int], tuple[str, int] | None] | None:
    """(name, scale_ref, bias_ref) when ``value`` is a LayerNorm / affine output, else None."""
    p = value.producer()
    if p is None:
        return None
    if p.op_type == "LayerNormalization":
        rank = len(static_shape(value) or ())
        if attr(p, "axis", -1) not in (-1, rank - 1) or not _vec(p.inputs[1], channels):
            return None
        bias = (p.name, 2) if len(p.inputs) > 2 and _vec(p.inputs[2], channels) else None
        return p.name, (p.name, 1), bias
    bias_ref = None
    if p.op_type == "Add":
        ci = _const_input(p)
        if ci is None or not _vec(p.inputs[ci], channels) or len(p.inputs[1 - ci].uses()) != 1:
            return None
        bias_ref = (p.name, ci)
        p = p.inputs[1 - ci].producer()
        if p is None:
            return None
    if p.op_type == "Mul":
        ci = _const_input(p)
        if ci is None or not _vec(p.inputs[ci], channels):
            return None
        return p.name, (p.name, ci), bias_ref
    return None


def _consumers(value: ir.Value, channels: int) -> list[tuple[ir.Node, int]] | None:
    """Consumers seen through channel-preserving reshapes; None if one reshapes channels."""
    if value.is_graph_output():
        return None
    out = []
    for use in value.uses():
        c, j = use.node, use.idx
        if c.op_type in PASS_THROUGH_OPS and j == 0:
            shp = static_shape(c.outputs[0])
            sub = _consumers(c.outputs[0], channels) if shp and shp[-1] == channels else None
            if sub is None:
                return None
            out.extend(sub)
        else:
            out.append((c, j))
    return out


def find_sites(model: ir.Model, plan: QuantPlan) -> tuple[list[SmoothSite], dict[str, str]]:
    """Sites where smoothing applies, and why other quantized Linears' inputs are not sites."""
    planned = {n.node: n for n in plan.nodes if n.kind is NodeKind.linear and n.weight is not None}
    values = ir.convenience.create_value_mapping(model.graph)
    sites: dict[str, SmoothSite] = {}
    skipped: dict[str, str] = {}
    seen: set[str] = set()
    for spec in planned.values():
        v = values[spec.acts[0].tensor]
        while v.producer() is not None and v.producer().op_type in PASS_THROUGH_OPS:
            v = v.producer().inputs[0]
        if v.name in seen:
            continue
        seen.add(v.name)
        shp = static_shape(v)
        if not shp:
            skipped[spec.node] = "input shape unknown"
            continue
        src = _affine_source(v, shp[-1])
        if src is None:
            continue  # not after a LayerNorm: nothing to fold into
        name, scale_ref, bias_ref = src
        linears, why = _site_linears(v, shp[-1], planned)
        if linears is None:
            skipped[name] = why
        else:
            sites[v.name] = SmoothSite(v.name, name, scale_ref, bias_ref, tuple(linears), shp[-1])
    return list(sites.values()), skipped


def _site_linears(value: ir.Value, channels: int, planned: Mapping) -> tuple[list | None, str]:
    consumers = _consumers(value, channels)
    if consumers is None:
        return None, "its output is reshaped across channels or is a graph output"
    linears = []
    for c, j in consumers:
        q = planned.get(c.name)
        if q is None or j != 0:
            return None, f"its output also feeds {c.op_type} '{c.name}' (input {j}), which cannot absorb the factor"
        w = c.inputs[1]
        in_axis = (1 if attr(c, "transB", 0) else 0) if c.op_type == "Gemm" else len(w.const_value.shape) - 2
        linears.append((c.name, w.name, in_axis))
    return linears, ""


def _weight_absmax(w: np.ndarray, in_axis: int) -> np.ndarray:
    return np.abs(w).max(axis=tuple(i for i in range(w.ndim) if i != in_axis))


def compute_factors(model: ir.Model, site: SmoothSite, act_absmax: np.ndarray, alpha: float) -> np.ndarray:
    """SmoothQuant's ``s_j = max|X_j|^α / max|W_j|^(1−α)``, clamped, 1 where a statistic is zero."""
    values = model.graph.initializers
    w_amax = np.zeros(site.channels, np.float64)
    for _, w_name, in_axis in site.linears:
        w_amax = np.maximum(w_amax, _weight_absmax(values[w_name].const_value.numpy().astype(np.float64), in_axis))
    x = np.asarray(act_absmax, np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = np.power(x, alpha) / np.power(w_amax, 1.0 - alpha)
    s = np.where((x > 0) & (w_amax > 0) & np.isfinite(s), s, 1.0)
    return np.clip(s, _MIN_S, _MAX_S).astype(np.float32)


class SmoothPass(GraphPass):
    """Fold per-site factors into the graph, in place; the float function is unchanged.

    Args:
        sites: from :func:`find_sites`.
        factors: site tensor → per-channel ``s``.
    """

    name = "smooth"

    def __init__(self, sites: list[SmoothSite], factors: Mapping[str, np.ndarray]):
        super().__init__()
        self.sites, self.factors = sites, factors

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        nodes = {n.name: n for n in model.graph}
        for site in self.sites:
            s = self.factors.get(site.tensor)
            if s is None:
                report.skipped[site.tensor] = "no factors"
                continue
            s = np.asarray(s, np.float32)
            self._scale(model, nodes[site.scale_ref[0]], site.scale_ref[1], 1.0 / s, f"{site.name}_equalized_scale")
            if site.bias_ref is not None:
                self._scale(model, nodes[site.bias_ref[0]], site.bias_ref[1], 1.0 / s, f"{site.name}_equalized_bias")
            for lin, w_name, in_axis in site.linears:
                shape = [1] * len(model.graph.initializers[w_name].const_value.shape)
                shape[in_axis] = -1
                self._scale(model, nodes[lin], 1, s.reshape(shape), f"{w_name}_equalized")
            report.changed += 1

    @staticmethod
    def _scale(model: ir.Model, node: ir.Node, idx: int, factor: np.ndarray, new_name: str) -> None:
        """Multiply ``node``'s constant input ``idx`` by ``factor``: in place when this node is its only
        reader, else as a new initializer (onnxsim shares identical ones, e.g. every LN's γ of ones)."""
        old = node.inputs[idx]
        arr = const_array(old)
        new = np.ascontiguousarray((arr.astype(np.float32) * factor).reshape(arr.shape), np.float32)
        if old.is_initializer() and len(old.uses()) == 1:
            old.const_value = ir.tensor(new, name=old.name)
            return
        v = ir.Value(name=new_name, const_value=ir.tensor(new, name=new_name), shape=ir.Shape(new.shape),
                     type=ir.TensorType(ir.DataType.FLOAT))
        model.graph.register_initializer(v)
        node.replace_input_with(idx, v)
