"""Calibrate: smoothing statistics, then the ranges of the plan's activations, as a scale table.

The table (``calibration.json``) records what produced it — the model file's hash, the data's
fingerprint, every setting that changes the result — and a later run with the same three reuses it
(the smoothing factors it holds are folded in again, then nothing is observed).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from ..calibration.collect import collect
from ..calibration.data import SampleSet
from ..calibration.observers import ChannelAbsMaxObserver, make_observer
from ..calibration.table import ScaleTable
from ..errors import BadInput
from ..recipe import CalibrationMethod, Recipe
from .convert import INT8_MAX
from .smooth import SmoothPass, compute_factors, find_sites
from .spec import QuantPlan
from .targets import QuantTarget, attention_role

__all__ = ["TABLE_FORMAT", "CalibrationResult", "table_settings", "calibrate", "reuse_table"]

log = logging.getLogger("vitexport.quantize")

TABLE_FORMAT = 2  # bump when what a table means changes


@dataclass
class CalibrationResult:
    """The table, the plan of the (smoothed) model, and what smoothing did."""

    table: ScaleTable
    plan: QuantPlan
    smoothed: int = 0
    smooth_skipped: dict[str, str] = field(default_factory=dict)
    reused: bool = False


def table_settings(recipe: Recipe, target: QuantTarget, holdout: int) -> dict[str, Any]:
    """Everything besides model and data that changes a table."""
    cal, q = recipe.calibration, recipe.quantization
    return {
        "format": TABLE_FORMAT,
        "target": target.kind.value,
        "percentile": cal.percentile,
        "num_bins": cal.num_bins,
        "num_samples": cal.num_samples,
        "seed": cal.seed,
        "holdout": holdout,
        "equalize": q.equalize,
        "equalize_alpha": q.equalize_alpha if q.equalize else None,
        "equalize_samples": q.equalize_samples if q.equalize else None,
        "quantize_attention_matmuls": q.quantize_attention_matmuls,
    }


def _smooth(model: ir.Model, target: QuantTarget, plan: QuantPlan, samples: SampleSet, recipe: Recipe,
            res: CalibrationResult) -> dict[str, list[float]]:
    """Observe per-channel maxima at every smoothing site, fold the factors in; returns them."""
    cal, q = recipe.calibration, recipe.quantization
    sites, res.smooth_skipped = find_sites(model, plan)
    if not sites:
        return {}
    obs = {s.tensor: [ChannelAbsMaxObserver()] for s in sites}
    log.debug("smoothing statistics for %d site(s)", len(sites))
    collect(model, samples.head(q.equalize_samples), obs, batch_size=cal.batch_size,
            budget_bytes=cal.memory_budget_mb << 20, description="smoothing statistics")
    factors = {s.tensor: compute_factors(model, s, obs[s.tensor][0].amax, q.equalize_alpha)
               for s in sites if obs[s.tensor][0].amax is not None}
    res.smoothed = SmoothPass(sites, factors)(model).report.changed
    return {k: [float(x) for x in v] for k, v in factors.items()}


def _is_probability(model: ir.Model, tensor: str) -> bool:
    """Whether ``tensor`` is attention's Softmax output (the left input of attn·V)."""
    values = ir.convenience.create_value_mapping(model.graph)
    return any(u.idx == 0 and u.node.op_type == "MatMul" and attention_role(u.node) == "pv"
               for u in values[tensor].uses())


def calibrate(model: ir.Model, target: QuantTarget, plan: QuantPlan, samples: SampleSet, recipe: Recipe) -> CalibrationResult:
    """Smooth ``model`` in place (when the recipe says so) and calibrate the plan's activations.

    Returns:
        The result; ``result.plan`` is the plan of the smoothed model (weights may be renamed).
    """
    cal, q = recipe.calibration, recipe.quantization
    res = CalibrationResult(ScaleTable(method=cal.method.value, num_samples=0, model_hash="", data_hash=samples.fingerprint(), settings={}), plan)
    if q.equalize:
        res.table.equalization = _smooth(model, target, plan, samples, recipe, res)
        res.plan = target.annotate(model)
    tensors = res.plan.tensors()
    observers = {t: [make_observer(cal.method, cal.num_bins)] for t in tensors}
    log.debug("calibrating %d tensor(s) with %s", len(tensors), cal.method.value)
    res.table.num_samples = collect(model, samples, observers, batch_size=cal.batch_size,
                                    budget_bytes=cal.memory_budget_mb << 20, description=f"calibrating ({cal.method.value})")
    for t in tensors:
        # attention probabilities: a clipping method (entropy especially) squeezes the few large
        # probabilities that matter; their exact range ([0, max] with max ≤ 1) costs nothing
        method = CalibrationMethod.minmax if _is_probability(model, t) else cal.method
        r = observers[t][0].compute(method, cal.percentile)
        res.table.tensors[t] = {"amax": r.amax, "scale": max(r.amax, 1e-30) / INT8_MAX, "lo": r.lo, "hi": r.hi,
                                "min": r.min, "max": r.max}
    return res


def reuse_table(path: Path, model: ir.Model, target: QuantTarget, plan: QuantPlan, key: dict[str, Any],
                notes: list[str]) -> CalibrationResult | None:
    """The table at ``path`` applied to ``model`` when it matches ``key`` (model hash, data hash,
    method, settings) and covers the plan; None otherwise (the caller calibrates)."""
    if not path.is_file():
        return None
    try:
        table = ScaleTable.load(path)
    except BadInput as exc:
        notes.append(f"ignored an unreadable scale table: {exc}")
        return None
    if not table.matches(**key) or set(plan.tensors()) - set(table.tensors):
        return None
    res = CalibrationResult(table, plan, reused=True)
    if table.equalization:
        sites, res.smooth_skipped = find_sites(model, plan)
        if set(table.equalization) - {s.tensor for s in sites}:
            return None
        res.smoothed = SmoothPass(sites, {k: np.asarray(v, np.float32) for k, v in table.equalization.items()})(model).report.changed
        res.plan = target.annotate(model)
    return res
