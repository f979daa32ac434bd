"""The per-stage gate: run a stage's artifact on the golden inputs, compare, keep the result as data.

A :class:`StageResult` is what one stage did to the numbers; a :class:`ParityRun` is the ordered
list of them plus what was run (model, target, data). ``parity.json`` is ``ParityRun.to_dict()``;
reports are rendered from that dict, so ``vitexport parity OUT_DIR`` re-renders them from the file.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..engines.base import BaseRunner
from ..errors import ParityFailure
from ..recipe import Tolerance
from .layers import LayerReport, LayerResult
from .metrics import Check, Metrics, compare, error_histogram
from .reference import GoldenReference

__all__ = ["StageResult", "ParityRun", "check_stage", "SCHEMA_VERSION", "DEFAULT_REFERENCE"]

SCHEMA_VERSION = 1
DEFAULT_REFERENCE = "untouched torch model"


def _float_or_none(v: Any) -> float | None:
    return None if v is None else float(v)


@dataclass
class StageResult:
    """One stage's parity outcome. ``bool(result)`` is ``passed``.

    Attributes:
        stage: the stage name (``export_onnx``, ``quantize_int8``, ``compare``...).
        engine: what ran the stage's artifact (``torch``, ``onnxruntime``, ``tensorrt``...).
        reference: what it was compared with.
        passed: every check held.
        changed: sites a pass rewrote (None for non-pass stages).
        metrics: the output metrics.
        tolerance: the stage's contract.
        checks: the gated metrics with their limits.
        seconds: the stage's own time (given by the caller); ``parity_seconds``: time of the check.
        notes: free text for a reader.
        artifacts: name → path of files the stage wrote.
        first_divergence: the first layer outside the budget (per-layer run), else the source of a
            NaN/Inf when one was located.
        layers: per-layer results (``--layers``), in network order.
        layer_report: the full :class:`LayerReport` behind ``layers``.
        nonfinite_source: where the first NaN/Inf was produced (node or module), when located.
        histogram: the relative-error histogram (see :func:`~.metrics.error_histogram`).
        details: stage-specific data for ``parity.json`` (a pass report, export facts...); must
            be JSON-serialisable.
    """

    stage: str
    engine: str
    reference: str = DEFAULT_REFERENCE
    passed: bool = True
    changed: int | None = None
    metrics: Metrics | None = None
    tolerance: Tolerance = field(default_factory=Tolerance)
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)
    first_divergence: str | None = None
    layers: list[LayerResult] | None = None
    layer_report: LayerReport | None = None
    nonfinite_source: dict[str, Any] | None = None
    histogram: dict[str, Any] | None = None
    parity_seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.passed)

    @property
    def failed_check(self) -> Check | None:
        """The first check that did not hold (what a ParityFailure names)."""
        return next((c for c in self.checks if not c.passed), None)

    first_failure = failed_check

    @property
    def failed_metric(self) -> str | None:
        c = self.failed_check
        return c.metric if c is not None else None

    def failure(self) -> ParityFailure | None:
        """The :class:`ParityFailure` to raise (exit code 1) when the stage failed, else None."""
        if self.passed:
            return None
        c = self.failed_check
        if c is None:
            return ParityFailure(self.stage, "passed", 0.0, 1.0, ">=")
        return ParityFailure(self.stage, c.metric, c.value, c.limit, c.op)

    def raise_if_failed(self) -> "StageResult":
        err = self.failure()
        if err is not None:
            raise err
        return self

    def attach_layers(self, report: LayerReport) -> "StageResult":
        """Keep a per-layer report; its first divergence becomes the stage's (a located NaN/Inf
        source stays in ``nonfinite_source``)."""
        self.layer_report = report
        self.layers = list(report.layers)
        if report.first_divergence is not None:
            self.first_divergence = report.first_divergence
        self.notes.extend(f"layers: {n}" for n in report.notes)
        return self

    def summary(self) -> str:
        """One line: ``export_onnx: FAIL max_abs/ref_scale=0.3 (must be <= 0.0001), first divergence blocks.2``."""
        s = f"{self.stage}: {'PASS' if self.passed else 'FAIL'}"
        c = self.failed_check
        if c is not None:
            s += f" {c}"
        if self.first_divergence:
            s += f", first divergence {self.first_divergence}"
        return s

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "stage": self.stage,
            "engine": self.engine,
            "reference": self.reference,
            "passed": bool(self.passed),
            "changed": None if self.changed is None else int(self.changed),
            "metrics": self.metrics.to_dict() if self.metrics is not None else {},
            "tolerance": self.tolerance.model_dump(exclude_none=True, mode="json"),
            "checks": [c.to_dict() for c in self.checks],
            "failed_metric": self.failed_metric,
            "seconds": float(self.seconds),
            "parity_seconds": float(self.parity_seconds),
            "notes": list(self.notes),
            "artifacts": {k: str(v) for k, v in self.artifacts.items()},
            "first_divergence": self.first_divergence,
            "nonfinite_source": self.nonfinite_source,
            "histogram": self.histogram,
            "details": dict(self.details),
        }
        if self.layer_report is not None:
            lr = self.layer_report.to_dict()
            d["layers"] = lr.pop("layers")
            d["layer_summary"] = lr
        elif self.layers is not None:
            d["layers"] = [r.to_dict() for r in self.layers]
        else:
            d["layers"] = None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StageResult":
        layers = d.get("layers")
        layer_report = None
        layer_list = None
        if layers is not None:
            layer_list = [LayerResult.from_dict(x) for x in layers]
            summary = dict(d.get("layer_summary") or {})
            layer_report = LayerReport.from_dict({**summary, "layers": layers})
            layer_list = layer_report.layers
        metrics = d.get("metrics")
        return cls(
            stage=str(d["stage"]),
            engine=str(d.get("engine", "")),
            reference=str(d.get("reference", DEFAULT_REFERENCE)),
            passed=bool(d.get("passed", True)),
            changed=None if d.get("changed") is None else int(d["changed"]),
            metrics=Metrics.from_dict(metrics) if metrics else None,
            tolerance=Tolerance.model_validate(d.get("tolerance") or {}),
            checks=[Check.from_dict(c) for c in d.get("checks", [])],
            seconds=float(d.get("seconds", 0.0)),
            notes=list(d.get("notes", [])),
            artifacts=dict(d.get("artifacts", {})),
            first_divergence=d.get("first_divergence"),
            layers=layer_list,
            layer_report=layer_report,
            nonfinite_source=d.get("nonfinite_source"),
            histogram=d.get("histogram"),
            parity_seconds=float(d.get("parity_seconds", 0.0)),
            details=dict(d.get("details") or {}),
        )


@dataclass
class ParityRun:
    """All stages of one run, in order. ``bool(run)``: ``passed`` and every stage passed.

    ``passed`` may be set by the pipeline (a run can fail outside a stage); the verdict written to
    ``parity.json`` is ``passed and all(stage.passed)``, so appending a failed stage is enough.
    ``notes`` are run-level remarks, ``skipped`` the stages the recipe disabled, ``extra`` further
    top-level keys for ``parity.json`` (versions, timestamps...).
    """

    model: str = ""
    target: str = ""
    data: str = ""
    stages: list[StageResult] = field(default_factory=list)
    passed: bool = True
    reference: str = DEFAULT_REFERENCE
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> bool:
        return bool(self.passed) and all(s.passed for s in self.stages)

    def __bool__(self) -> bool:
        return self.verdict

    def add(self, result: StageResult) -> StageResult:
        """Append a stage result (a failed one makes the run fail)."""
        self.stages.append(result)
        if not result.passed:
            self.passed = False
        return result

    @property
    def failed_stage(self) -> StageResult | None:
        """The first stage that failed (the one the pipeline stopped at)."""
        return next((s for s in self.stages if not s.passed), None)

    def failure(self) -> ParityFailure | None:
        s = self.failed_stage
        return s.failure() if s is not None else None

    def raise_for_failure(self) -> None:
        err = self.failure()
        if err is not None:
            raise err

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.stage == name), None)

    def summary(self) -> str:
        """One line per stage, then the verdict (what the CLI prints)."""
        lines = [s.summary() for s in self.stages]
        failed = self.failed_stage
        if self.verdict:
            lines.append(f"parity: PASS ({len(self.stages)} stage(s))")
        elif failed is not None:
            lines.append(f"parity: FAIL at stage '{failed.stage}'"
                         + (f" ({failed.failed_metric})" if failed.failed_metric else "")
                         + (f", first divergence {failed.first_divergence}" if failed.first_divergence else ""))
        else:
            lines.append("parity: FAIL")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The ``parity.json`` document."""
        failed = self.failed_stage
        d: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "passed": self.verdict,
            "model": self.model,
            "target": self.target,
            "data": self.data,
            "reference": self.reference,
            "failed_stage": failed.stage if failed is not None else None,
            "failed_metric": failed.failed_metric if failed is not None else None,
            "first_divergence": failed.first_divergence if failed is not None else None,
            "notes": list(self.notes),
            "skipped": list(self.skipped),
            "stages": [s.to_dict() for s in self.stages],
        }
        for k, v in self.extra.items():
            d.setdefault(k, v)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ParityRun":
        known = {"schema_version", "passed", "model", "target", "data", "reference", "failed_stage",
                 "failed_metric", "first_divergence", "stages", "notes", "skipped"}
        return cls(
            model=str(d.get("model", "")),
            target=str(d.get("target", "")),
            data=str(d.get("data", "")),
            stages=[StageResult.from_dict(s) for s in d.get("stages", [])],
            passed=bool(d.get("passed", True)),
            reference=str(d.get("reference", DEFAULT_REFERENCE)),
            notes=list(d.get("notes", [])),
            skipped=list(d.get("skipped", [])),
            extra={k: v for k, v in d.items() if k not in known},
        )


def _primary(outputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """``'output'``, else the first output: runners name a single output ``'output'``; a graph with
    several keeps their names, and the exporter writes the model's primary output first."""
    if "output" in outputs:
        return outputs["output"]
    return next(iter(outputs.values()))


def _run(runner: BaseRunner, feeds: Iterable[Mapping[str, np.ndarray]]) -> tuple[np.ndarray, list[np.ndarray]]:
    was_active = runner.is_active
    runner.activate()
    try:
        per_batch = [np.asarray(_primary(out)) for out in runner.infer_many(list(feeds))]
    finally:
        if not was_active:
            runner.deactivate()
    return np.concatenate(per_batch, axis=0), per_batch


def _mismatch_metrics() -> Metrics:
    return Metrics(math.inf, math.inf, math.inf, -1.0, -1.0, -math.inf)


def check_stage(
    stage: str,
    runner: BaseRunner,
    reference: GoldenReference,
    tolerance: Tolerance,
    *,
    changed: int | None = None,
    seconds: float = 0.0,
    notes: Sequence[str] = (),
    unmasked: np.ndarray | None = None,
    artifacts: Mapping[str, str | Path] | None = None,
    locate_nonfinite: bool = True,
) -> StageResult:
    """Run ``runner`` on the golden inputs and gate its output with ``tolerance``.

    Args:
        stage: the stage name (a recipe stage, or any label).
        runner: the stage's artifact behind the runner interface (activated here if it is not).
        reference: the golden reference (its feeds are the inputs, its outputs the truth).
        tolerance: the stage's contract from the recipe.
        changed: sites the pass rewrote (pass stages).
        seconds: how long the stage itself took.
        notes: free text kept in the report.
        unmasked: boolean array of the output's shape marking positions that must match exactly
            (``Tolerance.exact_unmasked``, the ``mask_to_where`` contract).
        artifacts: files the stage wrote (name → path).
        locate_nonfinite: when the output holds NaN/Inf, find the first op/module producing it.
    Returns:
        The :class:`StageResult` (never raises on a parity failure; call ``.raise_if_failed()``).
    """
    t0 = time.perf_counter()
    ref = reference.output
    out, per_batch = _run(runner, reference.feeds)
    result = StageResult(stage=stage, engine=runner.engine, changed=changed, tolerance=tolerance,
                         seconds=float(seconds), notes=list(notes),
                         artifacts={k: str(v) for k, v in (artifacts or {}).items()})
    result.reference = str(reference.meta.get("label", DEFAULT_REFERENCE))
    if out.shape != ref.shape:
        result.metrics = _mismatch_metrics()
        result.checks = [Check("output_shape", 0.0, 1.0, ">=", False)]
        result.notes.append(f"output shape {tuple(out.shape)} differs from the reference's {tuple(ref.shape)}")
        result.passed = False
        result.parity_seconds = time.perf_counter() - t0
        return result
    cmp = compare(ref, out, tolerance, labels=reference.labels, unmasked=unmasked)
    result.metrics, result.checks, result.passed = cmp.metrics, list(cmp.checks), bool(cmp)
    result.histogram = error_histogram(ref, out, cmp.metrics.ref_scale)
    if cmp.metrics.nonfinite and locate_nonfinite:
        _locate(result, runner, reference, per_batch)
    result.parity_seconds = time.perf_counter() - t0
    return result


def _locate(result: StageResult, runner: BaseRunner, reference: GoldenReference, per_batch: list[np.ndarray]) -> None:
    from .nonfinite import locate_nonfinite_source

    b = next(i for i, o in enumerate(per_batch) if not np.isfinite(o).all())
    try:
        src = locate_nonfinite_source(runner, reference.feeds[b])
    except Exception as exc:  # a diagnostic must not hide the gate's verdict
        result.notes.append(f"could not locate the first NaN/Inf: {type(exc).__name__}: {exc}")
        return
    if src is None:
        result.notes.append(f"{runner.engine} outputs NaN/Inf; this engine cannot be inspected for the source")
        return
    result.nonfinite_source = src.to_dict()
    result.first_divergence = src.node
    result.notes.append(f"first NaN/Inf produced by {src}")
