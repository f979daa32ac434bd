"""What to try when a stage fails its parity gate: the recipe keys that change the result, with the
values the run used, so the failure message is a next step rather than a number.

The INT8 stages (``quantize_int8`` and the engine built from its file) fail for three reasons a
recipe can act on: too few calibration samples, too few layers left in float, or a budget stricter
than the use needs. The fallback picks its float layers on held-out *calibration* samples with the
gate's own arithmetic, so it measures accuracy only when those samples are labelled (an ``.npz``
with ``y``); on unlabelled ones it sees cosine, the margin-gated top-1 and the flips the calibration
samples' own top-1/top-2 margins predict (:mod:`vitexport.quantize.tail`), none of which a loss made of
flips on near-ties that only the parity data holds moves (raising ``max_float_layers`` alone then
changes nothing). The float stages
fail when an export or a pass computes something else: ``--layers`` localises it.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from ..recipe import PASS_STAGES, EngineTolerance, Recipe, StageName
from .metrics import Check
from .share import SHARE_METRICS
from .tasks import TASK_METRICS

__all__ = ["failure_advice", "accepting_limit", "fallback_clause"]

#: a failed check's metric → the tolerance key that sets its limit
_KEYS = {"max_abs/ref_scale": "max_abs", "max_abs_unmasked": "max_abs", "top1_agreement_gated": "top1_agreement",
         **SHARE_METRICS, **{metric: key for metric, (key, _) in TASK_METRICS.items()}}


def _int8_stage(recipe: Recipe, stage: str) -> bool:
    """``quantize_int8``, and each stage the target runs its INT8 artifact in (its declared contract is an
    :class:`EngineTolerance`, as ``quantize_int8``'s is)."""
    return stage in recipe.stage_names() and isinstance(recipe.tolerance(stage), EngineTolerance)


def _int8(recipe: Recipe, calib_samples: int, labelled_calib: bool) -> list[str]:
    fb, cal = recipe.quantization.fallback, recipe.calibration
    out = [] if fb.enabled else ["quantization.fallback.enabled=true (keeps the most sensitive layers in float)"]
    if calib_samples >= cal.num_samples:  # the data may hold more than the run drew
        out.append(f"calibration.num_samples={2 * cal.num_samples} (now {cal.num_samples}; draws up to that many "
                   "from --calib)")
    else:
        out.append(f"more calibration data (--calib gave {calib_samples} sample(s), fewer than calibration."
                   f"num_samples={cal.num_samples})")
    if fb.enabled:
        why = "" if labelled_calib else ("; it picks them on held-out calibration samples and counts accuracy only "
                                          "when they are labelled: an .npz with 'y' as --calib")
        if fb.max_float_layers is not None:  # a cap the recipe set; without one the fallback went as far as it helped
            out.append(f"quantization.fallback.max_float_layers={max(2 * fb.max_float_layers, 4)} "
                       f"(now {fb.max_float_layers}{why})")
        elif why:  # uncapped, it went as far as more float helped: what it cannot see is the labels
            out.append("labelled calibration data (an .npz with 'y' as --calib): the fallback picks its float layers "
                       "on held-out calibration samples and counts accuracy only when they are labelled")
    return out


def accepting_limit(check: Check) -> str:
    """The check's value in 4 significant digits, rounded toward the side that passes (up for ``<=``,
    down for ``>=``): ``accuracy_drop`` 1/334 = 0.0029940 printed as ``0.002994`` would fail again."""
    text = f"{check.value:.4g}"
    value, up = check.value, check.op == "<="
    if value == 0 or not math.isfinite(value) or (float(text) >= value if up else float(text) <= value):
        return text
    step = 10.0 ** (math.floor(math.log10(abs(value))) - 3)
    return f"{(math.ceil(value / step) if up else math.floor(value / step)) * step:.4g}"


def fallback_clause(quantize: Mapping[str, Any] | None) -> str:
    """Which layers the INT8 fallback kept in float, what each costs (its share of the GEMM/Conv MACs
    taken out of INT8) and the worst cosine it predicted, from the quantize stage's details; "" without them."""
    if not quantize or quantize.get("parity") is None:
        return ""
    layers = quantize.get("float_fallback") or []
    pred = (quantize.get("parity") or {}).get("prediction") or {}
    kept = ", ".join(f"{f['node']} {f.get('int8_share_cost', f.get('macs_share', 0.0)):.1%}" for f in layers[:6])
    kept += f" and {len(layers) - 6} more" if len(layers) > 6 else ""
    total = sum(f.get("int8_share_cost", f.get("macs_share", 0.0)) for f in layers)
    what = (f"the fallback kept {len(layers)} layer(s) in float ({kept}; {total:.1%} of the GEMM/Conv MACs out of INT8)"
            if layers else "the fallback kept no layer in float")
    return what + (f" and predicted a worst cosine of {pred['cosine_min']:.5f}" if "cosine_min" in pred else "")


def failure_advice(stage: str, check: Check | None, recipe: Recipe, *, calib_samples: int,
                   labelled_calib: bool = False, labelled: int | None = None,
                   quantize: Mapping[str, Any] | None = None) -> str:
    """One clause, ``try: …``, naming the recipe keys that can make ``stage`` pass.

    Args:
        stage: the failed stage.
        check: its first failed check (None: the stage failed without one).
        recipe: the run's recipe (the values now in use are quoted).
        calib_samples: calibration samples the run used (at most ``calibration.num_samples``).
        labelled_calib: whether they carry labels.
        labelled: labelled parity samples, to say how many an ``accuracy_drop`` lost.
        quantize: the quantize stage's details (:func:`fallback_clause` says which layers stayed float).
    Returns:
        The advice, e.g. ``"2 of 400 labelled samples lost; try: calibration.num_samples=256 (…), …"``.
    """
    lost = ""
    if check is not None and check.metric.split("[")[0] == "accuracy_drop" and labelled:
        lost = f"{round(check.value * labelled)} of {labelled} labelled samples lost; "
    if check is not None and check.metric in SHARE_METRICS:
        # the outputs matched: calibration settings would not change what the backend runs in float
        lost, steps = f"{check.why}; " if check.why else "", list(check.hints or [])
    elif _int8_stage(recipe, stage):
        steps = _int8(recipe, calib_samples, labelled_calib)
        clause = fallback_clause(quantize)
        lost = f"{clause}; {lost}" if clause else lost
        lost = f"{check.why}; {lost}" if check is not None and check.why else lost  # a labelled gate's spread
    elif stage in PASS_STAGES:
        steps = [f"stages.{stage}.enabled=false (export without this rewrite)", "--layers to find the first block "
                 "that diverges"]
    else:
        steps = ["--layers to find the first layer that diverges", "export.exporter=dynamo"
                 if stage == StageName.export_onnx else "export.simplify=false"]
    metric = check.metric.split("[")[0] if check is not None else ""  # cosine_min[pred_boxes]: one key for every output
    if check is not None and metric not in ("nonfinite", "output_shape"):
        key = _KEYS.get(metric, metric)
        steps.append(f"{'or ' if steps else ''}accept it: parity.{stage}.{key}={accepting_limit(check)}")
    return f"{lost}try: " + ", ".join(steps)
