"""Where the quantize stage's time goes: seconds and full-model ONNX Runtime runs per step.

One :class:`QuantProfile` lives for one ``quantize_int8`` call; each piece of work runs inside
``with profile.step(name):`` and every ``session.run`` over the whole model is counted with
:meth:`QuantProfile.ran` (one call per run, with the samples that run carried: the static-batch
models vitexport exports run one sample per call, a dynamic batch several). Steps nest — a
conversion inside a fallback probe — and each step's seconds are its own, nested steps excluded,
so the steps add up to the stage's time. The runs on one-node models the sensitivity ranking makes
are not full-model runs and are not counted.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass
from typing import Iterator

__all__ = ["STEPS", "StepCost", "QuantProfile"]

#: the steps in the order the stage runs them (what each one is, for the report)
STEPS: dict[str, str] = {
    "calibration": "passes over the calibration data feeding the observers (statistics, ranges, float16 ranges)",
    "smoothing_search": "smoothing strength per site on sampled rows, folded into the graph",
    "range_search": "clipping range per tensor, bias correction and weight rounding on sampled rows",
    "reference": "the float model's outputs on the samples the judge scores",
    "parity": "the judge's verdict on the full INT8 model (held-out and screened samples)",
    "fallback_probes": "attn·V and dominant-node probes, sensitivity ranking, the fallback's candidates",
    "conversion": "Q/DQ conversion (and float16 islands) of every model built",
    "write": "validation and writing the files",
    "latency": "timing FP32 against INT8",
}


@dataclass
class StepCost:
    """One step's cost: ``seconds`` (its own, nested steps excluded), ``runs`` (full-model
    ``session.run`` calls), ``samples`` (samples through those runs), ``calls`` (times entered)."""

    seconds: float = 0.0
    runs: int = 0
    samples: int = 0
    calls: int = 0


class QuantProfile:
    """Seconds and full-model ONNX Runtime runs per step of the quantize stage."""

    def __init__(self) -> None:
        self.steps: dict[str, StepCost] = {}
        self._stack: list[list] = []  # [name, start, seconds spent in nested steps]

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[StepCost]:
        """Time the block as ``name`` (its nested steps' seconds go to them, not to it)."""
        cost = self.steps.setdefault(name, StepCost())
        cost.calls += 1
        frame = [name, time.perf_counter(), 0.0]
        self._stack.append(frame)
        try:
            yield cost
        finally:
            self._stack.pop()
            elapsed = time.perf_counter() - frame[1]
            cost.seconds += elapsed - frame[2]
            if self._stack:
                self._stack[-1][2] += elapsed

    def ran(self, samples: int = 1) -> None:
        """One full-model run of ``samples`` samples, counted to the innermost open step."""
        cost = self.steps.setdefault(self._stack[-1][0] if self._stack else "other", StepCost())
        cost.runs += 1
        cost.samples += samples

    @property
    def seconds(self) -> float:
        return sum(c.seconds for c in self.steps.values())

    @property
    def runs(self) -> int:
        return sum(c.runs for c in self.steps.values())

    def to_dict(self) -> dict:
        """``{"steps": {name: {seconds, runs, samples, calls}}, "seconds", "runs", "samples", "unit"}``."""
        order = [s for s in STEPS if s in self.steps] + [s for s in self.steps if s not in STEPS]
        return {"steps": {s: {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self.steps[s]).items()}
                          for s in order},
                "seconds": round(self.seconds, 3), "runs": self.runs,
                "samples": sum(c.samples for c in self.steps.values()),
                "unit": "runs: full-model ONNX Runtime session.run calls (one per batch); samples: the samples they carried"}

    def lines(self) -> list[str]:
        """A small text table, one step a line (the ``-v`` log)."""
        out = [f"{'step':<17}{'seconds':>9}{'runs':>7}{'samples':>9}"]
        d = self.to_dict()
        for name, c in d["steps"].items():
            out.append(f"{name:<17}{c['seconds']:>9.2f}{c['runs']:>7}{c['samples']:>9}")
        out.append(f"{'total':<17}{d['seconds']:>9.2f}{d['runs']:>7}{d['samples']:>9}")
        return out
