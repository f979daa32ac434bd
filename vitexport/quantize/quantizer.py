"""``quantize_int8``: annotate (target) → calibrate (smoothing + ranges, or a cached table) →
convert (Q/DQ) → fallback (on held-out calibration data, in the target's arithmetic) → validate →
write the artifacts atomically.
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
from ..runners.sessions import LOW_MEMORY
from ..runners.timing import latency_ratio
from ..errors import BadInput, ContractViolation
from ..graph.files import load_model, save_model
from ..io import sha256_file
from ..memory import bounded_heap
from ..parity.metrics import CompareResult
from ..recipe import Recipe
from .calibrate import CalibrationResult, calibrate, observe_absmax, reuse_table, table_settings
from .convert import INT8_MAX, QdqStats, WeightCache, convert
from .fallback import evaluate, rank_sensitivity, run_outputs, search_fallback
from .precision import Float16Islands, precision_summary, to_opset
from .spec import QuantPlan

if TYPE_CHECKING:  # the target is handed in: quantize/ never imports a target
    from ..targets.base import Target

__all__ = ["QuantReport", "quantize_int8", "prepare_model"]

log = logging.getLogger("vitexport.quantize")

#: above this many float parameters (ViT-S has 22 M, ViT-B 86 M) quantize_int8 does not time the
#: models itself: two extra ONNX Runtime sessions of a ViT-B cost ~0.7 GB and half a minute
_MAX_TIMED_PARAMS = 40_000_000


class QuantReport(BaseModel):
    """What ``quantize_int8`` did; ``to_dict()`` is what the pipeline writes into its manifest.

    ``parity_before_fallback`` / ``parity`` are the INT8 model's comparison with the float model on
    the *selection* data (held-out calibration samples), before and after the fallback: what the
    fallback predicted. The stage's gate then measures the written file on the parity data.
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
    latency: dict[str, float] | None = None
    latency_ratio: float | None = None
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


def _compare_dict(res: CompareResult | None) -> dict[str, Any] | None:
    if res is None:
        return None
    return {"passed": bool(res), "metrics": res.metrics.to_dict(),
            "checks": [c.to_dict() for c in res.checks]}


def _scales(model: ir.Model, fp32_path: Path, target: Target, plan: QuantPlan, calib: SampleSet,
            recipe: Recipe, work_dir: Path, holdout: int, report: QuantReport) -> CalibrationResult:
    """A cached table that fits, else a fresh calibration (saved as ``calibration.json``)."""
    cal = recipe.calibration
    key = {"model_hash": sha256_file(fp32_path), "data_hash": calib.fingerprint(), "method": cal.method.value,
           "settings": table_settings(recipe, target, holdout)}
    path = work_dir / "calibration.json"
    res = reuse_table(path, model, target, plan, key, report.notes, recipe.quantization.smooth_insert) if cal.reuse else None
    if res is None:
        res = calibrate(model, target, plan, calib, recipe)
        if target.high_precision() == "fp16" and res.plan.nodes:
            res.table.float_ranges = observe_absmax(model, calib.head(recipe.quantization.fp16_samples), recipe)
        res.table.model_hash, res.table.data_hash, res.table.settings = key["model_hash"], key["data_hash"], key["settings"]
        res.table.save(path)
    report.reused_table, report.num_samples = res.reused, res.table.num_samples
    report.smoothed, report.smooth_skipped = res.smoothed, dict(res.smooth_skipped)
    report.skipped_nodes = dict(res.plan.skipped)
    return res


class _Builder:
    """The Q/DQ model of a plan, exactly as it is written: conversion, then (for an fp16 target) the
    float parts in float16. The fallback's candidates and the artifact come from the same call."""

    def __init__(self, model: ir.Model, ranges, cache: WeightCache, float_ranges: dict[str, float] | None):
        self.model, self.ranges, self.cache, self.float_ranges = model, ranges, cache, float_ranges
        self.islands: dict[str, str] = {}

    def __call__(self, plan: QuantPlan) -> ir.Model:
        qdq, _ = convert(self.model, plan, self.ranges, self.cache)
        if self.float_ranges is not None:
            self.islands = Float16Islands(self.float_ranges)(qdq).report.skipped
        return qdq


def _fallback(model: ir.Model, qdq: ir.Model, plan: QuantPlan, ranges, calib: SampleSet, select: SampleSet,
              target: Target, recipe: Recipe, build: _Builder, report: QuantReport) -> tuple[ir.Model, QuantPlan]:
    """Check the INT8 model on the held-out selection data; keep layers in float until it passes."""
    tol, fb = recipe.tolerance("quantize_int8"), recipe.quantization.fallback
    feeds = FeedSet.for_model(select, model, recipe.calibration.batch_size)
    reference = run_outputs(model, feeds, LOW_MEMORY)  # the (smoothed) float model: the same function
    first = evaluate(qdq, feeds, reference, tol, target.gate_config)
    report.selection = f"{len(select)} held-out calibration sample(s), not used to calibrate"
    report.parity_before_fallback = _compare_dict(first)
    result = first
    if not first and fb.enabled and fb.max_float_layers > 0:
        sens = FeedSet.for_model(calib.head(fb.sensitivity_samples), model, recipe.calibration.batch_size)
        ranking = rank_sensitivity(model, plan, ranges, sens, target.gate_config, build.cache)
        fbr = search_fallback(plan, lambda p: evaluate(build(p), feeds, reference, tol, target.gate_config),
                              ranking, fb.max_float_layers, first)
        if fbr.float_nodes:
            plan = plan.without(set(fbr.float_nodes))
            qdq = build(plan)
        result = fbr.after
        report.float_fallback, report.float_macs_share = fbr.per_node, fbr.macs_float_share
        report.notes.append(
            f"fallback: {len(fbr.float_nodes)} node(s) kept in float ({fbr.macs_float_share:.1%} of quantized MACs) "
            f"after {fbr.evaluations} evaluation(s) on {report.selection}; budget {'met' if fbr.met else 'NOT met'} there")
    elif not first:
        report.notes.append("INT8 misses the parity budget on the selection data and the fallback is disabled")
    report.parity, report.budget_met = _compare_dict(result), bool(result)
    return qdq, plan


def _holdout(recipe: Recipe, calib: SampleSet) -> tuple[SampleSet, SampleSet | None]:
    tol, fb = recipe.tolerance("quantize_int8"), recipe.quantization.fallback
    gated = tol.cosine_min is not None or tol.top1_agreement is not None
    # samples are held out only for a fallback that could act on them
    return split_samples(calib, fb.eval_samples) if gated and fb.enabled and fb.max_float_layers > 0 else (calib, None)


def quantize_int8(fp32_path: str | Path, out_path: str | Path, calib: SampleSet, target: Target,
                  work_dir: str | Path) -> QuantReport:
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
    Returns:
        A :class:`QuantReport`.
    Raises:
        BadInput: unreadable model, calibration data that does not fit the model.
    """
    fp32_path, out_path, work_dir = Path(fp32_path), Path(out_path), Path(work_dir)
    if len(calib) == 0:
        raise BadInput("calibration data holds no samples")
    work_dir.mkdir(parents=True, exist_ok=True)
    recipe = target.recipe
    model = prepare_model(fp32_path, target)
    plan = target.annotate(model)
    report = QuantReport(target=target.name, method=recipe.calibration.method.value)
    if not plan.nodes:
        report.notes.append("no node fits the target's INT8 rules; the model is written unchanged (float)")
    calib_part, select = _holdout(recipe, calib)
    res = _scales(model, fp32_path, target, plan, calib_part, recipe, work_dir, len(select or ()), report)
    plan, ranges = res.plan, res.table.tensors
    fp16 = target.high_precision() == "fp16" and bool(plan.nodes)
    if fp16:
        model = to_opset(model, 19)  # float16 Q/DQ scales
    build = _Builder(model, ranges, WeightCache(bias=res.table.bias), res.table.float_ranges if fp16 else None)
    qdq = build(plan)
    if select is not None and plan.nodes:
        with bounded_heap():  # a float and Q/DQ sessions one after the other: hand their buffers back
            qdq, plan = _fallback(model, qdq, plan, ranges, calib_part, select, target, recipe, build, report)
    _write(qdq, plan, ranges, target, recipe, out_path, work_dir, report)  # cleans qdq: it is now what the file holds
    report.precision = {"high_precision": "fp16" if fp16 else "fp32", **precision_summary(qdq),
                        "fp32_islands": dict(build.islands)}
    if recipe.quantization.measure_latency and plan.nodes:
        _latency(model, fp32_path, out_path, calib, target, report)
    return report


def _write(qdq: ir.Model, plan: QuantPlan, ranges, target: Target, recipe: Recipe, out_path: Path,
           work_dir: Path, report: QuantReport) -> None:
    problems = target.validate(qdq)
    if problems:  # a bug in the converter, not a user error
        raise RuntimeError(f"Q/DQ placement breaks the {target.name} rules: {problems[:5]}")
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
