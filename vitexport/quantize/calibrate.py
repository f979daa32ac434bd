"""Calibrate: statistics → smoothing → ranges → bias corrections, as one scale table.

Two passes over the calibration data:

1. *statistics* (the first ``quantization.smooth_samples``, fewer above 8 GMAC a sample: :func:`statistics_size`):
   per-channel max |X| and a sample of activation rows at every quantized Linear's input;
2. *ranges* (all samples, on the smoothed model): a streaming histogram per quantized activation.

Between them the smoothing strength of each site is searched on the sampled rows (:mod:`.search`)
and folded in (:mod:`.smooth`); after them each range is chosen (``calibration.method: auto``
scores the histogram's candidates by the Linears' output error) and each Linear's bias correction
computed. The table (``calibration.json``) records what produced it — the model file's hash, the
data's fingerprint, every setting — and a later run with the same three reuses it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import onnx_ir as ir
from threadpoolctl import threadpool_limits

from ..calibration.collect import collect, collect_absmax
from ..calibration.data import SampleSet
from ..calibration.observers import ChannelAbsMaxObserver, GramObserver, HistogramObserver, RowSampler, make_observer
from ..calibration.table import ScaleTable
from ..errors import BadInput
from ..graph.query import attr, static_shape
from ..recipe import CalibrationMethod, Recipe
from .convert import INT8_MAX, MIN_SCALE
from .precision import FP16_MIN_SCALE
from .rounding import GPTQ_BUDGET_MACS, GPTQ_ROWS_PER_INPUT, gptq_cost, gptq_round
from .search import ALPHAS, QuantArith, bias_shift, correction_and_split, search_alpha, search_range
from .smooth import SiteKind, SmoothPass, SmoothSite, compute_factors, find_sites, site_weights, weight_in_out
from .annotate import attention_role
from .profile import QuantProfile
from .spec import NodeKind, NodeSpec, QuantPlan

if TYPE_CHECKING:  # the target is handed in: quantize/ never imports a target, it reads the protocol
    from .target import QuantizeTarget as Target

__all__ = ["TABLE_FORMAT", "CalibrationResult", "table_settings", "calibrate", "reuse_table", "arith_of", "observe_absmax",
           "weight_rounding", "gptq_fit_rows", "statistics_size"]

log = logging.getLogger("vitexport.quantize")

TABLE_FORMAT = 6  # bump when what a table means changes (5: convs bias-corrected, 1x1 searched, depthwise equalised; 6: one-sided smoothing factors)
#: range candidates ``calibration.method: auto`` scores (percentiles of |x|)
_AUTO_PERCENTILES = (99.9, 99.99, 99.999)
#: the evidence a data-driven choice needs. Smoothing divides each channel by its own calibrated
#: maximum, so a channel that exceeds it on new data is clipped: per-channel maxima from a handful of
#: images are too noisy to trust (seen: a 12-image calibration smoothed a classifier head from cosine
#: 0.996 down to 0.95). Fewer images than this: no smoothing, no search, no bias correction. A tensor
#: with one row per image (a classifier head's [CLS] input) has fewer rows than ``MIN_STAT_ROWS`` but is
#: no less needed: left unsmoothed, one planted ×26 channel there cost a post-LN ViT cosine 0.9987 →
#: measured; such a tensor is smoothed with the gentle strengths of ``THIN_ALPHAS`` only.
MIN_STAT_SAMPLES, MIN_STAT_ROWS = 32, 256
THIN_ALPHAS: tuple[float | None, ...] = (None, 0.3, 0.4, 0.5)
#: the statistics pass's compute cap: as many samples as 64 of an 8-GMAC model, at least
#: :data:`MIN_STAT_SAMPLES`. ViT-B/16 at 224 (17.5 GMAC) gets 32: its 32 × 197 rows hold the per-channel maxima and
#: 512 search rows with room to spare, and the 32 runs it saves (~8 s on 2 cores) are what keeps its quantize stage
#: within NNCF's time at 128 calibration samples; models up to ViT-S/16 at 224 and BERT-base at 64 tokens keep 64
_STAT_MACS = 64 * 8e9


def statistics_size(requested: int, macs_per_sample: int) -> int:
    """How many of the first calibration samples the statistics pass runs (``quantization.smooth_samples``,
    capped by compute: :data:`_STAT_MACS`)."""
    if macs_per_sample <= 0:
        return requested
    return min(requested, max(MIN_STAT_SAMPLES, int(_STAT_MACS // macs_per_sample)))


@dataclass
class CalibrationResult:
    """The table, the plan of the (smoothed) model, and what smoothing did."""

    table: ScaleTable
    plan: QuantPlan
    smoothed: int = 0
    smooth_skipped: dict[str, str] = field(default_factory=dict)
    reused: bool = False
    #: weight initializer → (int8 weights in its own layout, per-channel scale) chosen by GPTQ
    rounded: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    #: the (smoothed) float model's primary output on the first samples of the ranges pass (``keep_outputs``
    #: of :func:`calibrate`): the judge's reference on its screen, without a pass of its own
    outputs: np.ndarray | None = None


def table_settings(recipe: Recipe, target: Target, holdout: int) -> dict[str, Any]:
    """Everything besides model and data that changes a table."""
    cal, q = recipe.calibration, recipe.quantization
    return {
        "format": TABLE_FORMAT, "target": target.name, "percentile": cal.percentile, "num_bins": cal.num_bins,
        "num_samples": cal.num_samples, "seed": cal.seed, "holdout": holdout,
        "encoding": target.encoding().__dict__, "per_channel": target.per_channel(),
        "smoothing": ([q.smooth, q.smooth_alpha, q.smooth_samples, q.smooth_insert]  # a rank limit only where one is set
                      + ([target.max_insert_rank] if target.max_insert_rank is not None else [])
                      + ([] if target.insert_after_attention else ["no_attention_insert"])
                      + ([] if target.equalise_depthwise else ["no_depthwise_insert"])) if q.smooth else None,
        "bias_correction": q.bias_correction, "search_rows": q.search_rows, "weight_rounding": q.weight_rounding,
        **({"gptq": [q.gptq_rows, q.gptq_damp]} if q.weight_rounding != "nearest" else {}),
        "quantize_attention_matmuls": [q.quantize_attention_matmuls, q.quantize_attention_pv],
    }


def arith_of(target: Target) -> QuantArith:
    """The rounding the target's plans write, for the searches."""
    enc = target.encoding()
    return QuantArith(enc.symmetric, target.per_channel(), enc.weight_qmax)


def _linears(plan: QuantPlan) -> list[NodeSpec]:
    return [n for n in plan.nodes if n.kind is NodeKind.linear and n.weight is not None]


def gptq_fit_rows(model: ir.Model, plan: QuantPlan, recipe: Recipe, n_samples: int) -> dict[str, tuple[int, int, list[int]]]:
    """Linear input tensor → (the rows GPTQ's Hessian of it sums: ``gptq_rows`` of those the statistics pass
    sees, spread over them; the rows that pass sees (0: unknown); the input widths of the Linears it would
    round), for the Linears GPTQ rounds: under ``weight_rounding: auto`` those with
    :data:`~.rounding.GPTQ_ROWS_PER_INPUT` rows per input channel, under ``gptq`` all."""
    q = recipe.quantization
    n_stat = min(n_samples, statistics_size(q.smooth_samples, plan.total_macs))
    inits, nodes = model.graph.initializers, {n.name: n for n in model.graph}
    out: dict[str, tuple[int, int, list[int]]] = {}
    for spec in _linears(plan):
        w, node = inits.get(spec.weight.initializer), nodes.get(spec.node)
        shape = w.const_value.shape if w is not None and w.const_value is not None else None
        if node is None or shape is None or len(shape) < 2:
            continue
        width = int(shape[1 if attr(node, "transB", 0) else 0] if node.op_type == "Gemm" else shape[-2])
        dims = static_shape(node.inputs[0])
        seen = 0 if dims is None else n_stat * int(np.prod(dims[:-1]))
        rows = min(q.gptq_rows, seen) if seen else q.gptq_rows
        if q.weight_rounding == "gptq" or rows >= GPTQ_ROWS_PER_INPUT * width:
            out.setdefault(spec.acts[0].tensor, (rows, seen, []))[2].append(width)
    return out


def weight_rounding(model: ir.Model, plan: QuantPlan, recipe: Recipe, n_samples: int) -> tuple[str, str]:
    """How integer weights are rounded (``nearest`` or ``gptq``) and why, ``weight_rounding: auto`` resolved by
    GPTQ's arithmetic on the Linears it would round (:func:`gptq_fit_rows`, :func:`~.rounding.gptq_cost`)
    against :data:`~.rounding.GPTQ_BUDGET_MACS`."""
    q = recipe.quantization
    if q.weight_rounding != "auto":
        return q.weight_rounding, f"quantization.weight_rounding: {q.weight_rounding}"
    fits = gptq_fit_rows(model, plan, recipe, n_samples)
    n = sum(len(widths) for _, _, widths in fits.values())
    if not n:
        return "nearest", (f"weight_rounding auto: nearest (no Linear has {GPTQ_ROWS_PER_INPUT:g} calibration rows per "
                           f"input channel for GPTQ)")
    cost = gptq_cost([(c, rows) for rows, _, widths in fits.values() for c in widths])
    mode = "gptq" if cost <= GPTQ_BUDGET_MACS else "nearest"
    return mode, (f"weight_rounding auto: {mode} (GPTQ on {n} Linear(s) costs {cost / 1e9:.3g} G "
                  f"multiply-accumulates, budget {GPTQ_BUDGET_MACS / 1e9:.0f} G)")


def _convs(model: ir.Model, plan: QuantPlan) -> list[NodeSpec]:
    """The plan's 2-D Convs with a constant weight. Their input rows are the channel vectors at each
    pixel (:class:`_ChannelsLast`): a 1×1 group-1 conv without padding is a Linear over them (a
    hybrid's expand / project convs), so the range search by output error applies to it as to a
    Linear (a tensor's own MSE ignores which channels the conv weighs); every conv's mean INT8 output
    error is linear in its input's channel means, so its bias correction applies too (:func:`_conv_matrix`).
    Smoothing stays with the Linears: a factor on a conv input needs a Mul the conv layout does not absorb."""
    out = []
    for spec in plan.nodes:
        w = model.graph.initializers.get(spec.weight.initializer) if spec.weight is not None else None
        if spec.kind is NodeKind.conv and w is not None and w.const_value is not None and len(w.const_value.shape) == 4:
            out.append(spec)
    return out


def _is_pointwise(node: ir.Node, w: np.ndarray) -> bool:
    return w.shape[2:] == (1, 1) and attr(node, "group", 1) == 1 and not any(attr(node, "pads", [0]) or [0])


def _tap_shares(node: ir.Node, kernel: tuple[int, ...]) -> np.ndarray:
    """(kh, kw): the share of a 2-D Conv's output pixels at which each kernel tap reads inside the input
    (not the zero padding); all ones where the input's shape is unknown."""
    shape = static_shape(node.inputs[0]) if node.inputs and node.inputs[0] is not None else None
    if not shape or len(shape) != 4 or len(kernel) != 2:
        return np.ones(kernel, np.float32)
    pads = list(attr(node, "pads", None) or [0, 0, 0, 0])
    strides, dil = list(attr(node, "strides", None) or [1, 1]), list(attr(node, "dilations", None) or [1, 1])
    axes = []
    for a in range(2):
        size, k = shape[2 + a], kernel[a]
        n_out = (size + pads[a] + pads[a + 2] - dil[a] * (k - 1) - 1) // strides[a] + 1
        pos = np.arange(max(n_out, 1))[:, None] * strides[a] - pads[a] + np.arange(k)[None, :] * dil[a]
        axes.append(((pos >= 0) & (pos < size)).mean(0))
    return np.outer(axes[0], axes[1]).astype(np.float32)


def _conv_matrix(node: ir.Node, w: np.ndarray, arith: QuantArith) -> tuple[np.ndarray, np.ndarray]:
    """A Conv's weight (C_out, C_in/g, kh, kw) as the (C_in, C_out) matrix that maps its input's channel
    means to its output's (the kernel summed over its taps, block-diagonal over the groups), float and
    fake-quantized (per output channel, as conversion writes it): the mean output error is
    ``mean(Q(x)) @ Wq − mean(x) @ W``. Each tap is weighed by the share of output pixels where it lands
    inside the image (:func:`_tap_shares`): on a hybrid's 4×4 maps a 3×3 conv's border is most of its output."""
    c_out, c_in_g = w.shape[:2]
    groups = attr(node, "group", 1)
    wq = arith.weight(w.reshape(c_out, -1).T.astype(np.float32)).T.reshape(w.shape)
    share = _tap_shares(node, w.shape[2:])
    mats = []
    for m in (w.astype(np.float32), wq):
        full = np.zeros((c_in_g * groups, c_out), np.float32)
        per_group = c_out // groups
        taps = (m * share).sum(axis=(2, 3))  # (C_out, C_in/g)
        for g in range(groups):
            o = slice(g * per_group, (g + 1) * per_group)
            full[g * c_in_g:(g + 1) * c_in_g, o] = taps[o].T
        mats.append(full)
    return mats[0], mats[1]


#: how far a depthwise conv's input channels are equalised: ``s_c = (max|x_c| / max_c max|x_c|)^α``. A depthwise
#: conv's output channel reads one input channel, so a channel 100× below the tensor's range keeps 1 % of
#: the INT8 levels (no sum over channels averages its error out), and its weight is quantized per channel,
#: so moving the factor into it costs nothing. α < 1: maxima measured on a calibration set are exceeded
#: on new data, and a fully equalised channel would clip there.
DEPTHWISE_ALPHA = 0.5


def _depthwise_sites(model: ir.Model, plan: QuantPlan, target: Target) -> list[tuple[SmoothSite, str]]:
    """An inserted per-channel Mul in front of each planned depthwise conv (weight (C, 1, k, k), group C),
    whose weight takes the factors (:data:`DEPTHWISE_ALPHA`), with the plan tensor whose channel maxima set
    them. The hybrids' MBConv / DSConv depthwise convs read a SiLU / Hardswish output whose channels differ
    by orders of magnitude (folded BatchNorm scales). Not on the graph input, nor where the target takes no
    rank-4 Mul, nor where the target declines the Mul (``equalise_depthwise``)."""
    if not target.equalise_depthwise or (target.max_insert_rank is not None and target.max_insert_rank < 4):
        return []
    nodes = {n.name: n for n in model.graph}
    out = []
    for spec in _convs(model, plan):
        node = nodes.get(spec.node)
        w = model.graph.initializers[spec.weight.initializer]
        x = node.inputs[0] if node is not None else None
        groups = attr(node, "group", 1) if node is not None else 1
        if x is None or x.producer() is None or x.is_graph_input() or groups < 2 or tuple(w.const_value.shape[:2]) != (groups, 1):
            continue
        site = SmoothSite(x.name, x.name, SiteKind.insert, None, None, ((node.name, w.name, 0),), groups, ((node.name, 0),))
        out.append((site, spec.acts[0].tensor))
    return out


class _ChannelsLast:
    """Hands an observer an NCHW tensor as N·H·W rows of C channels (what a 1×1 conv multiplies)."""

    def __init__(self, inner):
        self.inner = inner

    def update(self, x: np.ndarray) -> None:
        self.inner.update(np.moveaxis(np.asarray(x), 1, -1))


@dataclass
class _Stats:
    """Pass-1 statistics per Linear input tensor (before smoothing): per-channel max |X| and sampled
    rows, kept only for tensors with enough evidence (:data:`MIN_STAT_SAMPLES`, :data:`MIN_STAT_ROWS`)."""

    absmax: dict[str, np.ndarray]
    rows: dict[str, np.ndarray]
    thin: list[str] = field(default_factory=list)  # tensors seen too little to act on
    few_rows: set[str] = field(default_factory=set)  # enough images, fewer than MIN_STAT_ROWS rows
    fit: dict[str, GramObserver] = field(default_factory=dict)  # GPTQ's XᵀX, where it rounds


def _statistics(model: ir.Model, plan: QuantPlan, samples: SampleSet, recipe: Recipe, prof: QuantProfile,
                fit_rows: dict[str, tuple[int, int, list[int]]] | None = None) -> _Stats:
    """Channel maxima and ``search_rows`` sampled rows of every Linear / conv input; ``fit_rows``: tensor → the
    rows GPTQ's Hessian sums and of how many (:func:`gptq_fit_rows`)."""
    cal, q = recipe.calibration, recipe.quantization
    fit_rows = fit_rows or {}
    convs = {n.acts[0].tensor for n in _convs(model, plan)}
    tensors = list(dict.fromkeys(n.acts[0].tensor for n in [*_linears(plan), *_convs(model, plan)]))
    obs = {t: [ChannelAbsMaxObserver(), RowSampler(q.search_rows, seed=cal.seed + i)] for i, t in enumerate(tensors)}
    grams = {t: GramObserver(r, seen) for t, (r, seen, _) in fit_rows.items() if t in obs and t not in convs}
    fed = {t: [_ChannelsLast(o) for o in obs[t]] if t in convs else [*obs[t], *([grams[t]] if t in grams else [])]
           for t in tensors}
    log.debug("statistics (channel maxima, %d rows each) for %d Linear input(s)", q.search_rows, len(tensors))
    # one BLAS thread for the Gram products between runs: two spin on after each product and slow the next ONNX
    # Runtime run, which wants both cores (ViT-B/16's calibration passes: 36.7 s without GPTQ's Grams, 43.9 s with
    # them on two threads, 39.3 s on one)
    with prof.step("calibration"), threadpool_limits(1 if grams else None, user_api="blas"):
        n = collect(model, samples.head(statistics_size(q.smooth_samples, plan.total_macs)), fed, batch_size=cal.batch_size,
                    budget_bytes=cal.memory_budget_mb << 20, description="activation statistics", on_run=prof.ran)
    ok = {t for t, o in obs.items() if n >= MIN_STAT_SAMPLES and o[1].seen >= MIN_STAT_SAMPLES and o[0].amax is not None}
    few = {t for t in ok if obs[t][1].seen < MIN_STAT_ROWS}
    return _Stats({t: obs[t][0].amax for t in ok}, {t: obs[t][1].rows for t in ok}, sorted(set(obs) - ok), few,
                  {t: g for t, g in grams.items() if t in ok and g.rows})


def _site_tensor(plan: QuantPlan, site: SmoothSite) -> str:
    """A pass-1 tensor of the site (its Linears' input; through reshapes the rows are the same)."""
    first = site.linears[0][0]
    return next(n.acts[0].tensor for n in plan.nodes if n.node == first)


def _smooth(model: ir.Model, target: Target, plan: QuantPlan, stats: _Stats, recipe: Recipe,
            res: CalibrationResult) -> dict[str, np.ndarray]:
    """Choose each site's factors (searched α, or the recipe's), fold them in; returns linear node → s."""
    q = recipe.quantization
    sites, res.smooth_skipped = find_sites(model, plan, insert=q.smooth_insert, max_insert_rank=target.max_insert_rank,
                                           attention_insert=target.insert_after_attention)
    arith, factors, alphas, per_node = arith_of(target), {}, {}, {}
    for site in sites:
        t = _site_tensor(plan, site)
        if t not in stats.absmax:
            continue
        if q.smooth_alpha is None and t in stats.rows:
            cands = THIN_ALPHAS if t in stats.few_rows else ALPHAS
            alpha, s, _ = search_alpha(stats.rows[t], site_weights(model, site), stats.absmax[t], arith, cands)
        else:
            alpha = q.smooth_alpha if q.smooth_alpha is not None else 0.5
            s = compute_factors(model, site, stats.absmax[t], alpha)
        alphas[site.tensor] = alpha
        if alpha is not None:
            factors[site.tensor] = s
            per_node.update({lin: s for lin, _, _ in site.linears})
    for site, t in _depthwise_sites(model, plan, target):
        amax = stats.absmax.get(t)
        if amax is None or amax.size != site.channels or amax.max() <= 0:
            continue
        s = np.clip(np.where(amax > 0, (amax / amax.max()) ** DEPTHWISE_ALPHA, 1.0), 1e-3, 1.0).astype(np.float32)
        sites.append(site)
        factors[site.tensor], alphas[site.tensor] = s.reshape(-1, 1, 1), DEPTHWISE_ALPHA
        per_node[site.linears[0][0]] = s
    res.smoothed = SmoothPass([s for s in sites if s.tensor in factors], factors)(model).report.changed
    if stats.thin:
        res.smooth_skipped.update({t: f"too few calibration images or rows to trust per-channel maxima "
                                      f"(< {MIN_STAT_SAMPLES} images or rows)" for t in stats.thin})
    res.table.equalization = {k: [float(x) for x in np.ravel(v)] for k, v in factors.items()}
    res.table.choices["alpha"] = alphas
    return per_node


def _is_probability(values: dict[str, ir.Value], tensor: str) -> bool:
    """Whether ``tensor`` is attention's Softmax output (the left input of attn·V)."""
    return any(u.idx == 0 and u.node.op_type == "MatMul" and attention_role(u.node) == "pv"
               for u in values[tensor].uses())


def _candidates(ob: HistogramObserver, percentile: float) -> dict[str, dict[str, float]]:
    out = {}
    for name, method, p in [("minmax", CalibrationMethod.minmax, 100.0), ("mse", CalibrationMethod.mse, 100.0),
                            *[(f"percentile{q}", CalibrationMethod.percentile, q) for q in sorted({*_AUTO_PERCENTILES, percentile})]]:
        r = ob.compute(method, p)
        out[name] = {"amax": r.amax, "lo": r.lo, "hi": r.hi, "min": r.min, "max": r.max}
    return out


def _row_inputs(model: ir.Model, plan: QuantPlan, sampled: dict[str, np.ndarray], factors: dict[str, np.ndarray],
                pre_plan: QuantPlan, arith: QuantArith
                ) -> dict[str, tuple[np.ndarray, list[tuple[str, np.ndarray, str, int | None, np.ndarray | None]]]]:
    """Activation tensor (after smoothing) → (its ``sampled`` rows, [(Linear node, (C, C_out) weight,
    weight initializer, its input-channel axis (None: a conv's), the fake-quantized weight where it is
    not the matrix's own rounding (a k×k or grouped conv's summed taps, :func:`_conv_matrix`))])."""
    pre = {n.node: n.acts[0].tensor for n in _linears(pre_plan)}
    out: dict[str, tuple[np.ndarray, list]] = {}
    inits = model.graph.initializers
    nodes = {n.name: n for n in model.graph}
    pre.update({n.node: n.acts[0].tensor for n in _convs(model, pre_plan)})
    for spec in [*_linears(plan), *_convs(model, plan)]:
        rows = sampled.get(pre.get(spec.node, ""))
        if rows is None:
            continue
        s = factors.get(spec.node)
        node = nodes[spec.node]
        w, wq = inits[spec.weight.initializer].const_value.numpy(), None
        if node.op_type == "Conv" and _is_pointwise(node, w):  # (C_out, C_in, 1, 1); no GPTQ layout for it
            in_axis, w = None, np.ascontiguousarray(w[:, :, 0, 0].T.astype(np.float32))
        elif node.op_type == "Conv":
            in_axis, (w, wq) = None, _conv_matrix(node, w, arith)
        else:
            in_axis = (1 if attr(node, "transB", 0) else 0) if node.op_type == "Gemm" else len(w.shape) - 2
            w = weight_in_out(w, in_axis)
        entry = out.setdefault(spec.acts[0].tensor, (rows / s if s is not None else rows, []))
        entry[1].append((spec.node, w, spec.weight.initializer, in_axis, wq))
    return out


class _FirstRows:
    """Keeps the first ``n`` rows an observed tensor takes (the model's output on the first samples)."""

    def __init__(self, n: int):
        self.n, self.parts, self.seen = n, [], 0

    def update(self, x: np.ndarray) -> None:
        if self.seen < self.n:
            self.parts.append(np.array(x[: self.n - self.seen], np.float32))
            self.seen += len(self.parts[-1])

    def rows(self) -> np.ndarray | None:
        return np.concatenate(self.parts) if self.seen >= self.n and self.parts else None


def _primary_output(model: ir.Model) -> str:
    """The output the judge steers by (:func:`~.judge.primary_index`: ``logits`` among several, else the first)."""
    names = [v.name for v in model.graph.outputs]
    return "logits" if "logits" in names else names[0]


def _ranges(model: ir.Model, target: Target, plan: QuantPlan, samples: SampleSet, recipe: Recipe,
            rows: dict, res: CalibrationResult, prof: QuantProfile, keep_outputs: int = 0) -> None:
    cal = recipe.calibration
    tensors = plan.tensors()
    method = cal.method
    observers: dict[str, list] = {
        t: [make_observer(CalibrationMethod.percentile if method is CalibrationMethod.auto else method, cal.num_bins)]
        for t in tensors}
    head = _FirstRows(min(keep_outputs, len(samples))) if keep_outputs > 0 else None
    if head is not None:  # the judge's float reference on its screen comes with this pass, not a pass of its own
        observers.setdefault(_primary_output(model), []).append(head)
    log.debug("calibrating %d tensor(s) with %s", len(tensors), method.value)
    with prof.step("calibration"):
        res.table.num_samples = collect(model, samples, observers, batch_size=cal.batch_size, on_run=prof.ran,
                                        budget_bytes=cal.memory_budget_mb << 20, description=f"calibrating ({method.value})")
    res.outputs = head.rows() if head is not None else None
    with prof.step("range_search"):
        _choose_ranges(model, target, tensors, observers, recipe, rows, res)


def _choose_ranges(model: ir.Model, target: Target, tensors: list[str], observers: dict, recipe: Recipe,
                   rows: dict, res: CalibrationResult) -> None:
    """Each tensor's range from its histogram (``auto``: the candidate with the least Linear output error)."""
    cal, method = recipe.calibration, recipe.calibration.method
    values = ir.convenience.create_value_mapping(model.graph)
    arith, chosen = arith_of(target), {}
    for t in tensors:
        ob = observers[t][0]
        if _is_probability(values, t):
            # attention probabilities: a clipping method squeezes the few large probabilities that
            # matter; their exact range ([0, max] with max ≤ 1) costs nothing
            name, rng = "minmax", ob.compute(CalibrationMethod.minmax, 100.0).__dict__
        elif method is CalibrationMethod.auto and isinstance(ob, HistogramObserver) and ob.counts is not None:
            cands = _candidates(ob, cal.percentile)
            if t in rows and all(lin[4] is None for lin in rows[t][1]):
                name, _ = search_range(rows[t][0], [lin[1] for lin in rows[t][1]], cands, arith)
            else:  # no Linear reads it (attention inputs, a k×k conv's input): the tensor's own MSE decides
                name = "mse"
            rng = cands[name]
        else:
            name, rng = method.value, ob.compute(method, cal.percentile).__dict__
        chosen[t] = name
        res.table.tensors[t] = {"amax": rng["amax"], "scale": max(rng["amax"], 1e-30) / INT8_MAX, "lo": rng["lo"],
                                "hi": rng["hi"], "min": rng["min"], "max": rng["max"]}
    res.table.choices["range"] = chosen


def _bias(target: Target, rows: dict, res: CalibrationResult, correct: bool, fit: dict, damp: float) -> None:
    """Weight rounding (GPTQ, :func:`_gptq`, for the Linears reading a tensor in ``fit``), bias corrections (when
    ``correct``), and where the Linears' INT8 error comes from (for the report)."""
    arith, split = arith_of(target), {"weights": 0.0, "activations": 0.0, "both": 0.0}
    n = 0
    for t, (x, linears) in rows.items():
        rng = res.table.tensors.get(t)
        if rng is None:
            continue
        for node, w, init, in_axis, wq in linears:
            summed = wq is not None  # a k×k or grouped conv's taps, each rounded before the sum
            if not summed and in_axis is not None and t in fit and init not in res.rounded:
                wq = _gptq(fit[t], w, init, in_axis, arith, res, damp)
            elif not summed and in_axis is not None and init in res.rounded:
                q, scale = res.rounded[init]
                wq = (q if in_axis == 0 else q.T).astype(np.float32) * scale.reshape(1, -1)
            if summed:  # its summed taps say nothing of its output error per pixel: only its mean goes to the bias
                if correct:
                    res.table.bias[node] = [float(v) for v in bias_shift(x, w, rng, arith, wq=wq)]
                continue
            shift, parts = correction_and_split(x, w, rng, arith, correct, wq=wq)
            if shift is not None:
                res.table.bias[node] = [float(v) for v in shift]
            for k, v in parts.items():
                split[k] += v
            n += 1
    if n:
        res.table.choices["error"] = {"linears": n, **{k: v / n for k, v in split.items()}}


def _fit_grams(plan: QuantPlan, grams: dict[str, GramObserver], factors: dict[str, np.ndarray],
               pre_plan: QuantPlan) -> dict[str, tuple[GramObserver, np.ndarray | None]]:
    """Activation tensor (after smoothing) → the statistics pass's ``XᵀX`` of it and the smoothing factors
    ``s`` its Linears' input is divided by (GPTQ's Hessian is ``XᵀX / N / s sᵀ``; None: not smoothed)."""
    pre = {n.node: n.acts[0].tensor for n in _linears(pre_plan)}
    out: dict[str, tuple[GramObserver, np.ndarray | None]] = {}
    for spec in _linears(plan):
        g = grams.get(pre.get(spec.node, ""))
        if g is not None:
            s = factors.get(spec.node)
            out.setdefault(spec.acts[0].tensor, (g, None if s is None else np.ravel(s).astype(np.float64)))
    return out


def _gptq(fit: tuple[GramObserver, np.ndarray | None], w: np.ndarray, init: str, in_axis: int, arith,
          res: CalibrationResult, damp: float) -> np.ndarray:
    """GPTQ integer weights of one Linear (its input's ``XᵀX`` and smoothing factors, :func:`_fit_grams`), kept in
    ``res.rounded`` in the initializer's layout; returns the fake-quantized (C_in, C_out) weight."""
    gram, s = fit
    h = gram.hessian()
    if s is not None:
        h /= np.outer(s, s)
    amax = np.abs(w).max(axis=0) if arith.per_channel else np.full(w.shape[1], np.abs(w).max())
    scale = np.maximum(amax / arith.qmax, 1e-8).astype(np.float32)
    q = gptq_round(h, w, scale, arith.qmax, damp)
    res.rounded[init] = (q if in_axis == 0 else np.ascontiguousarray(q.T), scale if arith.per_channel else scale[:1].reshape(()))
    return q.astype(np.float32) * scale.reshape(1, -1)


def calibrate(model: ir.Model, target: Target, plan: QuantPlan, samples: SampleSet, recipe: Recipe,
              profile: QuantProfile | None = None, keep_outputs: int = 0) -> CalibrationResult:
    """Smooth ``model`` in place (when the recipe says so) and calibrate the plan's activations.

    Args:
        profile: where the steps' seconds and ONNX Runtime runs are counted.
        keep_outputs: keep the smoothed model's primary output on this many first samples of the
            ranges pass (``result.outputs``; 0: none).
    Returns:
        The result; ``result.plan`` is the plan of the smoothed model (weights may be renamed).
    """
    prof = profile if profile is not None else QuantProfile()
    cal, q = recipe.calibration, recipe.quantization
    table = ScaleTable(method=cal.method.value, num_samples=0, model_hash="", data_hash=samples.fingerprint(), settings={})
    res = CalibrationResult(table, plan)
    needs_stats = q.smooth or q.bias_correction or cal.method is CalibrationMethod.auto
    has_rows = _linears(plan) or _convs(model, plan)
    rounding, _ = weight_rounding(model, plan, recipe, len(samples))
    fit_rows = gptq_fit_rows(model, plan, recipe, len(samples)) if rounding == "gptq" else {}
    stats = _statistics(model, plan, samples, recipe, prof, fit_rows) if needs_stats and has_rows else _Stats({}, {})
    factors: dict[str, np.ndarray] = {}
    if q.smooth:
        with prof.step("smoothing_search"):
            factors = _smooth(model, target, plan, stats, recipe, res)
            res.plan = target.annotate(model)
    rows = _row_inputs(model, res.plan, stats.rows, factors, plan, arith_of(target))
    fit = _fit_grams(res.plan, stats.fit, factors, plan)
    _ranges(model, target, res.plan, samples, recipe, rows, res, prof, keep_outputs)
    with prof.step("range_search"):
        _bias(target, rows, res, q.bias_correction, fit, q.gptq_damp)
    _keep_zero_ranges_float(res, target)
    return res


def _keep_zero_ranges_float(res: CalibrationResult, target: Target) -> None:
    """Nodes reading a tensor whose range has no INT8 scale stay float, and the report says why:

    - 0 on every calibration sample (a ReLU that never fires, a zero-initialised branch): a zero
      range has no scale (TensorRT wants a finite positive one), and any scale would clip whatever
      the tensor holds on other data to nothing;
    - a range whose scale would be below the least one written (float16's smallest value, 6e-8,
      where scales are float16; else :data:`~.convert.MIN_SCALE`): the scale would round to 0, or the
      floor would quantize the whole tensor to 0.
    """
    fp16 = target.high_precision() == "fp16"
    least = FP16_MIN_SCALE if fp16 else MIN_SCALE
    tiny = {t: amax for t, r in res.table.tensors.items()
            if (amax := max(abs(float(r.get(k, 0.0))) for k in ("amax", "lo", "hi"))) < INT8_MAX * least}
    for n in res.plan.nodes:
        tensor = next((a.tensor for a in n.acts if a.tensor in tiny), None)
        if tensor is None:
            continue
        why = ("was 0 on every calibration sample (a zero range has no INT8 scale)" if tiny[tensor] == 0.0 else
               f"peaks at {tiny[tensor]:.3g} on the calibration data: its scale would be below the least one "
               f"written ({least:.3g}{' in float16' if fp16 else ''})")
        res.plan = res.plan.without({n.node}, f"kept in float: its input '{tensor}' {why}")


def reuse_table(path: Path, model: ir.Model, target: Target, plan: QuantPlan, key: dict[str, Any],
                notes: list[str], insert: bool = True) -> CalibrationResult | None:
    """The table at ``path`` applied to ``model`` when it matches ``key`` (model hash, data hash,
    method, settings); None otherwise (the caller calibrates). A matching table was made from this
    very file with these settings, so its smoothing sites and tensors are this model's.

    Raises:
        RuntimeError: a matching table that does not fit the model (a bug, not stale data).
    """
    if not path.is_file():
        return None
    try:
        table = ScaleTable.load(path)
    except BadInput as exc:
        notes.append(f"ignored an unreadable scale table: {exc}")
        return None
    if not table.matches(**key):
        return None
    res = CalibrationResult(table, plan, reused=True)
    if table.equalization:
        sites, res.smooth_skipped = find_sites(model, plan, insert=insert, max_insert_rank=target.max_insert_rank,
                                               attention_insert=target.insert_after_attention)
        factors = {k: np.asarray(v, np.float32) for k, v in table.equalization.items()}
        for site, _ in _depthwise_sites(model, plan, target):
            if site.tensor in factors:
                sites.append(site)
                factors[site.tensor] = factors[site.tensor].reshape(-1, 1, 1)
        if set(factors) - {s.tensor for s in sites}:
            raise RuntimeError(f"{path}: smoothing sites {sorted(set(factors) - {s.tensor for s in sites})[:3]} not in the model")
        res.smoothed = SmoothPass([s for s in sites if s.tensor in factors], factors)(model).report.changed
        res.plan = target.annotate(model)
    missing = set(res.plan.tensors()) - set(table.tensors)
    if missing:
        raise RuntimeError(f"{path}: no range for {sorted(missing)[:3]}")
    _keep_zero_ranges_float(res, target)
    return res


def observe_absmax(model: ir.Model, samples: SampleSet, recipe: Recipe,
                   on_run: Callable[[int], None] | None = None) -> dict[str, float]:
    """Largest |value| of every float tensor the graph computes (and of its float inputs) on
    ``samples``: the evidence that decides which parts of an FP16 model stay FP32."""
    cal = recipe.calibration
    names = [v.name for v in model.graph.inputs if not v.is_initializer() and v.dtype == ir.DataType.FLOAT]
    names += [o.name for n in model.graph for o in n.outputs if o.dtype == ir.DataType.FLOAT and n.op_type != "Constant"]
    names = list(dict.fromkeys(names))
    log.debug("float16 evidence: ranges of %d tensor(s) on %d sample(s)", len(names), len(samples))
    return collect_absmax(model, samples, names, batch_size=cal.batch_size, budget_bytes=cal.memory_budget_mb << 20,
                          description="float16 ranges", on_run=on_run)
