"""``quantize_int8``: annotate (target) → calibrate (smoothing + ranges, or a cached table) →
convert (Q/DQ) → per-model choices measured on held-out calibration data in the target's arithmetic
(attn·V INT8 or float; one node float where it alone makes most of the error) → fallback (the fewest
float layers that meet the budget) → validate → write the artifacts atomically.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as ir_common
from pydantic import BaseModel, ConfigDict, Field

from ..calibration.data import SampleSet
from ..calibration.feeds import FeedSet, split_samples
from ..check.contract import float16_violations
from ..runners.timing import latency_ratio
from ..errors import BadInput, ContractViolation
from ..graph.files import load_model, save_model
from ..io import sha256_file
from ..memory import bounded_heap
from ..recipe import Recipe
from .annotate import attention_role
from .calibrate import (CalibrationResult, calibrate, observe_absmax, reuse_table, statistics_size, table_settings,
                        weight_rounding)
from .convert import INT8_MAX, QdqStats, WeightCache, convert
from .rounding import GPTQ_ROWS_PER_INPUT
from .fallback import FallbackResult, output_ranked, rank_output_error, rank_sensitivity, search_fallback
from .judge import Judge, Verdict
from .precision import Float16Islands, precision_summary, to_opset
from .profile import QuantProfile
from .spec import NodeKind, QuantPlan
from .tail import GateInfo

if TYPE_CHECKING:  # the target is handed in: quantize/ never imports a target, it reads the protocol
    from .target import QuantizeTarget as Target

__all__ = ["QuantReport", "quantize_int8", "prepare_model", "attention_summary", "screen_size"]

log = logging.getLogger("vitexport.quantize")

#: the screen's compute cap: as many calibration samples as 64 samples of a 4-GMAC model (a ViT-S at 160 px),
#: at least 16. ViT-B/16 at 224 (17.5 GMAC, ~1.3 s per sample for its float and Q/DQ runs on 2 cores) gets 16:
#: 64 would add ~80 s to a quantize stage that must stay within NNCF's time
_SCREEN_MACS = 64 * 4e9


def screen_size(requested: int, macs_per_sample: int) -> int:
    """How many calibration samples the fallback screens (``fallback.screen_samples``, capped by compute)."""
    if requested <= 0 or macs_per_sample <= 0:
        return max(requested, 0)
    return min(requested, max(16, int(_SCREEN_MACS // macs_per_sample)))


#: above this many float parameters (ViT-S has 22 M, ViT-B 86 M) quantize_int8 does not time the
#: models itself: two extra ONNX Runtime sessions of a ViT-B cost ~0.7 GB and half a minute
_MAX_TIMED_PARAMS = 40_000_000


class QuantReport(BaseModel):
    """What ``quantize_int8`` did; ``to_dict()`` is what the pipeline writes into its manifest.

    ``parity_before_fallback`` / ``parity`` are the fallback's verdicts (:class:`~.judge.Verdict`)
    before and after it acted: the gate's comparison on the *selection* data (held-out calibration
    samples) and the predicted gate figures over the gate's sample count. The stage's gate then
    measures the written file on the parity data.
    """

    model_config = ConfigDict(extra="forbid")

    target: str
    method: str
    num_samples: int = 0
    reused_table: bool = False
    quantized_nodes: int = 0
    qdq_pairs: int = 0
    weights_quantized: int = 0
    smoothed: int = 0
    smooth_skipped: dict[str, str] = Field(default_factory=dict)
    skipped_nodes: dict[str, str] = Field(default_factory=dict)
    selection: str | None = None
    float_fallback: list[dict[str, Any]] = Field(default_factory=list)
    float_macs_share: float = 0.0
    parity_before_fallback: dict[str, Any] | None = None
    parity: dict[str, Any] | None = None
    budget_met: bool | None = None
    precision: dict[str, Any] = Field(default_factory=dict)
    attention: dict[str, Any] = Field(default_factory=dict)
    latency: dict[str, float] | None = None
    latency_ratio: float | None = None
    #: seconds and full-model ONNX Runtime runs per step (:class:`~.profile.QuantProfile`)
    profile: dict[str, Any] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    artifacts: dict[str, str] = Field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _float16_tensors(model: ir.Model) -> list[str]:
    """'initializer X is float16', one per float16 tensor, Cast or constant of the graph."""
    return [f"{v.subject} {v.problem.split(',')[0]}" for v in float16_violations(model, "float16")]


def prepare_model(path: Path, target: Target) -> ir.Model:
    """Load a float model for quantization: static shapes inferred, every node named.

    Raises:
        BadInput: unreadable file; ContractViolation: float16 on a target that forbids it.
    """
    model = load_model(path)
    ir_common.NameFixPass()(model)
    ir_common.ShapeInferencePass(strict_mode=False)(model)
    if target.forbid_float16:
        f16 = _float16_tensors(model)
        if f16:
            raise ContractViolation(f"{path}: the {target.name} target allows no float16 ({'; '.join(f16[:3])})")
    return model


def _scales(model: ir.Model, fp32_path: Path, target: Target, plan: QuantPlan, calib: SampleSet,
            recipe: Recipe, work_dir: Path, holdout: int, report: QuantReport, prof: QuantProfile,
            keep_outputs: int = 0) -> CalibrationResult:
    """A cached table that fits, else a fresh calibration (saved as ``calibration.json``), which also
    keeps the float model's output on the first ``keep_outputs`` samples (the judge's screen)."""
    cal = recipe.calibration
    key = {"model_hash": sha256_file(fp32_path), "data_hash": calib.fingerprint(), "method": cal.method.value,
           "settings": table_settings(recipe, target, holdout)}
    path = work_dir / "calibration.json"
    # a GPTQ table's integer weights are not in calibration.json: such a table is made afresh
    rounding, why = weight_rounding(model, plan, recipe, len(calib))
    reusable = cal.reuse and rounding == "nearest"
    res = reuse_table(path, model, target, plan, key, report.notes, recipe.quantization.smooth_insert) if reusable else None
    if res is None:
        res = calibrate(model, target, plan, calib, recipe, prof, keep_outputs)
        if (n_stat := statistics_size(recipe.quantization.smooth_samples, plan.total_macs)) < recipe.quantization.smooth_samples:
            report.notes.append(f"statistics (smoothing factors, search rows) from the first {n_stat} calibration samples, "
                                f"not quantization.smooth_samples' {recipe.quantization.smooth_samples}: the model costs "
                                f"{plan.total_macs / 1e9:.3g} G multiply-accumulates a sample (compute cap)")
        if target.high_precision() == "fp16" and res.plan.nodes:
            with prof.step("calibration"):
                res.table.float_ranges = observe_absmax(model, calib.head(recipe.quantization.fp16_samples), recipe,
                                                        on_run=prof.ran)
        res.table.model_hash, res.table.data_hash, res.table.settings = key["model_hash"], key["data_hash"], key["settings"]
        res.table.save(path)
    if rounding == "gptq":
        linears = sum(1 for n in plan.nodes if n.kind is NodeKind.linear and n.weight is not None)
        why += f"; {len(res.rounded)} Linear(s) rounded with GPTQ" + (
            "" if recipe.quantization.weight_rounding == "gptq" or len(res.rounded) >= linears else
            f", the other {linears - len(res.rounded)} to nearest (fewer than {GPTQ_ROWS_PER_INPUT:g} calibration rows "
            f"per input channel)")
    report.notes.append(why)
    report.reused_table, report.num_samples = res.reused, res.table.num_samples
    report.smoothed, report.smooth_skipped = res.smoothed, dict(res.smooth_skipped)
    report.skipped_nodes = dict(res.plan.skipped)
    return res


#: the latest built Q/DQ models a :class:`_Builder` keeps, besides the one it is told to keep: clones share
#: the float and quantized tensors, but an fp16 target's float Linears are float16 copies each (ViT-B's fc1:
#: 4.7 MB), so an uncapped fallback's many candidates are not all kept
_BUILT = 2


class _Builder:
    """The Q/DQ model of a plan, exactly as it is written: conversion, then (for an fp16 target) the
    float parts in float16. The fallback's candidates and the artifact come from the same call; the
    last :data:`_BUILT` models and the one :meth:`keep` names (the last that passed) are kept by their
    quantized nodes, so the chosen one is not converted twice."""

    def __init__(self, model: ir.Model, ranges, cache: WeightCache, float_ranges: dict[str, float] | None,
                 profile: QuantProfile | None = None):
        self.model, self.ranges, self.cache, self.float_ranges = model, ranges, cache, float_ranges
        self.profile = profile if profile is not None else QuantProfile()
        self.islands: dict[str, str] = {}
        self.notes: list[str] = []  # what the last build did to dead channels and tiny scales
        self.built: dict[tuple[str, ...], tuple[ir.Model, dict[str, str], list[str]]] = {}
        self.kept: tuple[tuple[str, ...], tuple[ir.Model, dict[str, str], list[str]]] | None = None

    def __call__(self, plan: QuantPlan) -> ir.Model:
        key = tuple(n.node for n in plan.nodes)
        if self.kept is not None and self.kept[0] == key:
            self.built[key] = self.kept[1]
        if key not in self.built:
            with self.profile.step("conversion"):
                qdq = self._build(plan)
            self.built[key] = (qdq, self.islands, self.notes)
            while len(self.built) > _BUILT:
                self.built.pop(next(iter(self.built)))
        qdq, self.islands, self.notes = self.built[key]
        return qdq

    def probe(self, plan: QuantPlan) -> ir.Model:
        """The Q/DQ model of ``plan`` with float32 float parts, built aside (neither kept nor reported): a probe of
        what the plan's INT8 costs (float16 float parts would cost every probe alike, and a plan of one node leaves
        graphs float16 islands were never made for)."""
        with self.profile.step("conversion"):
            return convert(self.model, plan, self.ranges, self.cache)[0]

    def keep(self, plan: QuantPlan) -> None:
        """Keep the model of ``plan`` (built last) until another is kept."""
        key = tuple(n.node for n in plan.nodes)
        self.kept = (key, self.built[key]) if key in self.built else None

    def _build(self, plan: QuantPlan) -> ir.Model:
        qdq, stats = convert(self.model, plan, self.ranges, self.cache)
        self.notes = [f"{stats.dead_channels} weight channel(s) are all zero (dead): quantized exactly with the "
                      "least scale"] if stats.dead_channels else []
        if self.float_ranges is not None:
            islands = Float16Islands(self.float_ranges)
            self.islands = islands(qdq).report.skipped
            self.notes += [f"{islands.raised} scale(s) below float16's smallest value raised to it"] if islands.raised else []
        return qdq


def _fallback_enabled(recipe: Recipe) -> bool:
    """A fallback that may keep layers in float (``max_float_layers`` None: no cap)."""
    fb = recipe.quantization.fallback
    return fb.enabled and (fb.max_float_layers is None or fb.max_float_layers > 0)


def _share_room(qdq: ir.Model, target: Target, recipe: Recipe) -> int | None:
    """GEMM/Conv multiply-accumulates the fallback may take out of INT8 before the written file's share falls
    below the target's INT8-share gate (its Q/DQ coverage bounds what a backend runs in INT8); None: no gate."""
    stage = target.int8_share_stage
    share_min = recipe.tolerance(stage).int8_share_min if stage is not None else None
    if not share_min:
        return None
    p = precision_summary(qdq)
    return max(0, int(p["int8_gemm_macs"] - share_min * (p["int8_gemm_macs"] + p["float_gemm_macs"])))


def _fallback(model: ir.Model, qdq: ir.Model, plan: QuantPlan, ranges, calib: SampleSet, select: SampleSet,
              target: Target, recipe: Recipe, build: _Builder, report: QuantReport,
              gate: GateInfo, screen_ref: np.ndarray | None = None) -> tuple[ir.Model, QuantPlan]:
    """Judge the INT8 model by the gate's predicted figures; keep layers in float until they pass.
    ``screen_ref``: the float model's output on the screen samples, when calibration kept it."""
    tol, fb, bs = recipe.tolerance("quantize_int8"), recipe.quantization.fallback, recipe.calibration.batch_size
    prof = build.profile
    n_screen = screen_size(fb.screen_samples, plan.total_macs)
    screen = calib.head(n_screen) if n_screen > 0 else None
    judge = Judge(model, FeedSet.for_model(select, model, bs), None if screen is None else FeedSet.for_model(screen, model, bs),
                  tol, gate, target.gate_config, profile=prof, screen_ref=screen_ref)
    with prof.step("parity"):
        first = judge(qdq)
    report.selection = judge.description
    report.parity_before_fallback = first.to_dict()
    ranking = None
    with prof.step("fallback_probes"):
        if _fallback_enabled(recipe):  # ranked first: a node's rank does not depend on the others, and it tells
            sens = FeedSet.for_model(calib.head(fb.sensitivity_samples), model, bs)  # whether attn·V can pay
            ranking = rank_sensitivity(model, plan, ranges, sens, target.gate_config, build.cache, on_run=prof.ran)
        if fb.enabled:
            qdq, plan, first = _probe_pv(model, qdq, plan, first, judge, build, report, ranking,
                                         _share_room(qdq, target, recipe))
        if ranking is not None:
            ranking = [(n, e) for n, e in ranking if plan.node(n) is not None]
            qdq, plan, first = _probe_dominant(qdq, plan, first, judge, build, report, ranking,
                                               _share_room(qdq, target, recipe))
            ranking = [(n, e) for n, e in ranking if plan.node(n) is not None]
        result = first
        if not first and ranking is not None:
            order = ranking
            if output_ranked(fb.ranking, plan, model, len(sens)):
                order = rank_output_error(model, plan, build.probe, sens, target.gate_config, on_run=prof.ran)
                report.notes.append(_output_rank_note(ranking, order))
            fbr = search_fallback(plan, lambda p: _judged(p, judge, build), order, fb.max_float_layers, first,
                                  cheap=_sensitive_pv(model, plan, ranking), max_float_macs=_share_room(qdq, target, recipe),
                                  pass_over=target.int8_share_stage == "quantize_int8")
            if fbr.float_nodes:
                plan = plan.without(set(fbr.float_nodes))
                qdq = build(plan)  # built while searching: the builder hands that model back
            result = fbr.after
            report.float_fallback += fbr.per_node
            report.float_macs_share += fbr.macs_float_share
            report.notes.append(_fallback_note(fbr, report.selection, tol))
    if not first and ranking is None:
        report.notes.append("INT8 is predicted to miss the parity budget and the fallback is disabled")
    report.parity, report.budget_met = result.to_dict(), bool(result)
    return qdq, plan


#: attn·V goes float for a whole model when that divides its predicted worst-case error (1 − cos) by at least
#: this much (INT8 attn·V is a sixth or more of the error). Measured (INT8 → float predicted error ratio): random
#: generated ViTs 1.00–1.09 (keep INT8); trained models 1.23–7.8 (a digits ViT with 65 tokens and diffuse heads
#: 7.8: worst cosine 0.9949 with INT8 attn·V where NNCF, which never quantizes it, kept 0.9977; the demo 1.24:
#: 0.99385 INT8, 0.99591 float, NNCF 0.99439); a Swin with 16-token windows 0.85 (keep INT8)
PV_GAIN = 1.2
#: attn·V is probed only when its nodes make at least this share of the summed per-node INT8 errors
#: (:func:`~.fallback.rank_sensitivity`) or INT8 is predicted to miss: float attn·V divides the error by
#: :data:`PV_GAIN` only where it makes a sixth of it, and a node's own error is no exact share of the model's, so
#: the bar is a quarter of a sixth. A probe costs a verdict: ViT-B/16's Q/DQ run on 48 samples, ~17 % of its
#: quantize stage. Measured share (the probe's gain): the demo 0.43 (probed: float would raise its error ×1.21), ViT-B/16 with planted
#: outliers 0.0037 (0.94: float would raise the error ×1.06; its probe was 143 of 864 s, now skipped, same file)
PV_PROBE_SHARE = 0.04


def _pv_share(pv: list[str], ranking: list[tuple[str, float]] | None) -> float | None:
    """attn·V nodes' share of the summed per-node INT8 errors (None: not ranked)."""
    if not ranking:
        return None
    total = sum(e for _, e in ranking)
    return sum(e for n, e in ranking if n in set(pv)) / total if total > 0 else None


def _over_room(nodes: list[str], plan: QuantPlan, room: int | None) -> str | None:
    """Why ``nodes`` cannot go float (None: they fit): together they take more multiply-accumulates out of
    INT8 than the target's INT8-share gate leaves (``room``, :func:`_share_room`)."""
    macs = sum(n.macs for n in plan.nodes if n.node in set(nodes))
    if room is None or macs <= room:
        return None
    total = plan.total_macs or 1
    return (f"in float it would take {macs / total:.1%} of the quantized MACs out of INT8, more than the "
            f"target's INT8-share gate leaves ({room / total:.1%})")


def _probe_pv(model: ir.Model, qdq: ir.Model, plan: QuantPlan, first: Verdict, judge: Judge, build: _Builder,
              report: QuantReport, ranking: list[tuple[str, float]] | None = None,
              room: int | None = None) -> tuple[ir.Model, QuantPlan, Verdict]:
    """attn·V in INT8 or float, decided for this model by one more verdict (the cheapest candidate: a few
    per cent of the MACs, at the price of fused INT8 attention on a runtime that has it: the target's attention
    line in the report says, :meth:`~vitexport.targets.Target.attention_note`). A passing model whose
    attn·V nodes make too small a share of the summed node errors (``ranking``) to pay is left INT8 unprobed;
    so is one whose attn·V in float would not fit the target's INT8-share ``room`` (rk3588's 95 %: a trained
    YOLOS's four attn·V, 11 % of its MACs, made the share gate fail after the compile)."""
    pv = _pv_nodes(model, plan)
    if not pv:
        return qdq, plan, first
    over = _over_room(pv, plan, room)
    if over:
        report.notes.append(f"attn·V: kept INT8 without a probe: {over}")
        return qdq, plan, first
    share = _pv_share(pv, ranking)
    log.debug("attn·V share of the summed node errors: %s", "?" if share is None else f"{share:.4f}")
    if first and share is not None and share < PV_PROBE_SHARE:
        report.notes.append(f"attn·V: kept INT8 without a probe: its nodes make {share:.1%} of the summed INT8 errors "
                            f"of the quantized nodes (< {PV_PROBE_SHARE:.0%}: in float they could not divide the "
                            f"predicted error by {PV_GAIN}), and INT8 is predicted to pass")
        return qdq, plan, first
    trial_plan = plan.without(set(pv))
    trial_qdq = build(trial_plan)
    trial = judge(trial_qdq)
    e_int8, e_float = 1.0 - first.prediction.cosine_min, 1.0 - trial.prediction.cosine_min
    pays, rescues = e_float * PV_GAIN <= e_int8, bool(trial) and not first
    keep_float = pays or rescues
    report.notes.append(_pv_note(first, trial, pays, rescues, judge))
    if keep_float:
        return trial_qdq, trial_plan, trial
    return qdq, plan, first


def _pv_note(first: Verdict, trial: Verdict, pays: bool, rescues: bool, judge: Judge) -> str:
    """The attn·V choice and the rule that made it. Both verdicts predict the gate's figures on the
    data the gate scores (its sample count; with labels, lost samples too): other parity data can
    choose otherwise, which the line says."""
    g = judge.gate
    data = (f"predicted for the gate's {g.samples} parity sample(s)"
            + (", labelled: lost samples (accuracy_drop) predicted too" if g.labelled else ", unlabelled"))
    figures = (f"predicted worst cosine {first.prediction.cosine_min:.5f} with it INT8, "
               f"{trial.prediction.cosine_min:.5f} in float")
    gain = (1.0 - first.prediction.cosine_min) / max(1.0 - trial.prediction.cosine_min, 1e-12)
    if pays or rescues:
        why = "; ".join(
            ([f"float divides the predicted error 1 − cos by {gain:.2f} (≥ {PV_GAIN}: worth the MACs)"] if pays else [])
            + ([f"with it INT8 the prediction misses {', '.join(sorted(first.failing()))}, in float it meets every check"]
               if rescues else []))
    elif gain >= 1.0:
        why = f"float would divide the predicted error 1 − cos by only {gain:.2f} (< {PV_GAIN})"
    else:
        why = f"float would raise the predicted error 1 − cos (×{1 / max(gain, 1e-12):.2f})"
    kept = "in float" if rescues or pays else "INT8"
    return (f"attn·V: kept {kept}: {figures}; {why}; {data}, "
            "so other parity data can choose otherwise")


#: one node goes float for a whole model when that alone divides its predicted worst-case error (1 − cos) by at
#: least this much, and costs at most :data:`DOMINANT_MACS` of the quantized MACs: an error one node makes,
#: whatever the budget. Measured (predicted worst 1 − cos, INT8 → that node float): the text encoder's layer-0
#: fused QKV, whose input is the embedding LayerNorm with ±250 sink tokens and ×44 channels, 0.00676 → 0.00041
#: (16×, 6.1 % of MACs; the topic head's expected flips 1.07 → 0.16)
DOMINANT_GAIN = 4.0
DOMINANT_MACS = 0.08
#: how many of the most sensitive nodes (within the MAC share) are tried, one verdict each; only nodes whose own
#: INT8 error (:func:`~.fallback.rank_sensitivity`) is at least ``DOMINANT_GAIN`` times the median node's are
#: tried at all (the text encoder's layer-0 QKV: 6.4×; the doc encoder's most sensitive small node 2.1×, the
#: digits ViT's 4.2×, neither dominant): a verdict costs as much as ViT-B/16's whole Q/DQ run on the selection
#: and screen samples (~25 s on 2 cores), not spent on a model whose nodes err alike
DOMINANT_TRIES = 2


def _probe_dominant(qdq: ir.Model, plan: QuantPlan, first: Verdict, judge: Judge, build: _Builder,
                    report: QuantReport, ranking: list[tuple[str, float]],
                    room: int | None = None) -> tuple[ir.Model, QuantPlan, Verdict]:
    """One node in float when it alone makes most of the predicted worst-case error (:data:`DOMINANT_GAIN`):
    the most sensitive small nodes that fit the target's INT8-share ``room`` are tried one at a time; the
    first that qualifies is kept float."""
    total = plan.total_macs or 1
    macs = {n.node: n.macs for n in plan.nodes}
    typical = float(np.median([e for _, e in ranking])) if ranking else 0.0
    small = [n for n, e in ranking
             if macs.get(n, 0) / total <= DOMINANT_MACS and e >= DOMINANT_GAIN * typical
             and _over_room([n], plan, room) is None][:DOMINANT_TRIES]
    e_int8 = 1.0 - first.prediction.cosine_min
    tried = []
    for node in small:
        trial_plan = plan.without({node}, "kept in float (one node dominates the INT8 error)")
        trial_qdq = build(trial_plan)  # the model written if it qualifies: built once
        trial = judge(trial_qdq)
        e_float = 1.0 - trial.prediction.cosine_min
        tried.append(f"{node} {trial.prediction.cosine_min:.5f}")
        if e_float * DOMINANT_GAIN <= e_int8 and len(trial.failing()) <= len(first.failing()):
            report.notes.append(
                f"one node dominates the INT8 error: {node} ({macs[node] / total:.1%} of quantized MACs) kept in float: "
                f"predicted worst cosine {first.prediction.cosine_min:.5f} → {trial.prediction.cosine_min:.5f}")
            report.float_fallback.append({"node": node, "sensitivity": float(dict(ranking)[node]),
                                          "macs": int(macs[node]), "macs_share": macs[node] / total, "why": "dominant"})
            report.float_macs_share += macs[node] / total
            return trial_qdq, trial_plan, trial
    if tried:
        report.notes.append(f"no node dominates the INT8 error (predicted worst cosine {first.prediction.cosine_min:.5f}; "
                            f"each alone in float: {', '.join(tried)}): all kept INT8")
    return qdq, plan, first


def _activations_note(target: Target) -> str:
    """What ``quantization.asymmetric_activations: auto`` chose for this graph."""
    if target.spec.asymmetric_activations:
        return ("activations: uint8 with a zero point (asymmetric_activations=auto: the graph has conv stages, whose "
                "SiLU / GELU outputs keep all 256 levels so)")
    return ("activations: int8 with zero point 0 (asymmetric_activations=auto: a transformer without conv stages, "
            "whose two-sided residual streams lose nothing to the sign bit)")


def _output_rank_note(by_node: list[tuple[str, float]], by_output: list[tuple[str, float]]) -> str:
    """How the fallback ranked its candidates, and where the first few would have stood by their own error."""
    pos = {n: i + 1 for i, (n, _) in enumerate(by_node)}
    head = ", ".join(f"{n} (#{pos.get(n, '?')} by its own output)" for n, _ in by_output[:3])
    return (f"fallback order: each layer's INT8 error as the model's outputs see it (one model run per layer and "
            f"sensitivity sample, a network with conv stages); first {head}")


def _judged(plan: QuantPlan, judge: Judge, build: _Builder) -> Verdict:
    """The verdict on ``plan``'s model; a passing one's model is kept (the search's last pass is its pick)."""
    verdict = judge(build(plan))
    if verdict:
        build.keep(plan)
    return verdict


def _fallback_note(fbr: FallbackResult, selection: str | None, tol) -> str:
    """What the fallback kept float and what it cost; when it missed, which checks and how far."""
    line = (f"fallback: {len(fbr.float_nodes)} node(s) kept in float ({fbr.macs_float_share:.1%} of quantized MACs) "
            f"after {fbr.evaluations} evaluation(s) on {selection}; budget {'met' if fbr.met else 'NOT met'} "
            "by the predicted figures")
    if not fbr.met:
        p = fbr.after.prediction
        far = (f"; predicted worst cosine {p.cosine_min:.5f}" + (f" (needs {tol.cosine_min})" if tol.cosine_min is not None else "")
               + f", missing: {', '.join(sorted(fbr.after.failing()))}")
        line += far + (f"; stopped: {fbr.stopped}" if fbr.stopped else "")
    return line


def _pv_nodes(model: ir.Model, plan: QuantPlan) -> list[str]:
    """The plan's attn·V MatMuls (the Softmax output times V)."""
    nodes = {n.name: n for n in model.graph}
    return [n.node for n in plan.nodes if n.kind is NodeKind.attention and attention_role(nodes[n.node]) == "pv"]


def _sensitive_pv(model: ir.Model, plan: QuantPlan, ranking: list[tuple[str, float]]) -> list[str]:
    """attn·V nodes whose own INT8 error is in the upper half of all quantized nodes': the fallback's
    cheapest candidates (their MACs are a few per cent of a ViT's)."""
    if not ranking:
        return []
    median = float(np.median([e for _, e in ranking]))
    err = dict(ranking)
    return [n for n in _pv_nodes(model, plan) if err.get(n, 0.0) >= median]


def attention_summary(model: ir.Model, annotated: QuantPlan, final: QuantPlan) -> dict[str, Any]:
    """How attention runs in the written file: Q·Kᵀ / attn·V MatMuls in INT8 out of those annotated,
    and the share of GEMM MACs the float attn·V costs (a runtime fuses INT8 attention only where both
    batched MatMuls are INT8: a float attn·V there is a measured trade, reported)."""
    pv = set(_pv_nodes(model, annotated))
    att = [n for n in annotated.nodes if n.kind is NodeKind.attention]
    kept = {n.node for n in final.nodes}
    float_pv = sorted(pv - kept)
    total = annotated.total_macs or 1
    return {"qk_int8": sum(1 for n in att if n.node not in pv and n.node in kept), "qk": len(att) - len(pv),
            "pv_int8": len(pv) - len(float_pv), "pv": len(pv), "pv_float": float_pv,
            "pv_float_macs_share": sum(n.macs for n in att if n.node in float_pv) / total}


def _holdout(recipe: Recipe, calib: SampleSet) -> tuple[SampleSet, SampleSet | None]:
    tol, fb = recipe.tolerance("quantize_int8"), recipe.quantization.fallback
    gated = tol.cosine_min is not None or tol.top1_agreement is not None
    # samples are held out only for a fallback that could act on them
    return split_samples(calib, fb.eval_samples) if gated and _fallback_enabled(recipe) else (calib, None)


def quantize_int8(fp32_path: str | Path, out_path: str | Path, calib: SampleSet, target: Target,
                  work_dir: str | Path, gate: GateInfo | None = None) -> QuantReport:
    """Quantize a float ONNX model to INT8 Q/DQ by the target's rules and its recipe's settings.

    Args:
        fp32_path: the float model (static shapes, single output).
        out_path: where the Q/DQ model goes (written atomically, with ``.data`` when large).
        calib: calibration samples; when the recipe gates INT8 parity, the last
            ``quantization.fallback.eval_samples`` of them (at most a quarter) are held out to choose
            float fallback layers and are not calibrated on.
        target: the run's target (:func:`vitexport.targets.build_target`); its ``recipe`` gives the
            calibration, quantization and parity settings.
        work_dir: where ``calibration.json`` (and the target's extra files) go.
        gate: how many samples the INT8 gate will score and whether they are labelled: the fallback
            predicts the gate's worst case over that many (default: the parity recipe's sample count,
            no labels).
    Returns:
        A :class:`QuantReport`.
    Raises:
        BadInput: unreadable model, calibration data that does not fit the model.
    """
    fp32_path, out_path, work_dir = Path(fp32_path), Path(out_path), Path(work_dir)
    if len(calib) == 0:
        raise BadInput("calibration data holds no samples")
    work_dir.mkdir(parents=True, exist_ok=True)
    model = prepare_model(fp32_path, target)
    auto = target.spec.asymmetric_activations == "auto"
    target = target.for_model(model)
    recipe = target.recipe
    plan = target.annotate(model)
    report = QuantReport(target=target.name, method=recipe.calibration.method.value)
    if auto:
        report.notes.append(_activations_note(target))
    if not plan.nodes:
        report.notes.append("no node fits the target's INT8 rules; the model is written unchanged (float)")
    elif (wnote := target.weight_range_note()) is not None:
        report.notes.append(wnote)
    calib_part, select = _holdout(recipe, calib)
    prof = QuantProfile()
    n_screen = screen_size(recipe.quantization.fallback.screen_samples, plan.total_macs) if select is not None else 0
    res = _scales(model, fp32_path, target, plan, calib_part, recipe, work_dir, len(select or ()), report, prof, n_screen)
    plan, ranges = res.plan, res.table.tensors
    fp16 = target.high_precision() == "fp16" and bool(plan.nodes)
    if fp16:
        with prof.step("conversion"):
            model = to_opset(model, 19)  # float16 Q/DQ scales
    build = _Builder(model, ranges, WeightCache(overrides=res.rounded, bias=res.table.bias),
                     res.table.float_ranges if fp16 else None, prof)
    qdq, annotated = build(plan), plan
    if select is not None and plan.nodes:
        with bounded_heap():  # a float and Q/DQ sessions one after the other: hand their buffers back
            gate = gate or GateInfo(recipe.parity_data.num_samples)
            qdq, plan = _fallback(model, qdq, plan, ranges, calib_part, select, target, recipe, build, report, gate,
                                  res.outputs)
    report.attention = attention_summary(model, annotated, plan)
    report.notes += build.notes
    with prof.step("write"):
        _write(qdq, plan, ranges, target, recipe, out_path, work_dir, report)  # cleans qdq: it is now what the file holds
        report.precision = {"high_precision": "fp16" if fp16 else "fp32", **precision_summary(qdq),
                            "fp32_islands": dict(build.islands)}
    _float_costs(report)
    if recipe.quantization.measure_latency and plan.nodes:
        with prof.step("latency"):
            _latency(model, fp32_path, out_path, calib, target, report)
    report.profile = prof.to_dict()
    for line in prof.lines():  # a record per line: every -v line on stderr starts with the time and logger
        log.debug("profile: %s", line)
    return report


def _float_costs(report: QuantReport) -> None:
    """Each float fallback layer's cost: its MACs and the share of the model's GEMM/Conv MACs (the INT8
    share the target's gate counts) it takes out of INT8."""
    p = report.precision
    total = int(p.get("int8_gemm_macs", 0)) + int(p.get("float_gemm_macs", 0))
    for f in report.float_fallback:
        f["int8_share_cost"] = f.get("macs", 0) / total if total else 0.0


def _write(qdq: ir.Model, plan: QuantPlan, ranges, target: Target, recipe: Recipe, out_path: Path,
           work_dir: Path, report: QuantReport) -> None:
    problems = target.validate(qdq)
    if problems:  # a bug in the converter, not a user error
        raise RuntimeError(f"Q/DQ placement breaks the {target.name} rules: {'; '.join(map(str, problems[:3]))}")
    stats = QdqStats(len(plan.nodes),
                     sum(1 for n in qdq.graph if n.op_type == "QuantizeLinear"),
                     sum(1 for n in qdq.graph if n.op_type == "DequantizeLinear" and n.inputs[0].is_initializer()))
    report.quantized_nodes, report.qdq_pairs, report.weights_quantized = stats.quantized_nodes, stats.qdq_pairs, stats.weights
    log.debug("saving %s", out_path)
    save_model(qdq, out_path)
    report.artifacts["model"] = str(out_path)
    report.artifacts["calibration_table"] = str(work_dir / "calibration.json")
    scales = {t: ranges[t]["amax"] / INT8_MAX for t in plan.tensors()}
    for key, path in target.write_artifacts(work_dir, scales, recipe.calibration.method.value).items():
        report.artifacts[key] = str(path)
    if report.smoothed and "calibration_cache" in report.artifacts:
        report.notes.append("calibration.cache holds the scales of the smoothed graph (the factors are folded into "
                            "model.int8.onnx); it does not fit the un-smoothed float model")


def _latency(model: ir.Model, fp32_path: Path, out_path: Path, calib: SampleSet, target: Target,
             report: QuantReport) -> None:
    n_params = sum(int(np.prod(v.const_value.shape)) for v in model.graph.initializers.values()
                   if v.const_value is not None and v.const_value.dtype == ir.DataType.FLOAT)
    if n_params > _MAX_TIMED_PARAMS:
        report.notes.append(f"latency not measured here ({n_params / 1e6:.0f} M parameters: timing would cost more "
                            "memory and time than quantizing); vitexport.runners.timing.latency_ratio() measures it")
        return
    feed = next(iter(FeedSet.for_model(calib, model, 1)))
    log.debug("timing FP32 vs INT8")
    lat = latency_ratio(fp32_path, out_path, feed, threads=2, runs=10, budget_s=6.0)
    report.latency, report.latency_ratio = lat, lat["speedup"]
    if lat["speedup"] < 1.0:
        report.notes.append(f"INT8 Q/DQ model is SLOWER than FP32 in ONNX Runtime on this CPU ({lat['speedup']:.2f}x, "
                            f"2 threads); the Q/DQ layout targets {target.name}")
