"""Outlier-channel equalisation on the ONNX graph (SmoothQuant's migration, RepQ-ViT's
reparameterisation), symmetric so TensorRT accepts it.

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

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from ..calibration.session import placeholder
from .graph import PASS_THROUGH_OPS, GraphIndex
from .targets import QuantPlan

__all__ = ["EqualizeSite", "find_sites", "compute_factors", "apply_equalization"]

_MIN_S, _MAX_S = 1e-4, 1e4


@dataclass
class EqualizeSite:
    """One LayerNorm (or affine Mul/Add) output and the Linears it feeds.

    Attributes:
        tensor: the site's output tensor (observed per channel during calibration).
        name: the LayerNorm node's name (or the Mul's for a decomposed LN).
        scale_ref: (node name, input index) of γ; bias_ref the same for β (None when absent).
        linears: (node name, weight initializer, input-channel axis) of every consumer.
    """

    tensor: str
    name: str
    scale_ref: tuple[str, int]
    bias_ref: tuple[str, int] | None
    linears: list[tuple[str, str, int]] = field(default_factory=list)
    channels: int = 0


def _affine_source(index: GraphIndex, tensor: str, channels: int):
    """(name, scale_ref, bias_ref) when ``tensor`` is a LayerNorm / affine output, else None."""
    p = index.producer.get(tensor)
    if p is None:
        return None

    def vec(name: str) -> bool:
        v = index.const_value(name)
        return v is not None and v.dtype == np.float32 and v.size == channels and v.shape[-1:] == (channels,)

    if p.op_type == "LayerNormalization":
        if index.attr(p, "axis", -1) not in (-1, len(index.shape(tensor) or ()) - 1):
            return None
        if not vec(p.input[1]):
            return None
        bias = (p.name, 2) if len(p.input) > 2 and p.input[2] and vec(p.input[2]) else None
        return p.name, (p.name, 1), bias
    bias_ref = None
    if p.op_type == "Add":
        ci = 1 if index.is_const(p.input[1]) else 0 if index.is_const(p.input[0]) else None
        if ci is None or not vec(p.input[ci]):
            return None
        if len(index.consumers.get(p.input[1 - ci], [])) != 1:
            return None
        bias_ref = (p.name, ci)
        p = index.producer.get(p.input[1 - ci])
        if p is None:
            return None
    if p.op_type == "Mul":
        ci = 1 if index.is_const(p.input[1]) else 0 if index.is_const(p.input[0]) else None
        if ci is None or not vec(p.input[ci]):
            return None
        return p.name, (p.name, ci), bias_ref
    return None


def _consumers_through(index: GraphIndex, tensor: str, channels: int) -> list[tuple[onnx.NodeProto, int]] | None:
    """Consumers of ``tensor`` seen through channel-preserving reshapes; None if one reshapes channels."""
    out = []
    for c, j in index.consumers.get(tensor, []):
        if c.op_type in PASS_THROUGH_OPS and j == 0:
            shp = index.shape(c.output[0])
            if not shp or shp[-1] != channels:
                return None
            sub = _consumers_through(index, c.output[0], channels)
            if sub is None:
                return None
            out.extend(sub)
        else:
            out.append((c, j))
    if tensor in index.graph_outputs:
        return None
    return out


def find_sites(index: GraphIndex, plan: QuantPlan) -> tuple[list[EqualizeSite], dict[str, str]]:
    """Sites where equalisation applies, and why other quantized Linears' inputs are not sites."""
    planned = {n.name: n for n in plan.nodes if n.kind == "linear"}
    sites: dict[str, EqualizeSite] = {}
    skipped: dict[str, str] = {}
    seen_tensors: set[str] = set()
    for q in planned.values():
        # walk back from the Linear's input through channel-preserving reshapes
        t = q.acts[0].tensor
        while index.producer.get(t) is not None and index.producer[t].op_type in PASS_THROUGH_OPS:
            t = index.producer[t].input[0]
        if t in seen_tensors:
            continue
        seen_tensors.add(t)
        shp = index.shape(t)
        if not shp:
            skipped[q.name] = "input shape unknown"
            continue
        channels = shp[-1]
        src = _affine_source(index, t, channels)
        if src is None:
            continue  # not after a LayerNorm: nothing to fold into
        name, scale_ref, bias_ref = src
        consumers = _consumers_through(index, t, channels)
        if consumers is None:
            skipped[name] = "its output is reshaped across channels or is a graph output"
            continue
        linears = []
        ok = True
        for c, j in consumers:
            qn = planned.get(c.name)
            if qn is None or j != 0 or qn.weight is None:
                skipped[name] = f"its output also feeds {c.op_type} '{c.name}' (input {j}), which cannot absorb the factor"
                ok = False
                break
            if c.op_type == "Gemm":
                in_axis = 1 if index.attr(c, "transB", 0) else 0
            else:
                in_axis = len(index.shape(qn.weight.initializer)) - 2
            linears.append((c.name, qn.weight.initializer, in_axis))
        if ok:
            sites[t] = EqualizeSite(t, name, scale_ref, bias_ref, linears, channels)
    return list(sites.values()), skipped


def _weight_absmax(w: np.ndarray, in_axis: int) -> np.ndarray:
    red = tuple(i for i in range(w.ndim) if i != in_axis)
    return np.abs(w).max(axis=red)


def compute_factors(index: GraphIndex, site: EqualizeSite, act_absmax: np.ndarray, alpha: float) -> np.ndarray:
    """SmoothQuant's ``s_j = max|X_j|^α / max|W_j|^(1−α)``, clamped, 1 where a statistic is zero."""
    w_amax = np.zeros(site.channels, np.float64)
    for _, w_name, in_axis in site.linears:
        w_amax = np.maximum(w_amax, _weight_absmax(index.const_value(w_name).astype(np.float64), in_axis))
    x = np.asarray(act_absmax, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.power(x, alpha) / np.power(w_amax, 1.0 - alpha)
    s = np.where((x > 0) & (w_amax > 0) & np.isfinite(s), s, 1.0)
    return np.clip(s, _MIN_S, _MAX_S).astype(np.float32)


def _set_const(model: onnx.ModelProto, index: GraphIndex, node_name: str, input_idx: int, value: np.ndarray,
               new_name: str, uses: dict[str, int]) -> None:
    """Point ``node.input[input_idx]`` at ``value``: in place when it is the initializer's only use,
    else as a new initializer (onnxsim shares identical initializers, e.g. every LN's γ of ones).
    A weight held in ``index.arrays`` (a skeleton's placeholder) stays there."""
    node = index.by_name[node_name]
    old = node.input[input_idx]
    shape = tuple(index.const_value(old).shape)
    arr = np.ascontiguousarray(value.astype(np.float32).reshape(shape))
    in_arrays = old in index.arrays
    if old in index.initializers and uses.get(old, 0) == 1:
        if in_arrays:
            index.arrays[old] = arr
        else:
            index.initializers[old].CopyFrom(numpy_helper.from_array(arr, old))
        return
    # One shared weight scaled for two consumers (onnxsim merges equal weights: ConViT initialises every
    # GPSA value projection to the identity) needs two copies: give each its own name.
    base, k = new_name, 1
    while new_name in index.initializers or new_name in index.shapes:
        new_name, k = f"{base}_{k}", k + 1
    if in_arrays:
        index.arrays[new_name] = arr
        t = placeholder(new_name, shape)
    else:
        t = numpy_helper.from_array(arr, new_name)
    model.graph.initializer.append(t)
    index.initializers[new_name] = model.graph.initializer[-1]
    index.shapes[new_name] = (shape, onnx.TensorProto.FLOAT)  # the re-annotation reads the weight's shape
    node.input[input_idx] = new_name
    uses[old] = uses.get(old, 1) - 1
    uses[new_name] = 1


def apply_equalization(model: onnx.ModelProto, index: GraphIndex, sites: list[EqualizeSite],
                       factors: dict[str, np.ndarray]) -> int:
    """Fold ``factors`` (site tensor → s) into ``model`` (and ``index.arrays``) in place.

    Returns:
        The number of sites changed.
    """
    uses: dict[str, int] = {}
    for n in model.graph.node:
        for t in n.input:
            uses[t] = uses.get(t, 0) + 1
    changed = 0
    for site in sites:
        s = factors.get(site.tensor)
        if s is None:
            continue
        s = np.asarray(s, np.float32)
        node_name, idx = site.scale_ref
        gamma = index.const_value(index.by_name[node_name].input[idx]).astype(np.float32)
        _set_const(model, index, node_name, idx, gamma / s.reshape(gamma.shape[-1:]), f"{site.name}_equalized_scale", uses)
        if site.bias_ref is not None:
            bn, bi = site.bias_ref
            beta = index.const_value(index.by_name[bn].input[bi]).astype(np.float32)
            _set_const(model, index, bn, bi, beta / s.reshape(beta.shape[-1:]), f"{site.name}_equalized_bias", uses)
        for lin, _, in_axis in site.linears:
            node = index.by_name[lin]
            w = index.const_value(node.input[1]).astype(np.float32)
            shape = [1] * w.ndim
            shape[in_axis] = -1
            _set_const(model, index, lin, 1, w * s.reshape(shape), f"{node.input[1]}_equalized", uses)
        changed += 1
    return changed
