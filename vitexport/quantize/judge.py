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

import numpy as np
import onnx_ir as ir

from ..calibration.feeds import FeedSet
from ..runners.sessions import LOW_MEMORY, Session, SessionConfig
from ..parity.metrics import CompareResult, compare
from ..recipe import Tolerance
from .tail import GateInfo, Prediction, predict

__all__ = ["Verdict", "Judge", "run_outputs", "primary_index"]


def primary_index(names: list[str]) -> int:
    """Which of a graph's outputs the judge reads: ``logits`` among several, else the first (the
    gate checks every output; the fallback steers by this one)."""
    return names.index("logits") if "logits" in names else 0


def run_outputs(model: ir.Model, feeds: FeedSet, config: SessionConfig = LOW_MEMORY) -> np.ndarray:
    """The model's primary output (:func:`primary_index`) over ``feeds`` (padding trimmed), float32."""
    sess = Session(model, config)
    i = primary_index(sess.output_names)
    out = [sess.run(None, f)[i] for f in feeds]
    del sess
    return feeds.trim(np.concatenate(out, axis=0)).astype(np.float32)


@dataclass
class Verdict:
    """A candidate's figures: ``selection`` (the gate's comparison on the held-out samples), the
    prediction of the gate's figures, and which requirement each check stands for."""

    selection: CompareResult
    prediction: Prediction
    checks: dict[str, bool] = field(default_factory=dict)

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
                              "checks": [c.to_dict() for c in self.selection.checks]}}


class Judge:
    """Judges Q/DQ models on fixed samples against the float model's outputs.

    Args:
        model: the float model (the smoothed one: the same function).
        select: held-out selection feeds; ``screen``: calibration feeds (may be empty).
        tolerance: the gate's tolerance; ``gate``: what the gate will score.
        config: the target's arithmetic.
    """

    def __init__(self, model: ir.Model, select: FeedSet, screen: FeedSet | None, tolerance: Tolerance, gate: GateInfo,
                 config: SessionConfig):
        self.select, self.screen, self.tol, self.gate, self.config = select, screen, tolerance, gate, config
        self.ref_sel = run_outputs(model, select, LOW_MEMORY)
        self.ref_scr = run_outputs(model, screen, LOW_MEMORY) if screen is not None and len(screen) else None
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
        out_sel = self.select.trim(np.concatenate([sess.run(None, f)[i] for f in self.select])).astype(np.float32)
        out_scr = None
        if self.ref_scr is not None:
            out_scr = self.screen.trim(np.concatenate([sess.run(None, f)[i] for f in self.screen])).astype(np.float32)
        del sess
        ref = self.ref_sel.reshape(out_sel.shape) if self.ref_sel.size == out_sel.size else self.ref_sel
        sel = compare(ref, out_sel, self.tol, labels=self.select.labels)
        pred = predict((ref, out_sel), None if out_scr is None else (self.ref_scr.reshape(out_scr.shape), out_scr),
                       self.gate.samples)
        checks = {"selection": bool(sel)}
        if self.tol.cosine_min is not None:
            checks["predicted cosine_min"] = pred.cosine_min >= self.tol.cosine_min
        if self.gate.labelled and self.tol.accuracy_drop is not None and pred.flip_rate_upper is not None:
            # the gate counts lost samples: the count it exceeds with probability FLIP_MISS must be allowed
            allowed = self.gate.allowed_lost(self.tol.accuracy_drop)
            checks["predicted accuracy_drop"] = self.gate.lost_quantile(pred.flip_rate_upper) <= allowed
        return Verdict(sel, pred, checks)
