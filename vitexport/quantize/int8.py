"""``quantize_int8``: annotate (target) → equalise → calibrate (streaming) → write Q/DQ → check
parity → fall back layer by layer if needed → write the artifacts atomically."""
from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..calibration.collect import collect, model_batches, static_batch
from ..calibration.data import NpzSamples, SampleSet
from ..calibration.observers import ChannelAbsMaxObserver, make_observer
from ..calibration.session import load_split, release_memory, spill_to_disk
from ..calibration.table import ScaleTable, write_trt_cache
from ..errors import BadInput, ContractViolation
from ..io import atomic_path, sha256_file
from ..parity.metrics import CompareResult
from ..recipe import CalibrationMethod, Recipe, TargetKind
from .convert import INT8_MAX, to_qdq
from .equalize import apply_equalization, compute_factors, find_sites
from .fallback import evaluate, rank_sensitivity, run_outputs, search_fallback
from .graph import GraphIndex
from .targets import QuantPlan, get_target

__all__ = ["QuantReport", "quantize_int8", "check_placement"]

log = logging.getLogger("vitexport.quantize")

_TABLE_FORMAT = 1  # bump when what a table means changes
#: above this many float parameters (ViT-S has 22 M, ViT-B 86 M) quantize_int8 does not time the
#: models itself: two extra ONNX Runtime sessions of a ViT-B cost ~0.7 GB and half a minute
_MAX_TIMED_PARAMS = 40_000_000


@dataclass
class QuantReport:
    """What ``quantize_int8`` did. ``to_dict()`` is what the pipeline writes into its manifest."""

    target: str
    method: str
    num_samples: int
    reused_table: bool
    quantized_nodes: int
    qdq_pairs: int
    weights_quantized: int
    float_fallback: list[dict[str, Any]] = field(default_factory=list)
    equalized: int = 0
    equalize_skipped: dict[str, str] = field(default_factory=dict)
    skipped_nodes: dict[str, str] = field(default_factory=dict)
    parity: dict[str, Any] | None = None
    parity_before_fallback: dict[str, Any] | None = None
    budget_met: bool | None = None
    latency: dict[str, float] | None = None
    latency_ratio: float | None = None
    notes: list[str] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _settings(recipe: Recipe, plan: QuantPlan) -> dict[str, Any]:
    cal, q = recipe.calibration, recipe.quantization
    return {
        "format": _TABLE_FORMAT,
        "target": plan.target,
        "percentile": cal.percentile,
        "num_bins": cal.num_bins,
        "num_samples": cal.num_samples,
        "seed": cal.seed,
        "equalize": q.equalize,
        "equalize_alpha": q.equalize_alpha if q.equalize else None,
        "equalize_samples": min(q.equalize_samples, cal.num_samples) if q.equalize else None,
        "quantize_attention_matmuls": q.quantize_attention_matmuls,
    }


def _compare_dict(res: CompareResult | None) -> dict[str, Any] | None:
    if res is None:
        return None
    return {"passed": bool(res), "metrics": res.metrics.to_dict(),
            "checks": [{"metric": c.metric, "value": c.value, "limit": c.limit, "op": c.op, "passed": c.passed}
                       for c in res.checks]}


def _calibrate(model: onnx.ModelProto, index: GraphIndex, plan: QuantPlan, calib: SampleSet, recipe: Recipe,
               report: QuantReport) -> tuple[ScaleTable, GraphIndex, QuantPlan]:
    """Equalise (in place) and calibrate; returns the table and the re-annotated graph."""
    cal, q = recipe.calibration, recipe.quantization
    budget = cal.memory_budget_mb << 20
    factors: dict[str, list[float]] = {}
    if q.equalize:
        sites, skipped = find_sites(index, plan)
        report.equalize_skipped = skipped
        if sites:
            obs = {s.tensor: [ChannelAbsMaxObserver()] for s in sites}
            log.debug("equalisation statistics for %d site(s)", len(sites))
            collect(model, calib.head(q.equalize_samples), obs, batch_size=cal.batch_size, budget_bytes=budget, weights=index.arrays,
                    bytes_per_sample={t: index.nbytes(t) for t in obs}, description="equalisation statistics")
            arr = {s.tensor: compute_factors(index, s, obs[s.tensor][0].amax, q.equalize_alpha) for s in sites
                   if obs[s.tensor][0].amax is not None}
            report.equalized = apply_equalization(model, index, sites, arr)
            log.debug("equalised %d site(s)", report.equalized)
            factors = {k: [float(x) for x in v] for k, v in arr.items()}
            index = GraphIndex(model, shapes=index.shapes, arrays=index.arrays)
            plan = get_target(recipe).annotate(index)
    tensors = plan.tensors()
    observers = {t: [make_observer(cal.method, cal.num_bins)] for t in tensors}
    log.debug("calibrating %d tensor(s) with %s", len(tensors), cal.method.value)
    seen = collect(model, calib, observers, batch_size=cal.batch_size, budget_bytes=budget, weights=index.arrays,
                   bytes_per_sample={t: index.nbytes(t) for t in tensors}, description=f"calibrating ({cal.method.value})")
    # attention probabilities: a clipping method (entropy especially) squeezes the few large
    # probabilities that matter; their exact range ([0, max] with max ≤ 1) costs nothing
    probs = {t for t in tensors if _produced_by(index, t, "Softmax")}
    table_tensors = {}
    for t in tensors:
        method = CalibrationMethod.minmax if t in probs else cal.method
        r = observers[t][0].compute(method, cal.percentile)
        table_tensors[t] = {"amax": r.amax, "scale": max(r.amax, 1e-30) / INT8_MAX, "lo": r.lo, "hi": r.hi,
                            "min": r.min, "max": r.max}
    del observers
    table = ScaleTable(cal.method.value, int(seen), "", calib.fingerprint(), {}, table_tensors, factors)
    return table, index, plan


def _produced_by(index: GraphIndex, tensor: str, op_type: str) -> bool:
    """Whether ``tensor`` comes from an ``op_type`` node, looking through value-preserving ops."""
    for _ in range(4):
        p = index.producer.get(tensor)
        if p is None:
            return False
        if p.op_type == op_type:
            return True
        if p.op_type not in ("Reshape", "Transpose", "Cast", "Identity", "Squeeze", "Unsqueeze", "Flatten"):
            return False
        tensor = p.input[0]
    return False


def _apply_table_equalization(model: onnx.ModelProto, index: GraphIndex, plan: QuantPlan, table: ScaleTable,
                              recipe: Recipe, report: QuantReport) -> tuple[GraphIndex, QuantPlan]:
    if not table.equalization:
        return index, plan
    sites, skipped = find_sites(index, plan)
    report.equalize_skipped = skipped
    known = {s.tensor for s in sites}
    missing = sorted(set(table.equalization) - known)
    if missing:
        raise BadInput(f"scale table equalisation sites {missing[:3]} are not in this model")
    arr = {k: np.asarray(v, np.float32) for k, v in table.equalization.items()}
    report.equalized = apply_equalization(model, index, sites, arr)
    index = GraphIndex(model, shapes=index.shapes, arrays=index.arrays)
    return index, get_target(recipe).annotate(index)


def check_placement(model: onnx.ModelProto, target: str | TargetKind) -> list[str]:
    """Rule violations of a Q/DQ model for ``target`` (empty when it follows the target's rules).

    Checks: orin — zero points are 0 and int8, no Q/DQ feeds a LayerNormalization / Softmax / Add /
    Erf / Div / Sub node, each activation Q has one DQ consumer which has one consumer; npu — no
    float16 tensor anywhere, no ``axis`` on any Q/DQ (per tensor); all — every Q/DQ scale positive.
    """
    kind = TargetKind(target)
    idx = GraphIndex(model)
    problems: list[str] = []
    for n in idx.nodes:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        scale = idx.const_value(n.input[1])
        if scale is None or not np.all(scale > 0):
            problems.append(f"{n.name}: scale is not a positive constant")
        zp = idx.const_value(n.input[2]) if len(n.input) > 2 and n.input[2] else None
        if kind is TargetKind.orin:
            if zp is None or zp.dtype != np.int8 or np.any(zp != 0):
                problems.append(f"{n.name}: TensorRT needs an int8 zero point of 0")
        if kind is TargetKind.npu and idx.attr(n, "axis") is not None and scale is not None and scale.size > 1:
            problems.append(f"{n.name}: per-channel quantization on a per-tensor target")
        if n.op_type == "DequantizeLinear":
            for c, _ in idx.consumers.get(n.output[0], []):
                if kind is TargetKind.orin and c.op_type in ("LayerNormalization", "Softmax", "Add", "Erf", "Div", "Sub", "Mul"):
                    problems.append(f"{n.name}: feeds {c.op_type} '{c.name}', which TensorRT should run in float")
            if kind is TargetKind.orin and n.input[0] not in idx.initializers:
                if len(idx.consumers.get(n.output[0], [])) != 1:
                    problems.append(f"{n.name}: a DequantizeLinear shared by several consumers (TensorRT wants dedicated pairs)")
        if n.op_type == "QuantizeLinear" and kind is TargetKind.orin:
            if len(idx.consumers.get(n.output[0], [])) != 1:
                problems.append(f"{n.name}: a QuantizeLinear with several consumers")
    if kind is TargetKind.npu:
        f16 = onnx.TensorProto.FLOAT16
        for name, (_, et) in idx.shapes.items():
            if et == f16:
                problems.append(f"tensor '{name}' is float16")
        for init in model.graph.initializer:
            if init.data_type == f16:
                problems.append(f"initializer '{init.name}' is float16")
    return problems


def _recut(feeds: list[dict[str, np.ndarray]], batch: int | None) -> tuple[list[dict[str, np.ndarray]], int]:
    """Parity feeds re-cut to the model's static batch (the last one padded by repeating its last
    sample, which the padded reference repeats too); returns the feeds and the real sample count."""
    n = sum(len(next(iter(f.values()))) for f in feeds)
    if batch is None or all(len(next(iter(f.values()))) == batch for f in feeds):
        return list(feeds), n
    cat = NpzSamples({k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]})
    return list(model_batches(cat, batch, batch)), n


def _default_parity(calib: SampleSet, n: int, fp32: onnx.ModelProto | None = None) -> list[dict[str, np.ndarray]]:
    feeds = []
    count = 0
    model_batch = None
    if fp32 is not None:
        model_batch = static_batch(fp32)
    for f in model_batches(calib, 8, model_batch):
        feeds.append(f)
        count += len(next(iter(f.values())))
        if count >= n:
            break
    return feeds


def quantize_int8(
    fp32_path: Path,
    out_path: Path,
    calib: SampleSet,
    recipe: Recipe,
    work_dir: Path,
    *,
    parity_feeds: list[dict[str, np.ndarray]] | None = None,
    reference: np.ndarray | None = None,
) -> QuantReport:
    """Quantize a float ONNX model to INT8 Q/DQ by the recipe's target rules.

    Args:
        fp32_path: the float model (static shapes, single output).
        out_path: where the Q/DQ model goes (written atomically).
        calib: calibration samples.
        recipe: the validated recipe (target, calibration, quantization, parity).
        work_dir: where ``calibration.json`` (and, for orin, ``calibration.cache``) go.
        parity_feeds: batches for the mixed-precision fallback's parity check.
        reference: the untouched model's outputs on ``parity_feeds`` (float32, samples on axis 0).
            Without it the float ONNX model's own outputs are the reference; without feeds, the
            first ``quantization.fallback.eval_samples`` calibration samples are used.
    Returns:
        A :class:`QuantReport`.
    Raises:
        BadInput: unreadable model, calibration data that does not fit the model.
    """
    fp32_path, out_path, work_dir = Path(fp32_path), Path(out_path), Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    spill_path = work_dir / f".fp32-weights-{os.getpid()}.bin"
    try:
        return _quantize_int8(fp32_path, out_path, calib, recipe, work_dir, parity_feeds, reference, spill_path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            spill_path.unlink()


def _quantize_int8(fp32_path: Path, out_path: Path, calib: SampleSet, recipe: Recipe, work_dir: Path,
                   parity_feeds: list[dict[str, np.ndarray]] | None, reference: np.ndarray | None,
                   spill_path: Path) -> QuantReport:
    cal, q = recipe.calibration, recipe.quantization
    if len(calib) == 0:
        raise BadInput("calibration data holds no samples")
    log.debug("loading %s", fp32_path)
    model, arrays = _load(fp32_path)
    log.debug("loaded")
    n_params = sum(int(a.size) for a in arrays.values())
    target = get_target(recipe)
    index = GraphIndex(model, arrays=arrays)
    if target.forbid_float16:
        f16 = [n for n, (_, et) in index.shapes.items() if et == onnx.TensorProto.FLOAT16]
        if f16:
            raise ContractViolation(f"{fp32_path}: the {target.kind.value} target allows no float16, "
                                    f"but the model has float16 tensors ({', '.join(f16[:3])})")
    plan = target.annotate(index)
    report = QuantReport(target.kind.value, cal.method.value, 0, False, 0, 0, 0)
    if not plan.nodes:
        report.notes.append("no node fits the target's INT8 rules; the model is written unchanged (float)")
    model_hash = sha256_file(fp32_path)
    data_hash = calib.fingerprint()
    settings = _settings(recipe, plan)
    table_path = work_dir / "calibration.json"
    table: ScaleTable | None = None
    if cal.reuse and table_path.is_file():
        try:
            old = ScaleTable.load(table_path)
            if old.matches(model_hash, data_hash, cal.method.value, settings):
                table = old
        except BadInput as exc:
            report.notes.append(f"ignored an unreadable scale table: {exc}")
    if table is not None:
        index, plan = _apply_table_equalization(model, index, plan, table, recipe, report)
        if set(plan.tensors()) - set(table.tensors):
            table = None  # the table lacks tensors this plan needs: calibrate again
            model, arrays = _load(fp32_path)
            index = GraphIndex(model, arrays=arrays)
            plan = target.annotate(index)
            report.equalized = 0
        else:
            report.reused_table = True
    if table is None:
        table, index, plan = _calibrate(model, index, plan, calib, recipe, report)
        table.model_hash, table.data_hash, table.settings = model_hash, data_hash, settings
        table.save(table_path)
    report.num_samples = table.num_samples
    report.skipped_nodes = dict(plan.skipped)
    ranges = table.tensors

    log.debug("writing Q/DQ")
    qdq, stats = to_qdq(model, plan, ranges, index)
    final_plan = plan

    # --- parity and mixed-precision fallback ---------------------------------------------------------
    tol = recipe.tolerance("quantize_int8")
    gated = tol.cosine_min is not None or tol.top1_agreement is not None
    if gated and plan.nodes:
        if parity_feeds:
            feeds, n_real = _recut(parity_feeds, static_batch(model))
        else:
            feeds = _default_parity(calib, q.fallback.eval_samples, model)
            n_real = sum(len(next(iter(f.values()))) for f in feeds)
        if reference is not None and parity_feeds:
            ref = np.asarray(reference, np.float32)
            if len(ref) == n_real and n_real < sum(len(next(iter(f.values()))) for f in feeds):
                ref = np.concatenate([ref, np.repeat(ref[-1:], sum(len(next(iter(f.values()))) for f in feeds) - n_real, 0)])
        else:
            if reference is not None:
                report.notes.append("a reference without parity_feeds cannot be matched to samples; ignored")
            # the equalised float model computes the same function as the file (factors cancel)
            log.debug("float reference")
            ref = run_outputs(model, feeds, arrays=index.arrays)
            report.notes.append("parity reference: the float ONNX model's outputs (no torch reference given)")
        # the float weights are not needed to evaluate the INT8 model: park them on disk meanwhile
        try:
            if spill_to_disk(index.arrays, spill_path):
                log.debug("float weights spilled to %s", spill_path)
        except OSError as exc:  # a full disk only costs memory here
            log.debug("could not spill the float weights: %s", exc)
            with contextlib.suppress(OSError):
                spill_path.unlink()
        log.debug("parity of the INT8 model")
        fused = target.runs_in_onnxruntime
        first = evaluate(qdq, feeds, ref, tol, fused=fused)
        report.parity_before_fallback = _compare_dict(first)
        result = first
        if not first and q.fallback.enabled and q.fallback.max_float_layers > 0:
            sens_feeds = _default_parity(calib, q.fallback.sensitivity_samples, model)
            ranking = rank_sensitivity(model, index, plan, ranges, sens_feeds, fused=fused)
            fb = search_fallback(plan, lambda p: to_qdq(model, p, ranges, index)[0],
                                 lambda m: evaluate(m, feeds, ref, tol, fused=fused),
                                 ranking, q.fallback.max_float_layers, first)
            if fb.float_nodes:
                final_plan = plan.without(set(fb.float_nodes))
                qdq, stats = to_qdq(model, final_plan, ranges, index)
            result = fb.after
            report.float_fallback = fb.per_node
            report.notes.append(
                f"fallback: {len(fb.float_nodes)} node(s) kept in float ({fb.macs_float_share:.1%} of quantized MACs) "
                f"after {fb.evaluations} evaluation(s); budget {'met' if fb.met else 'NOT met'}"
            )
        elif not first:
            report.notes.append("INT8 misses the parity budget and the fallback is disabled")
        report.parity = _compare_dict(result)
        report.budget_met = bool(result)
    report.quantized_nodes = stats.quantized_nodes
    report.qdq_pairs = stats.qdq_pairs
    report.weights_quantized = stats.weights

    problems = check_placement(qdq, target.kind)
    if problems:  # a bug in the converter, not a user error
        raise RuntimeError(f"Q/DQ placement breaks the {target.kind.value} rules: {problems[:5]}")

    log.debug("saving %s", out_path)
    with atomic_path(out_path) as tmp:
        onnx.save(qdq, str(tmp))
    report.artifacts["model"] = str(out_path)
    report.artifacts["calibration_table"] = str(table_path)
    if target.kind is TargetKind.orin:
        header = "TRT-8501-MinMaxCalibration" if cal.method.value == "minmax" else "TRT-8501-EntropyCalibration2"
        cache = work_dir / "calibration.cache"
        write_trt_cache(cache, {t: ranges[t]["amax"] / INT8_MAX for t in final_plan.tensors()}, header)
        report.artifacts["calibration_cache"] = str(cache)
        if report.equalized:
            report.notes.append(
                "calibration.cache holds the scales of the equalised graph (the factors are folded into "
                "model.int8.onnx); it does not fit the un-equalised float model"
            )

    if q.measure_latency and plan.nodes and n_params > _MAX_TIMED_PARAMS:
        report.notes.append(
            f"latency not measured here ({n_params / 1e6:.0f} M parameters: timing would cost more memory and time "
            "than quantizing); vitexport.quantize.latency_ratio() measures it"
        )
    elif q.measure_latency and plan.nodes:
        from .bench import latency_ratio

        feed = next(iter(model_batches(calib, 1, _static_or_one(qdq))))
        # the timing sessions hold their own weights: drop ours first (peak memory)
        del model, arrays, index, qdq
        release_memory()
        log.debug("timing FP32 vs INT8")
        lat = latency_ratio(fp32_path, out_path, feed, threads=2, runs=10, budget_s=6.0)
        report.latency = lat
        report.latency_ratio = lat["speedup"]
        if lat["speedup"] < 1.0:
            report.notes.append(
                f"INT8 Q/DQ model is SLOWER than FP32 in ONNX Runtime on this CPU ({lat['speedup']:.2f}x, 2 threads); "
                "the Q/DQ layout targets " + target.kind.value
            )
    return report


def _load(path: Path) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    try:
        return load_split(path)
    except Exception as exc:  # onnx raises DecodeError / OSError / ValueError
        raise BadInput(f"{path}: not a readable ONNX model ({str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__})") from None


def _static_or_one(model: onnx.ModelProto) -> int:
    return static_batch(model) or 1
