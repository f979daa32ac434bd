"""Outlier smoothing on the ONNX graph (SmoothQuant's migration, RepQ-ViT's reparameterisation),
symmetric so TensorRT accepts it: an onnx-ir pass.

A few activation channels with huge magnitudes ruin the per-tensor scale of the Linear(s) they feed.
For each *site* — an activation tensor read only by quantized Linears — a per-channel factor ``s``
moves that range into the weights, which are quantized per output channel and absorb it easily:

    X_j → X_j / s_j        W[j, :] → W[j, :] · s_j        (every consuming Linear; X·W is unchanged)

Where the tensor is a LayerNorm's output (or a decomposed LayerNorm's final affine ``Mul(γ)`` [→
``Add(β)``]) the division folds into the affine terms (``γ/s``, ``β/s``: a *fold* site, no new node);
anywhere else (a GELU output feeding ``fc2``, the attention output feeding ``proj``) a ``Mul`` by
``1/s`` is inserted in front of the Linears (an *insert* site; NNCF does the same). An attention
output (``softmax·V`` through head transposes) needs neither: its factors fold into the V projection's
output columns (a *value* site, :mod:`.vfold`), exact and with no new node. The function is
the same in float either way; only where the quantization noise lands changes. The factors come from
:mod:`.search` (``s_j = max|X_j|^α / max|W_j|^(1−α)`` with α chosen per site on calibration data).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx_ir as ir

from ..graph.passes import GraphPass, GraphPassReport
from ..graph.query import PASS_THROUGH_OPS, attr, const_array, is_const, static_shape
from .spec import NodeKind, QuantPlan
from .vfold import ValueFold, find_value_fold, is_attention_output

__all__ = ["SiteKind", "SmoothSite", "find_sites", "compute_factors", "factors_from", "one_sided", "SmoothPass",
           "weight_in_out"]

_MIN_S, _MAX_S = 1e-4, 1e4


class SiteKind(str, enum.Enum):
    fold = "fold"  # into a LayerNorm's (or affine Mul/Add's) constants
    insert = "insert"  # a new Mul in front of the Linears
    value = "value"  # into the V projection of the attention whose output the site is


@dataclass(frozen=True)
class SmoothSite:
    """One activation tensor and the Linears it feeds.

    Attributes:
        tensor: the site's tensor (observed per channel during calibration).
        name: the LayerNorm / affine node's name (fold) or the tensor's (insert).
        kind: fold or insert.
        scale_ref: (node name, input index) of γ; ``bias_ref`` the same for β (fold sites only).
        linears: (node name, weight initializer, input-channel axis) of every consumer.
        channels: the channel count.
        uses: (node name, input index) of the tensor's readers the inserted Mul feeds (insert sites:
            those leading to the Linears; other readers keep the tensor).
        value: where a value site's factors go in the V projection.
    """

    tensor: str
    name: str
    kind: SiteKind
    scale_ref: tuple[str, int] | None
    bias_ref: tuple[str, int] | None
    linears: tuple[tuple[str, str, int], ...]
    channels: int
    uses: tuple[tuple[str, int], ...] = ()
    value: ValueFold | None = None


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


def _linear_uses(value: ir.Value, channels: int, planned: Mapping) -> tuple[list[tuple[str, int]], list[ir.Node]]:
    """The direct uses of ``value`` that lead only to quantized Linears (through channel-preserving
    reshapes), and those Linears. Other readers (a residual Add, say) are left out of both."""
    uses, linears = [], []
    for use in value.uses():
        c, j = use.node, use.idx
        if c.op_type in PASS_THROUGH_OPS and j == 0:
            shp = static_shape(c.outputs[0])
            reached = _consumers(c.outputs[0], channels) if shp and shp[-1] == channels else None
        else:
            reached = [(c, j)]
        if reached and all(planned.get(n.name) is not None and k == 0 for n, k in reached):
            uses.append((c.name, j))
            linears.extend(n for n, _ in reached)
    return uses, linears


def find_sites(model: ir.Model, plan: QuantPlan, insert: bool = True, max_insert_rank: int | None = None,
               attention_insert: bool = True) -> tuple[list[SmoothSite], dict[str, str]]:
    """Sites where smoothing applies, and why other quantized Linears' inputs are not sites.

    Args:
        insert: also make *insert* sites (a Mul in front of the Linears) where no LayerNorm or
            affine node can absorb the factors.
        max_insert_rank: the highest rank of a tensor an inserted Mul may multiply (None: any; the
            target's ``max_insert_rank``).
        attention_insert: also insert a Mul on an attention output whose factors cannot fold into
            V (the target's ``insert_after_attention``).
    """
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
        deep = max_insert_rank is not None and len(shp) > max_insert_rank
        site, why = _site(v, shp[-1], planned, insert and not deep, attention_insert)
        if site is None and insert and deep and why.endswith("inserting a Mul is off"):
            why = f"an inserted Mul would multiply a rank-{len(shp)} tensor; the {plan.target} target takes rank <= {max_insert_rank}"
        if site is None:
            skipped[v.name] = why
        else:
            sites[v.name] = site
    return list(sites.values()), skipped


def _site(v: ir.Value, channels: int, planned: Mapping, insert: bool,
          attention_insert: bool = True) -> tuple[SmoothSite | None, str]:
    src = _affine_source(v, channels)
    consumers = _consumers(v, channels)
    if src is not None and consumers is not None and all(planned.get(c.name) is not None and j == 0 for c, j in consumers):
        name, scale_ref, bias_ref = src  # every reader is a Linear: fold into the affine terms
        return SmoothSite(v.name, name, SiteKind.fold, scale_ref, bias_ref, _weights(c for c, _ in consumers), channels), ""
    folded = _value_site(v, channels, planned)
    if folded is not None:
        return folded, ""
    if not insert:
        return None, "not a LayerNorm read only by Linears, and inserting a Mul is off"
    if v.producer() is None or v.is_graph_input() or v.is_graph_output():
        return None, "a graph input or output"
    if not attention_insert and is_attention_output(v):
        return None, "an attention output whose factors cannot fold into the V projection; the target takes no Mul there"
    uses, linears = _linear_uses(v, channels, planned)
    if not linears:
        return None, "no quantized Linear reads it through channel-preserving reshapes"
    # a Mul on the Linears' branch only: a residual Add (post-LN BERT) keeps reading the tensor itself
    return SmoothSite(v.name, v.name, SiteKind.insert, None, None, _weights(linears), channels, tuple(uses)), ""


def _value_site(v: ir.Value, channels: int, planned: Mapping) -> SmoothSite | None:
    """An attention output read only by Linears whose factors fold into V's projection (no Mul)."""
    if v.producer() is None or v.is_graph_output():
        return None
    uses, linears = _linear_uses(v, channels, planned)
    if not linears or len(uses) != len(v.uses()):
        return None  # another reader (a residual) would see the scaled tensor
    fold = find_value_fold(v, channels)
    if fold is None:
        return None
    return SmoothSite(v.name, v.name, SiteKind.value, None, None, _weights(linears), channels, tuple(uses), fold)


def _weights(linears) -> tuple[tuple[str, str, int], ...]:
    out = []
    for c in linears:
        w = c.inputs[1]
        in_axis = (1 if attr(c, "transB", 0) else 0) if c.op_type == "Gemm" else len(w.const_value.shape) - 2
        out.append((c.name, w.name, in_axis))
    return tuple(out)


def weight_in_out(w: np.ndarray, in_axis: int) -> np.ndarray:
    """A Linear's weight as a (C_in, C_out) matrix, so that ``X @ W`` is its output."""
    return np.moveaxis(np.asarray(w, np.float32), in_axis, 0).reshape(w.shape[in_axis], -1)


def site_weights(model: ir.Model, site: SmoothSite) -> list[np.ndarray]:
    """The site's Linear weights as (C_in, C_out) matrices."""
    inits = model.graph.initializers
    return [weight_in_out(inits[w].const_value.numpy(), ax) for _, w, ax in site.linears]


def compute_factors(model: ir.Model, site: SmoothSite, act_absmax: np.ndarray, alpha: float) -> np.ndarray:
    """SmoothQuant's ``s_j = max|X_j|^α / max|W_j|^(1−α)``, clamped, 1 where a statistic is zero."""
    w_amax = np.zeros(site.channels, np.float64)
    for w in site_weights(model, site):
        w_amax = np.maximum(w_amax, np.abs(w).max(axis=1).astype(np.float64))
    return factors_from(np.asarray(act_absmax, np.float64), w_amax, alpha)


def factors_from(x_amax: np.ndarray, w_amax: np.ndarray, alpha: float) -> np.ndarray:
    """SmoothQuant's factors, never below the median channel's (:func:`one_sided`)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = np.power(x_amax, alpha) / np.power(w_amax, 1.0 - alpha)
    s = np.where((x_amax > 0) & (w_amax > 0) & np.isfinite(s), s, 1.0)
    return np.clip(one_sided(s), _MIN_S, _MAX_S).astype(np.float32)


def one_sided(s: np.ndarray) -> np.ndarray:
    """Factors raised to at least the median channel's: outlier channels are divided down to the typical
    channel's range, quiet channels are never multiplied up past it.

    Why: a channel quiet on the calibration data is not quiet on all data. A trained FFN's second Linear
    reads neurons that fire on rare tokens only (all-MiniLM-L6-v2, layer 1: channel 1157 peaks at 0.56 on
    all 128 calibration sentences, at 4.4 on one held-out sentence of 512); two-sided factors (α 0.95 there)
    multiplied it by 3.6, so the per-tensor clip cut it at 0.35 in its own units, and that sentence's cosine
    fell to 0.986. The factors are scale-free (a common factor moves between the activation's scale and the
    per-channel weight scales), so "the median channel's" is the only level that means the typical channel.
    Measured by the bench (orin, held-out split, worst / mean cosine): all-MiniLM-L6-v2 (512 sentences)
    0.9862 / 0.9977 → 0.9942 / 0.9977 (NNCF 0.9925 / 0.9975, same run); the held-out generated ViTs gen11
    0.9952 → 0.9975 worst and gen15 0.9980 → 0.9979 (NNCF 0.9922, 0.9895)."""
    s = np.asarray(s)
    return np.maximum(s, np.median(s)) if s.size else s


class SmoothPass(GraphPass):
    """Apply per-site factors, in place; the float function is unchanged.

    Args:
        sites: from :func:`find_sites`.
        factors: site tensor → per-channel ``s`` (a site without factors is left alone).
    """

    name = "smooth"

    def __init__(self, sites: list[SmoothSite], factors: Mapping[str, np.ndarray]):
        super().__init__()
        self.sites, self.factors = sites, factors

    def requires(self, model: ir.Model) -> None:
        values = ir.convenience.create_value_mapping(model.graph)
        missing = [s.tensor for s in self.sites if s.tensor in self.factors and s.tensor not in values]
        if missing:
            raise ValueError(f"smoothing sites not in the graph: {missing[:3]}")

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        nodes = {n.name: n for n in model.graph}
        values = ir.convenience.create_value_mapping(model.graph)
        for site in self.sites:
            s = self.factors.get(site.tensor)
            if s is None:
                report.skipped[site.tensor] = "no factors"
                continue
            s = np.asarray(s, np.float32)
            if site.kind is SiteKind.fold:
                self._scale(model, nodes[site.scale_ref[0]], site.scale_ref[1], 1.0 / s, f"{site.name}_equalized_scale")
                if site.bias_ref is not None:
                    self._scale(model, nodes[site.bias_ref[0]], site.bias_ref[1], 1.0 / s, f"{site.name}_equalized_bias")
            elif site.kind is SiteKind.value:
                for name, idx, axis in site.value.refs:  # V's output columns (weight and bias) divided by s
                    shape = [1] * const_array(nodes[name].inputs[idx]).ndim
                    shape[axis] = -1
                    self._scale(model, nodes[name], idx, site.value.factors(1.0 / s).reshape(shape), f"{site.name}_vfold_{idx}")
            else:
                self._insert(model, values[site.tensor], 1.0 / s, [(nodes[n], j) for n, j in site.uses])
            for lin, w_name, in_axis in site.linears:
                shape = [1] * len(model.graph.initializers[w_name].const_value.shape)
                shape[in_axis] = -1
                self._scale(model, nodes[lin], 1, s.reshape(shape), f"{w_name}_equalized")
            report.changed += 1

    @staticmethod
    def _insert(model: ir.Model, x: ir.Value, inv_s: np.ndarray, uses: list[tuple[ir.Node, int]]) -> None:
        """``x`` → ``Mul(x, 1/s)`` for the readers on the Linears' branch (``uses``)."""
        const = ir.Value(name=f"{x.name}_smooth_scale", const_value=ir.tensor(inv_s.astype(np.float32), name=f"{x.name}_smooth_scale"),
                         shape=ir.Shape(inv_s.shape), type=ir.TensorType(ir.DataType.FLOAT))
        model.graph.register_initializer(const)
        mul = ir.node("Mul", [x, const], name=f"{x.name}_smooth_Mul")
        out = mul.outputs[0]
        out.name, out.shape, out.dtype = f"{x.name}_smoothed", x.shape, x.dtype
        model.graph.insert_after(x.producer(), [mul])
        for node, j in uses:
            node.replace_input_with(j, out)

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
        base, k = new_name, 0
        while new_name in model.graph.initializers:  # a weight shared by several sites gets a copy for each
            k += 1
            new_name = f"{base}_{k}"
        v = ir.Value(name=new_name, const_value=ir.tensor(new, name=new_name), shape=ir.Shape(new.shape),
                     type=ir.TensorType(ir.DataType.FLOAT))
        model.graph.register_initializer(v)
        node.replace_input_with(idx, v)
