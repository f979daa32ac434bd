"""The per-stage gate: run a stage's artifact on the golden inputs, compare, keep the result as data.

A :class:`StageResult` is what one stage did to the numbers; a :class:`ParityRun` is the ordered
list of them plus what was run (model, target, data). ``parity.json`` is ``ParityRun.to_dict()``
(pydantic, see :mod:`.data`); reports are rendered from that dict, so ``vitexport parity OUT_DIR``
re-renders them from the file, and ``ParityRun.from_dict`` reads it back.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Iterable, Mapping, Sequence

import numpy as np
from pydantic import Field, model_serializer, model_validator

from ..runners.base import BaseRunner
from ..errors import BadInput, ParityFailure, did_you_mean
from ..recipe import StageName, Tolerance
from .data import Data, TolerancePlain, result
from .layers import LayerReport, LayerResult
from .metrics import Check, Metrics, compare, error_histogram, sample_cosines
from .nonfinite import locate_nonfinite_source
from .reference import GoldenReference, vacuous_reason
from .tasks import TaskMetrics, task_checks

__all__ = ["StageResult", "ParityRun", "check_stage", "mark_vacuous", "SCHEMA_VERSION", "DEFAULT_REFERENCE"]

SCHEMA_VERSION = 1
DEFAULT_REFERENCE = "untouched torch model"

#: a pipeline stage's name, or any other label (``compare``); a known name loads as its StageName
StageLabel = Annotated[StageName | str, Field(union_mode="left_to_right")]


@result
class StageResult(Data):
    """One stage's parity outcome. ``bool(result)`` is ``passed``.

    Attributes:
        stage: the stage name (a :class:`StageName`, or a label such as ``compare``).
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
        layer_report: per-layer results (``--layers``); ``layers`` is its list, in network order.
        nonfinite_source: where the first NaN/Inf was produced (node or module), when located.
        histogram: the relative-error histogram (see :func:`~.metrics.error_histogram`).
        sample_cosines: each parity sample's cosine with the reference, in sample order (the
            report's cosine plot); None when not measured (NaN/Inf outputs, older files).
        details: stage-specific data for ``parity.json`` (a pass report, export facts...); must
            be JSON-serialisable.
        output_metrics: a model with several outputs: each output's metrics by name (``metrics``,
            the histogram and the sample cosines are the primary output's); its checks are named
            ``cosine_min[pred_boxes]``. None for a model with one output.
        task_metrics: the task's metrics against the reference (a detector's mAP, a segmenter's
            mIoU: :mod:`.tasks`); None for a classifier.

    In ``parity.json`` the layer report is split as before: ``layers`` (the list) and
    ``layer_summary`` (the rest); ``failed_metric`` is added for readers of the file.
    """

    stage: StageLabel
    engine: str
    reference: str = DEFAULT_REFERENCE
    passed: bool = True
    changed: int | None = None
    metrics: Metrics | None = None
    tolerance: TolerancePlain = field(default_factory=Tolerance)
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)
    first_divergence: str | None = None
    layer_report: LayerReport | None = None
    nonfinite_source: dict[str, Any] | None = None
    histogram: dict[str, Any] | None = None
    sample_cosines: list[float] | None = None
    parity_seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    output_metrics: dict[str, Metrics] | None = None
    task_metrics: TaskMetrics | None = None

    def __bool__(self) -> bool:
        return bool(self.passed)

    @property
    def layers(self) -> list[LayerResult] | None:
        """Per-layer results in network order (``--layers``), else None."""
        return self.layer_report.layers if self.layer_report is not None else None

    @property
    def failed_check(self) -> Check | None:
        """The first check that did not hold (what a ParityFailure names)."""
        return next((c for c in self.checks if not c.passed), None)

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

    def attach_layers(self, report: LayerReport) -> "StageResult":
        """Keep a per-layer report; its first divergence becomes the stage's (a located NaN/Inf
        source stays in ``nonfinite_source``)."""
        self.layer_report = report
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

    @model_serializer(mode="wrap")
    def _as_written(self, handler) -> dict[str, Any]:
        d = handler(self)
        report = d.pop("layer_report")
        if d.get("output_metrics") is None:
            d.pop("output_metrics", None)  # one output: the file reads as before several were gated
        if d.get("task_metrics") is None:
            d.pop("task_metrics", None)  # a classifier's file reads as before tasks were measured
        d["failed_metric"] = self.failed_metric
        d["layers"] = report.pop("layers") if report is not None else None
        if report is not None:
            d["layer_summary"] = report
        return d

    @model_validator(mode="before")
    @classmethod
    def _as_read(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data  # positional construction
        d = {k: v for k, v in data.items() if k not in ("failed_metric", "layers", "layer_summary")}
        if data.get("layers") is not None:
            d["layer_report"] = {**(data.get("layer_summary") or {}), "layers": data["layers"]}
        if not d.get("metrics"):
            d["metrics"] = None  # older files wrote {} for a stage without metrics
        tol = d.get("tolerance")
        if isinstance(tol, Mapping) and "top1_agreement" in tol and "top1_margin_z" not in tol:
            d["tolerance"] = {**tol, "top1_margin_z": 0.0}  # files before the margin gate gated every flip
        return d


@result
class ParityRun(Data):
    """All stages of one run, in order. ``bool(run)``: ``passed`` and every stage passed.

    ``passed`` may be set by the pipeline (a run can fail outside a stage); the verdict written to
    ``parity.json`` is ``passed and all(stage.passed)``, so appending a failed stage is enough.
    ``notes`` are run-level remarks, ``skipped`` the stages the recipe disabled, ``task`` what the
    outputs mean (the task metrics each stage reports), ``extra`` further
    top-level keys for ``parity.json`` (versions, timestamps...; unknown keys of a file land here).
    """

    passed: bool = True
    model: str = ""
    target: str = ""
    data: str = ""
    reference: str = DEFAULT_REFERENCE
    notes: list[str] = field(default_factory=list)
    skipped: list[StageLabel] = field(default_factory=list)
    #: what the outputs mean (``classify``, ``detect``...) and who said so; None: written before tasks
    task: str | None = None
    task_source: str | None = None
    stages: list[StageResult] = field(default_factory=list)
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

    def stage(self, name: StageName | str) -> StageResult | None:
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

    @model_serializer(mode="wrap")
    def _as_written(self, handler) -> dict[str, Any]:
        """The ``parity.json`` document: the fields, the verdict, where it failed, then ``extra``."""
        d = handler(self)
        extra = d.pop("extra")
        failed = self.failed_stage
        out = {"schema_version": SCHEMA_VERSION, **d, "passed": self.verdict,
               "failed_stage": str(failed.stage) if failed is not None else None,
               "failed_metric": failed.failed_metric if failed is not None else None,
               "first_divergence": failed.first_divergence if failed is not None else None}
        for k, v in extra.items():
            out.setdefault(k, v)
        return out

    @model_validator(mode="before")
    @classmethod
    def _as_read(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        known = {f.name for f in dataclasses.fields(cls)}
        derived = {"schema_version", "failed_stage", "failed_metric", "first_divergence"}
        d = {k: v for k, v in data.items() if k in known}
        d["extra"] = {**(data.get("extra") or {}), **{k: v for k, v in data.items() if k not in known | derived}}
        return d


def _run(runner: BaseRunner, feeds: Iterable[Mapping[str, np.ndarray]], names: Sequence[str]
         ) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]], list[str]]:
    """The runner's outputs named as the reference's, samples stacked; per batch; the names it lacks.
    A runner names a single output ``output`` whatever the graph calls it."""
    was_active = runner.is_active
    runner.activate()
    try:
        per_batch = [dict(out) for out in runner.infer_many(list(feeds))]
    finally:
        if not was_active:
            runner.deactivate()
    if len(names) == 1 and per_batch and names[0] not in per_batch[0]:
        per_batch = [{names[0]: next(iter(o.values()))} for o in per_batch]
    missing = [n for n in names if not per_batch or n not in per_batch[0]]
    outs = {n: np.concatenate([np.asarray(o[n]) for o in per_batch], axis=0) for n in names if n not in missing}
    return outs, per_batch, missing


def _mismatch_metrics() -> Metrics:
    return Metrics(math.inf, math.inf, math.inf, -1.0, -1.0, -math.inf)


def _output_tolerance(tolerance: Tolerance, name: str, classifies: bool) -> Tolerance:
    """Top-1 and accuracy gate the classification output only; distances gate every output (with the
    output's own ``parity.<stage>.outputs.<name>`` entry, when the recipe has one)."""
    tolerance = tolerance.for_output(name)
    return tolerance if classifies else tolerance.model_copy(update={"top1_agreement": None, "accuracy_drop": None})


def _unknown_outputs(tolerance: Tolerance, reference: GoldenReference) -> None:
    """A per-output gate must name an output the model has (a typo would gate nothing)."""
    for name in tolerance.outputs or {}:
        if name not in reference.outputs:
            raise BadInput(f"parity tolerance outputs.{name}: the model has no output '{name}'"
                           f"{did_you_mean(name, list(reference.outputs))}; its outputs are {', '.join(reference.outputs)}")


def _classifier(reference: GoldenReference) -> str | None:
    """The output top-1 and accuracy apply to: ``logits``, else the primary output when it is 2-D."""
    name = reference.primary
    return name if name == "logits" or reference.outputs[name].ndim == 2 else None


def _image_input(reference: GoldenReference) -> np.ndarray | None:
    """The parity samples' image input [N, C, H, W] (the first 4-D float input), for the task picture."""
    for name in reference.input_names:
        if reference.feeds[0][name].ndim == 4 and np.issubdtype(reference.feeds[0][name].dtype, np.floating):
            return np.concatenate([f[name] for f in reference.feeds])
    return None


def _compare_outputs(result: StageResult, reference: GoldenReference, outs: dict[str, np.ndarray],
                     missing: list[str], tolerance: Tolerance, unmasked) -> None:
    """Gate every output; with several, each check is named after its output (``cosine_min[pred_boxes]``)."""
    several, primary, cls = len(reference.outputs) > 1, reference.primary, _classifier(reference)
    per: dict[str, Metrics] = {}
    for name, ref in reference.outputs.items():
        tag = f"[{name}]" if several else ""
        out = outs.get(name)
        if name in missing or out is None or out.shape != ref.shape:
            per[name] = _mismatch_metrics()
            result.checks.append(Check(f"output_shape{tag}", 0.0, 1.0, ">=", False))
            result.notes.append(f"output '{name}' missing from {result.engine}'s outputs" if out is None else
                                f"output {'' if not several else repr(name) + ' '}shape {tuple(out.shape)} differs "
                                f"from the reference's {tuple(ref.shape)}")
            continue
        mask = unmasked.get(name) if isinstance(unmasked, Mapping) else (unmasked if name == primary else None)
        cmp = compare(ref, out, _output_tolerance(tolerance, name, name == cls or not several),
                      labels=reference.class_labels if name == cls or not several else None, unmasked=mask)
        per[name] = cmp.metrics
        result.checks.extend(Check(f"{c.metric}{tag}", c.value, c.limit, c.op, c.passed) for c in cmp.checks)
        if name == primary:
            result.histogram = error_histogram(ref, out, cmp.metrics.ref_scale)
            result.sample_cosines = sample_cosines(ref, out)
    result.metrics = per[primary]
    result.output_metrics = per if several else None
    result.task_metrics, checks, notes = task_checks(reference.meta.get("task"), reference.outputs, outs, tolerance,
                                                     _image_input(reference), reference.meta.get("detect_scores", "softmax"),
                                                     reference.task_labels, explain=True)
    result.checks.extend(checks)
    result.notes.extend(notes)
    result.passed = all(c.passed for c in result.checks)


def check_stage(
    stage: str,
    runner: BaseRunner,
    reference: GoldenReference,
    tolerance: Tolerance,
    *,
    changed: int | None = None,
    seconds: float = 0.0,
    notes: Sequence[str] = (),
    unmasked: np.ndarray | Mapping[str, np.ndarray] | None = None,
    artifacts: Mapping[str, str | Path] | None = None,
    locate_nonfinite: bool = True,
) -> StageResult:
    """Run ``runner`` on the golden inputs and gate each of its outputs with ``tolerance``.

    A model with several outputs has each gated: cosine and max_abs on every output, top-1 and
    accuracy on the classification output only (``logits``, else a 2-D primary output); its checks
    are named after the output (``cosine_min[pred_boxes]``) and the stage passes only when all hold.
    The task the reference names (``reference.meta["task"]``) adds its metrics and gates
    (:func:`~.tasks.task_checks`: ``map[logits,pred_boxes]``, ``miou``...).

    Args:
        stage: the stage name (a recipe stage, or any label).
        runner: the stage's artifact behind the runner interface (activated here if it is not).
        reference: the golden reference (its feeds are the inputs, its outputs the truth).
        tolerance: the stage's contract from the recipe.
        changed: sites the pass rewrote (pass stages).
        seconds: how long the stage itself took.
        notes: free text kept in the report.
        unmasked: boolean array of the primary output's shape (or output name → array) marking
            positions that must match exactly (``Tolerance.exact_unmasked``, the ``mask_to_where`` contract).
        artifacts: files the stage wrote (name → path).
        locate_nonfinite: when an output holds NaN/Inf, find the first op/module producing it.
    Returns:
        The :class:`StageResult` (never raises on a parity failure; ``.failure()`` is the error to raise).
    Raises:
        BadInput: ``tolerance.outputs`` names an output the model does not have.
    """
    t0 = time.perf_counter()
    _unknown_outputs(tolerance, reference)
    outs, per_batch, missing = _run(runner, reference.feeds, list(reference.outputs))
    result = StageResult(stage=stage, engine=runner.engine, changed=changed, tolerance=tolerance,
                         seconds=float(seconds), notes=list(notes),
                         artifacts={k: str(v) for k, v in (artifacts or {}).items()})
    result.reference = str(reference.meta.get("label", DEFAULT_REFERENCE))
    _compare_outputs(result, reference, outs, missing, tolerance, unmasked)
    if locate_nonfinite and any(m.nonfinite for m in (result.output_metrics or {"": result.metrics}).values()):
        _locate(result, runner, reference, per_batch)
    result.parity_seconds = time.perf_counter() - t0
    return result


def _locate(result: StageResult, runner: BaseRunner, reference: GoldenReference,
            per_batch: list[dict[str, np.ndarray]]) -> None:
    b = next(i for i, o in enumerate(per_batch) if not all(np.isfinite(v).all() for v in o.values()))
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


def mark_vacuous(reference: GoldenReference, run: ParityRun) -> str | None:
    """Mark a run whose reference is constant: every stage would match it trivially. A loud note
    goes into the report and ``parity.json`` gets ``"vacuous_gate": reason``.

    Returns:
        The reason, or None when the reference is informative.
    """
    reason = vacuous_reason(reference)
    if reason is not None:
        run.extra["vacuous_gate"] = reason
        run.notes.insert(0, f"WARNING: the parity gate is vacuous: {reason}; every stage matches such a reference "
                            "whatever it computes")
    return reason
