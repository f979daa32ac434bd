"""The fallback's yardstick: one Q/DQ model judged the way the gate will judge it, before the gate does.

A :class:`Judge` holds the float model's outputs on two sets of samples the quantizer may look at —
the held-out *selection* samples (never calibrated on) and a *screen* of calibration samples — and
turns a candidate Q/DQ model into a :class:`Verdict`: the gate's own comparison on the selection
samples (same arithmetic, same checks), and a :class:`~.tail.Prediction` of the gate's worst case over
the number of samples the gate will score, from both sets (:mod:`.tail`). A candidate passes only
when both say so: the selection's minimum alone is not a prediction of the gate's minimum.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx_ir as ir

from ..calibration.feeds import FeedSet
from ..runners.sessions import CALIBRATION, LOW_MEMORY, Session, SessionConfig
from ..parity.metrics import CompareResult, compare
from ..parity.tasks import task_checks
from ..recipe import Tolerance
from .profile import QuantProfile
from .tail import GateInfo, Prediction, predict

__all__ = ["Verdict", "Judge", "judge_outputs", "run_outputs", "primary_index", "task_gated", "add_task_checks",
           "TASK_JUDGED"]

#: the tasks whose INT8 gate measures a task metric by default (:data:`~vitexport.recipe.TASK_GATES`), so the
#: judge measures it too (an embedder's recall is reported, not gated)
TASK_JUDGED = ("detect", "segment", "depth")


def primary_index(names: list[str]) -> int:
    """Which of a graph's outputs the judge reads: ``logits`` among several, else the first (the
    gate checks every output; the fallback steers by this one)."""
    return names.index("logits") if "logits" in names else 0


def _primary(sess: Session, feeds: FeedSet, i: int, on_run: Callable[[int], None] | None) -> np.ndarray:
    """Output ``i`` of ``sess`` over ``feeds`` (padding trimmed), float32; ``on_run`` counts each run."""
    out = []
    for f in feeds:
        out.append(sess.run(None, f)[i])
        if on_run is not None:
            on_run(len(out[-1]))
    return feeds.trim(np.concatenate(out, axis=0)).astype(np.float32)


def _every(sess: Session, feeds: FeedSet, on_run: Callable[[int], None] | None) -> dict[str, np.ndarray]:
    """Every output of ``sess`` over ``feeds`` by name (padding trimmed), float32."""
    parts: list[list[np.ndarray]] = [[] for _ in sess.output_names]
    for f in feeds:
        for part, value in zip(parts, sess.run(None, f)):
            part.append(value)
        if on_run is not None:
            on_run(len(parts[0][-1]))
    return {n: feeds.trim(np.concatenate(p, axis=0)).astype(np.float32) for n, p in zip(sess.output_names, parts)}


def task_gated(task: str | None) -> bool:
    """Whether the INT8 gate applies task metrics the judge must also apply (:data:`~vitexport.recipe.TASK_GATES`:
    a detector's mAP, a segmenter's mIoU and pixel agreement, a depth model's AbsRel and δ1)."""
    return task in TASK_JUDGED


def run_outputs(model: ir.Model, feeds: FeedSet, config: SessionConfig = LOW_MEMORY,
                on_run: Callable[[int], None] | None = None) -> np.ndarray:
    """The model's primary output (:func:`primary_index`) over ``feeds`` (padding trimmed), float32."""
    sess = Session(model, config)
    out = _primary(sess, feeds, primary_index(sess.output_names), on_run)
    del sess
    return out


@dataclass
class Verdict:
    """A candidate's figures: ``selection`` (the gate's comparison on the held-out samples), the
    prediction of the gate's figures, and which requirement each check stands for."""

    selection: CompareResult
    prediction: Prediction
    checks: dict[str, bool] = field(default_factory=dict)
    #: the task metrics on the selection samples, as the report writes them (None: no task gate)
    task: str | None = None

    def __bool__(self) -> bool:
        return all(self.checks.values())

    @property
    def flips(self) -> float | None:
        """The predicted flip rate's upper figure (None: not logits)."""
        return self.prediction.flip_rate_upper

    def failing(self) -> set[str]:
        """The names of the checks that miss."""
        return {k for k, v in self.checks.items() if not v}

    def rank(self) -> tuple[float, ...]:
        """Larger is better: checks met, predicted worst cosine, selection top-1."""
        m = self.selection.metrics
        return (float(sum(self.checks.values())), self.prediction.cosine_min, m.top1_agreement_gated or 0.0)

    def to_dict(self) -> dict:
        return {"passed": bool(self), "checks": dict(self.checks), "prediction": self.prediction.to_dict(),
                "selection": {"passed": bool(self.selection), "metrics": self.selection.metrics.to_dict(),
                              "checks": [c.to_dict() for c in self.selection.checks],
                              **({"task": self.task} if self.task is not None else {})}}


class Judge:
    """Judges Q/DQ models on fixed samples against the float model's outputs.

    Args:
        model: the float model (the smoothed one: the same function).
        select: held-out selection feeds; ``screen``: calibration feeds (may be empty).
        tolerance: the gate's tolerance; ``gate``: what the gate will score.
        config: the target's arithmetic.
        profile: counts the judge's ONNX Runtime runs (its reference under its own step).
        screen_ref: the float model's primary output on ``screen`` when the caller has it (calibration
            kept it from its ranges pass): not computed again.
    """

    def __init__(self, model: ir.Model, select: FeedSet, screen: FeedSet | None, tolerance: Tolerance, gate: GateInfo,
                 config: SessionConfig, profile: QuantProfile | None = None, screen_ref: np.ndarray | None = None):
        self.select, self.screen, self.tol, self.gate, self.config = select, screen, tolerance, gate, config
        self.profile = profile if profile is not None else QuantProfile()
        #: every output on the selection where the gate applies task metrics (a detector's boxes beside its logits)
        self.task_ref: dict[str, np.ndarray] | None = None
        with self.profile.step("reference"):
            if task_gated(gate.task):
                sess = Session(model, CALIBRATION)
                self.task_ref = _every(sess, select, self.profile.ran)
                self.ref_sel = self.task_ref[sess.output_names[primary_index(sess.output_names)]]
                del sess
            else:
                self.ref_sel = run_outputs(model, select, CALIBRATION, self.profile.ran)
            self.ref_scr = None
            if screen is not None and len(screen):
                fits = screen_ref is not None and len(screen_ref) == len(screen)
                self.ref_scr = screen_ref if fits else run_outputs(model, screen, CALIBRATION, self.profile.ran)
        self.evaluations = 0

    @property
    def description(self) -> str:
        scr = len(self.screen) if self.ref_scr is not None else 0
        return (f"{len(self.select)} held-out calibration sample(s), not used to calibrate"
                + (f", and {scr} calibration sample(s) screened for the tail" if scr else ""))

    def __call__(self, qdq: ir.Model) -> Verdict:
        """The verdict on one Q/DQ model (two ONNX Runtime sessions' worth of inference)."""
        self.evaluations += 1
        sess = Session(qdq, self.config)
        i = primary_index(sess.output_names)
        outs = _every(sess, self.select, self.profile.ran) if self.task_ref is not None else None
        out_sel = outs[sess.output_names[i]] if outs is not None else _primary(sess, self.select, i, self.profile.ran)
        out_scr = None if self.ref_scr is None else _primary(sess, self.screen, i, self.profile.ran)
        del sess
        ref_scr = None if out_scr is None else self.ref_scr.reshape(out_scr.shape)
        labels = self.select.labels  # a segmenter's label maps and a detector's boxes are the task gate's, not accuracy's
        single = labels is not None and labels.ndim == 1
        verdict = judge_outputs((self.ref_sel, out_sel), None if out_scr is None else (ref_scr, out_scr), self.tol,
                                self.gate, labels if single else None)
        if outs is not None and self.task_ref is not None:
            add_task_checks(verdict, self.gate, self.task_ref, outs, self.tol, None if single else labels)
        return verdict


def add_task_checks(verdict: Verdict, gate: GateInfo, reference: dict[str, np.ndarray], outs: dict[str, np.ndarray],
                    tolerance: Tolerance, labels: np.ndarray | None = None) -> None:
    """The gate's task checks (:func:`~vitexport.parity.tasks.task_checks`: mAP, mIoU, AbsRel…) measured on the
    selection samples, added to ``verdict`` as ``selection <check>``: a detector whose logits agree to a cosine
    of 0.998 can still lose boxes (a trained YOLOS: gate mAP vs FP32 0.984, needed 0.995, while the fallback,
    steering by cosine alone, kept no layer in float)."""
    metrics, checks, _ = task_checks(gate.task, reference, outs, tolerance, scores=gate.detect_scores, labels=labels)
    for c in checks:
        verdict.checks[f"selection {c.metric}"] = bool(c.passed)
    if metrics is not None:
        verdict.task = metrics.short().strip()


def judge_outputs(selection: tuple[np.ndarray, np.ndarray], screen: tuple[np.ndarray, np.ndarray] | None,
                  tolerance: Tolerance, gate: GateInfo, labels: np.ndarray | None = None) -> Verdict:
    """The verdict on a candidate's outputs: the gate's comparison on the selection samples, and the
    prediction of the gate's figures from both sets.

    Args:
        selection: (float reference, candidate) primary outputs on the held-out selection samples.
        screen: the same on the screened calibration samples (or None).
        tolerance: the gate's tolerance; ``gate``: what the gate will score; ``labels``: the selection's.
    """
    ref_sel, out_sel = selection
    ref = ref_sel.reshape(out_sel.shape) if ref_sel.size == out_sel.size else ref_sel
    sel = compare(ref, out_sel, tolerance, labels=labels)
    pred = predict((ref, out_sel), screen, gate.samples)
    checks = {"selection": bool(sel)}
    if tolerance.cosine_min is not None:
        checks["predicted cosine_min"] = pred.cosine_min >= tolerance.cosine_min
    if gate.labelled and tolerance.accuracy_drop is not None and pred.flip_rate_upper is not None:
        # the gate counts lost samples: the count it exceeds with probability FLIP_MISS must be allowed
        allowed = gate.allowed_lost(tolerance.accuracy_drop)
        checks["predicted accuracy_drop"] = gate.lost_quantile(pred.flip_rate_upper) <= allowed
    return Verdict(sel, pred, checks)
