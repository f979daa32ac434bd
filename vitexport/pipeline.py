"""The one loop over the stages (:mod:`vitexport.stages`), each gated by parity against one golden
reference.

model source → reparameterize → freeze_layernorm → mask_to_where → fuse_qkv → export_onnx → simplify →
quantize_int8 → what the target contributes (orin: build_engine, where TensorRT and a GPU exist;
rk3588: build_engine → model.rknn, simulate on RKNN's simulator; openvino: build_engine → its IR).

The loop alone owns timing, peak memory, parity gating, failure and resume. Every artifact is
written atomically. After each stage the run's state (stage → content key, artifact hashes, parity
result) is saved, so a run that was killed resumes from the last finished stage: a stage whose key
(a hash of everything it consumes) and artifacts are unchanged is not run again; its line says
``resumed from OUT (took 4.20 s on 2026-12-05 17:20 UTC)``, and it is gated again when this run's
tolerance is not the recorded one.

A failed gate leaves nothing that looks shippable: the failed stage's artifacts, and those later
stages left in OUT from an earlier run, are moved into ``OUT/rejected/`` (with a README saying why);
the manifest says ``"status": "rejected"`` with the gate, its value and its threshold. A re-run into
the same folder resumes from ``rejected/`` (moving the files back to be judged again), and a run
that passes removes it. A long stage says every 10 s that it is still running
(:class:`~vitexport.progress.Heartbeat`).
"""
from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import platform
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import onnx
import onnxruntime
import torch

from . import __version__
from .calibration import SampleSet
from .calibration.sanity import DataCheck, check_data
from .errors import ParityFailure
from .io import atomic_write_json, display_path, sha256_file
from .memory import PeakMeter, process_peak_bytes, resident_bytes
from .parity import GoldenReference, ParityRun, StageResult, capture_reference, check_stage, write_reports
from .parity.advice import failure_advice
from .parity.share import gate_int8_share
from .parity.stage import mark_vacuous
from .parity.tasks import check_label_maps
from .progress import Heartbeat
from .recipe import PASS_STAGES, STAGE_NAMES, Recipe, StageName
from .runners import TorchRunner, feed_size
from .sources import LoadedModel
from .stages import RunContext, RunTarget, Stage, StageOutput, StageSkipped, content_key, module_hash, pipeline_stages, trim_memory

_log = logging.getLogger("vitexport.pipeline")

__all__ = ["Artifacts", "run_pipeline", "PASS_STAGES", "STAGE_NAMES", "STATE_FILE", "REJECTED_DIR"]

STATE_FILE = ".vitexport-state.json"
#: where a failed gate's artifacts (and any later stage's, from an earlier run) are moved: a folder
#: rather than renamed files, so that a model's external ``.data`` file and ``build_engine.sh``'s
#: relative paths still work for whoever inspects them, and OUT's top level holds only what passed
REJECTED_DIR = "rejected"


@dataclass
class Artifacts:
    """What a run produced: the output folder, its files by name, the parity run, and the verdict."""

    out_dir: Path
    files: dict[str, Path] = field(default_factory=dict)
    parity: ParityRun | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)
    #: peak resident memory of each stage (its work and its parity check), and of the golden
    #: reference capture under ``"reference"``; see :mod:`vitexport.memory`
    stage_peak_bytes: dict[str, int] = field(default_factory=dict)
    resumed: list[StageName] = field(default_factory=list)
    #: when each resumed stage's recorded run finished (UTC, ISO 8601; "" when the record is older)
    resumed_from: dict[StageName, str] = field(default_factory=dict)
    #: the model's outputs, name → shape at the export batch (``{'output': [1, 1000]}`` for one)
    outputs: dict[str, list[int]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.parity and self.parity.passed)


def _count(labels: np.ndarray | None) -> int | None:
    return None if labels is None else len(labels)


def _unmasked(reference: GoldenReference) -> dict[str, np.ndarray] | None:
    """Per output, the positions that belong to real tokens (a text encoder's ``attention_mask == 1``):
    outputs laid out by token (``last_hidden_state``), not pooled ones."""
    masks = [np.concatenate([f[k] for f in reference.feeds]) for k in reference.feeds[0] if "mask" in k]
    if not masks:
        return None
    m = masks[0].astype(bool)
    several = len(reference.outputs) > 1  # then a pooled [N, H] output whose H happens to be L is no token output
    found = {name: np.broadcast_to(m.reshape(m.shape + (1,) * (out.ndim - m.ndim)), out.shape)
             for name, out in reference.outputs.items()
             if out.shape[: m.ndim] == m.shape and (out.ndim > m.ndim or not several)}
    return found or None


@dataclass
class _Found:
    """A stage's record that still matches: its result, its files, and when it ran."""

    result: StageResult
    files: dict[str, Path]
    finished: str | None


class _State:
    """The resume record: stage name → {key, artifacts {name: sha256}, result, finished (UTC, ISO)}."""

    def __init__(self, out_dir: Path, load: bool = True):
        self.out_dir = out_dir
        self.path = out_dir / STATE_FILE
        earlier: dict = {}
        if self.path.is_file():
            try:
                earlier = json.loads(self.path.read_text())
            except (OSError, json.JSONDecodeError):
                earlier = {}  # a damaged record only costs a full run
        self.data: dict = earlier if load else {}
        #: the record as this run found it, even with resume off: which files an earlier run's later stages left
        self.earlier: dict = earlier

    def lookup(self, stage: str, key: str | None) -> _Found | None:
        """The recorded result and files of ``stage`` when its key and every artifact still match.
        Artifacts an earlier failed run set aside in ``rejected/`` count, and are moved back: the
        loop gates them again with this run's tolerance."""
        rec = self.data.get(stage)
        if key is None or not rec or rec.get("key") != key:
            return None
        found = {name: self._find(name, digest) for name, digest in rec.get("artifacts", {}).items()}
        if any(p is None for p in found.values()):
            return None
        try:
            res = StageResult.from_dict(rec["result"])
        except (ValueError, KeyError, TypeError):
            return None  # written by another version: run the stage again
        files = {name: self.out_dir / name for name in found}
        for name, path in found.items():
            if path != files[name]:
                os.replace(path, files[name])  # un-rejected: this run judges it again
        return _Found(res, files, rec.get("finished"))

    def _find(self, name: str, digest: str) -> Path | None:
        for path in (self.out_dir / name, self.out_dir / REJECTED_DIR / name):
            if path.is_file() and sha256_file(path) == digest:
                return path
        return None

    def artifacts(self, stage: str) -> list[str]:
        """The names of the files recorded for ``stage`` by this run or, failing that, an earlier one."""
        rec = self.data.get(stage) or self.earlier.get(stage) or {}
        return list(rec.get("artifacts", {})) if isinstance(rec, dict) else []

    def record(self, stage: str, key: str, files: dict[str, Path], result: StageResult,
               finished: str | None = None) -> None:
        self.data[stage] = {"key": key, "artifacts": {n: sha256_file(p) for n, p in files.items()},
                            "result": result.to_dict(), "finished": finished or _now()}
        atomic_write_json(self.path, self.data)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _when(finished: str | None) -> str:
    """A record's finishing time as the terminal shows it (``2026-12-05 17:20 UTC``)."""
    try:
        return datetime.fromisoformat(finished).strftime("%Y-%m-%d %H:%M UTC") if finished else "an earlier run"
    except ValueError:
        return "an earlier run"


def run_pipeline(
    model: LoadedModel,
    target: RunTarget,
    out_dir: Path,
    *,
    calib: SampleSet,
    parity_data: SampleSet,
    data_note: str = "",
    layers: bool = False,
    resume: bool = True,
    keep_source: bool = True,
    log: Callable[[str], None] = lambda s: None,
    stages: Sequence[Stage] | None = None,
    heartbeat: Heartbeat | None = None,
) -> Artifacts:
    """Run every enabled stage, gate each with parity, write reports and the manifest.

    Args:
        model: the loaded model (untouched unless ``keep_source`` is False; the passes work on a copy).
        target: the run's target (:func:`vitexport.targets.build_target`), its recipe validated.
        out_dir: the output folder (created).
        calib, parity_data: calibration samples; parity samples (labels optional), cut to the export batch.
        data_note: said in the report (e.g. "synthetic inputs: no data given").
        layers: add per-layer localisation to the quantized stage.
        resume: reuse finished stages whose content keys match.
        keep_source: False hands the model over: the passes rewrite ``model.module`` in place and it is
            released (None) after the export, so the ONNX stages run without a torch copy of the weights.
        log: receives one line per stage (a resumed one says so, with its recorded time), and the
            heartbeat's "still running" lines during a long stage.
        stages: default :func:`vitexport.stages.pipeline_stages` (the core ones, the target's).
        heartbeat: how a long stage shows it is alive; default a line through ``log`` every 10 s.
    Returns:
        :class:`Artifacts`; ``artifacts.passed`` is the verdict.
    Raises:
        ParityFailure: a stage missed its tolerance (reports are written first); the failed stage's
            artifacts, and any later stage's from an earlier run, are moved into ``OUT/rejected/``
            (the exception's ``rejected`` and ``verdict`` say which) and the manifest says
            ``"status": "rejected"``.
        BadInput / ContractViolation: from the stages.
    """
    if layers and not keep_source:
        raise ValueError("per-layer localisation (layers=True) compares with the source model: keep_source must be True")
    recipe = target.recipe
    stages = list(stages) if stages is not None else pipeline_stages(target)
    data_check = check_data(calib, parity_data)  # warns, before the long work, when the two sets differ
    arts, meter, state = Artifacts(out_dir), PeakMeter(), _State(out_dir, load=resume)
    beat = heartbeat or Heartbeat()
    with beat.track("reference", log):
        ctx = _begin(model, target, out_dir, parity_data, calib, layers, keep_source, arts, meter)
    run = ParityRun(model=display_path(model.uri), target=recipe.name, data=display_path(parity_data.source),
                    notes=[data_note] if data_note else [], task=str(model.task), task_source=model.task_source)
    _note_data_check(run, data_check, log)
    run.notes.extend(_output_notes(model, arts.outputs))
    mark_vacuous(ctx.reference, run)  # a constant reference makes every gate pass trivially: say so loudly
    for i, stage in enumerate(stages):
        if not stage.enabled(recipe):
            run.skipped.append(stage.name)
            continue
        try:
            res, files, resumed = _resume_or_run(stage, ctx, state, arts, beat, log)
        except StageSkipped as why:
            run.notes.append(f"{stage.name}: {why}")
            continue
        if not any(s.needs_torch and s.enabled(recipe) for s in stages[i + 1:]):
            ctx.release_torch()  # past the last torch stage: the ONNX work runs without the weights
        _record_peak(arts, stage.name, meter.lap())
        arts.stage_seconds[stage.name] = res.seconds
        log(_stage_line(res, arts.stage_peak_bytes.get(stage.name), resumed))
        if not run.add(res):
            advice = failure_advice(res.stage, res.failed_check, recipe, calib_samples=len(calib),
                                    labelled_calib=calib.labels is not None, labelled=_count(ctx.reference.class_labels),
                                    quantize=_quantize_details(run, res))
            run.notes.append(f"{res.stage} failed its gate; {advice}")
            moved = _reject(arts, state, res, files, [s.name for s in stages[i + 1:]])
            _write_outputs(arts, run, recipe, model, _rejection(res, moved))
            raise _rejected_failure(res, advice, moved, out_dir)
    shutil.rmtree(out_dir / REJECTED_DIR, ignore_errors=True)  # passed: what an earlier failure set aside is stale
    _write_outputs(arts, run, recipe, model)
    return arts


def _output_notes(model: LoadedModel, outputs: dict[str, list[int]]) -> list[str]:
    """What a reader of a model with several outputs (or some left out) must know: the outputs each
    file has, and what was not exported (entries that are not tensors; those ``--outputs`` left out)."""
    adapter = model.module
    notes = []
    if len(outputs) > 1:
        notes.append("outputs: " + ", ".join(f"{k} {v}" for k, v in outputs.items())
                     + "; each is gated (checks named metric[output]); top-1/accuracy on the classification output only")
    kept = getattr(adapter, "model_output_names", None) or []
    if getattr(adapter, "select", None) and len(outputs) == 1:
        notes.append(f"--outputs kept the model's '{kept[0]}' only; the files name it 'output'" if kept else "")
    skipped = getattr(adapter, "skipped", None)
    if skipped:
        notes.append("not exported (not a tensor): " + ", ".join(skipped))
    return [n for n in notes if n]


def _note_data_check(run: ParityRun, check: DataCheck, log: Callable[[str], None]) -> None:
    """The preprocessing of image folders on the terminal; the comparison in the report and manifest."""
    run.extra["data_check"] = check.to_dict()
    line = check.preprocess_line()
    if line:
        log(line)
    if check.warnings:
        run.notes.append(f"WARNING: the calibration data does not look like the parity data ({len(check.warnings)} "
                         "difference(s); see 'Calibration and parity data')")


def _begin(model: LoadedModel, target: RunTarget, out_dir: Path, parity_data: SampleSet, calib: SampleSet,
           layers: bool, keep_source: bool, arts: Artifacts, meter: PeakMeter) -> RunContext:
    """Capture the golden reference and open the run's context (its first content key)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    batch = feed_size(model.example_inputs)
    # The golden reference is captured once, first, from the untouched model: exporters and passes
    # may change a module's state, and every stage is compared with this one set of outputs.
    _log.debug("golden reference: the untouched model on %d parity sample(s)", len(parity_data))
    with TorchRunner(model.module, model.example_inputs, name="untouched") as runner:
        reference = capture_reference(runner, list(parity_data.batches(batch)), labels=parity_data.labels,
                                      source=parity_data.source, layers=True if layers else None)
    # every stage's check measures the task's metrics (parity.tasks), reading the outputs as the source says
    reference.meta.update(task=str(model.task), **model.task_options)
    if reference.task_labels is not None:
        check_label_maps(model.task, reference.outputs, reference.task_labels, reference.meta.get("detect_scores", "softmax"))
    reference.save(out_dir)
    arts.files["reference.npz"] = out_dir / "reference.npz"
    arts.outputs = {k: [batch, *v.shape[1:]] for k, v in reference.outputs.items()}
    _record_peak(arts, "reference", meter.lap())
    # a task other than classify joins the key: a stage recorded under another task measured other metrics
    task = [str(model.task)] if str(model.task) != "classify" else []
    key = content_key(__version__, module_hash(model.module, model.example_inputs), parity_data.fingerprint(), *task)
    return RunContext(model=model, target=target, out_dir=out_dir, calib=calib, reference=reference,
                      unmasked=_unmasked(reference), key=key, layers=layers, keep_source=keep_source,
                      module=model.module, owned=not keep_source, files=arts.files)


def _resume_or_run(stage: Stage, ctx: RunContext, state: _State, arts: Artifacts, beat: Heartbeat,
                   log: Callable[[str], None]) -> tuple[StageResult, dict[str, Path], str | None]:
    """The stage's recorded result when its content key and artifacts match (gated again when this
    run's tolerance differs from the recorded one), else a fresh run (recorded when the stage has a
    key). Either way its files join the run's and its key the chain.

    Returns:
        (result, the stage's files, for a resumed stage what its line says instead of a time).
    """
    key = stage.key(ctx)
    found = state.lookup(stage.name, key)
    resumed = None
    if found is not None:
        res, files = found.result, found.files
        arts.resumed.append(stage.name)
        arts.resumed_from[stage.name] = found.finished or ""
        regated = _regate(stage, ctx, found, beat, log)
        if regated:
            state.record(stage.name, key, files, res, found.finished)  # type: ignore[arg-type]  # key matched
        resumed = f"took {res.seconds:.2f} s on {_when(found.finished)}" + (", gated again with this run's tolerance" if regated else "")
        res.notes = [*res.notes, f"resumed: artifacts of an earlier run with the same content key ({resumed})"]
    else:
        res, files = _execute(stage, ctx, beat, log)
        if key is not None:
            state.record(stage.name, key, files, res)
    ctx.key = key or ctx.key
    ctx.carry(res.checks)
    arts.files.update(files)
    return res, files, resumed


def _regate(stage: Stage, ctx: RunContext, found: _Found, beat: Heartbeat, log: Callable[[str], None]) -> bool:
    """Gate a resumed stage's artifacts again when this run's tolerance is not the recorded one (a
    re-run with a looser ``--set parity...`` after a failure); the verdict fields of the recorded
    result are replaced. Returns whether it was gated again."""
    res, tol = found.result, ctx.tolerance(stage.name)
    if res.tolerance.model_dump(mode="json") == tol.model_dump(mode="json"):
        return False
    out = StageOutput(files=found.files, changed=res.changed)
    with beat.track(stage.name, log), stage.runner(ctx, out) as runner:
        fresh = check_stage(stage.name, runner, ctx.reference, tol, changed=res.changed, seconds=res.seconds,
                            unmasked=ctx.unmasked, artifacts=found.files)
    res.tolerance, res.metrics, res.checks, res.passed = fresh.tolerance, fresh.metrics, fresh.checks, fresh.passed
    res.histogram, res.nonfinite_source, res.parity_seconds = fresh.histogram, fresh.nonfinite_source, fresh.parity_seconds
    res.output_metrics, res.sample_cosines, res.task_metrics = fresh.output_metrics, fresh.sample_cosines, fresh.task_metrics
    gate_int8_share(res, tol)
    return True


def _execute(stage: Stage, ctx: RunContext, beat: Heartbeat, log: Callable[[str], None]) -> tuple[StageResult, dict[str, Path]]:
    """Run a stage's work (timed, a heartbeat while it runs), then its parity check against the golden reference."""
    _log.debug("stage %s (resident %s)", stage.name, _gb(resident_bytes()))
    with beat.track(stage.name, log) as doing:
        ctx.say = doing.say
        t0 = time.perf_counter()
        out = stage.run(ctx)
        seconds = _own_seconds(stage, ctx, out, time.perf_counter() - t0)
        trim_memory()  # the stage's working set is garbage now: its parity check runs without it
        tol, own = ctx.tolerance(stage.name), ctx.recipe.tolerance(stage.name).max_abs
        with stage.runner(ctx, out) as runner:
            res = check_stage(stage.name, runner, ctx.reference, tol, changed=out.changed,
                              seconds=seconds, notes=out.notes, unmasked=ctx.unmasked, artifacts=out.files)
    if own is not None and tol.max_abs is not None and tol.max_abs > 1.1 * own:
        res.notes.append(f"max_abs limit {own:g} on top of the {tol.max_abs - own:.3g} the stages before it left "
                         "(every stage is compared with the untouched model)")
    res.details.update(out.details)
    gate_int8_share(res, ctx.recipe.tolerance(stage.name))  # what the stage's backend ran in INT8 (its details)
    if out.layers is not None:
        res.attach_layers(out.layers)
    return res, out.files


def _own_seconds(stage: Stage, ctx: RunContext, out: StageOutput, elapsed: float) -> float:
    """The time of the stage's own work: ``elapsed`` less what it did for later stages, plus what
    earlier stages did for it (rk3588: the simulator runs in build_engine's worker call)."""
    for name, s in out.later_work_s.items():
        ctx.work_done_s[name] = ctx.work_done_s.get(name, 0.0) + s
    return max(elapsed - sum(out.later_work_s.values()), 0.0) + ctx.work_done_s.pop(stage.name, 0.0)


def _reject(arts: Artifacts, state: _State, res: StageResult, files: dict[str, Path], later: list[str]) -> list[str]:
    """Move the failed stage's files, and those later stages recorded in an earlier run, into
    ``OUT/rejected/`` (whatever an earlier failure left there and nothing names now is deleted).
    Returns the names set aside; ``arts.files`` and the result's artifacts name their new paths."""
    out, rej = arts.out_dir, arts.out_dir / REJECTED_DIR
    names = list(dict.fromkeys([*files, *(n for stage in later for n in state.artifacts(stage))]))
    rej.mkdir(exist_ok=True)
    for old in rej.iterdir():
        if old.is_file() and old.name not in names:
            old.unlink()
    moved = []
    for name in names:
        if (out / name).is_file():
            os.replace(out / name, rej / name)
        if (rej / name).is_file():
            arts.files.pop(name, None)
            arts.files[f"{REJECTED_DIR}/{name}"] = rej / name
            moved.append(name)
    res.artifacts = {n: str(rej / n) if n in moved else p for n, p in res.artifacts.items()}
    return moved


def _why(res: StageResult) -> str:
    """The failed check as ``cosine_min 0.95 < 0.98``."""
    c = res.failed_check
    return f"{c.metric} {c.value:.6g} {'<' if c.op == '>=' else '>'} {c.limit:.10g}" if c else "a check failed"


def _rejection(res: StageResult, moved: list[str]) -> dict:
    """The manifest's ``rejected`` entry: the gate, its value against the threshold, the files set aside."""
    c = res.failed_check
    return {"stage": str(res.stage), "metric": c.metric if c else None, "value": c.value if c else None,
            "op": c.op if c else None, "limit": c.limit if c else None,
            "files": [f"{REJECTED_DIR}/{n}" for n in moved], "report": "parity.md"}


def _rejected_failure(res: StageResult, advice: str, moved: list[str], out_dir: Path) -> ParityFailure:
    """The stage's ParityFailure with the files set aside and the run's last line; the same line
    goes into ``OUT/rejected/README.txt`` beside the files."""
    report = display_path(str(out_dir / "parity.md"))
    if moved:
        shown = ", ".join(moved[:4]) + (f" and {len(moved) - 4} more" if len(moved) > 4 else "")
        where = display_path(str(out_dir / REJECTED_DIR))
        verdict = f"REJECTED: {res.stage} failed its gate ({_why(res)}): {shown} must not ship (moved to {where}/); see {report}"
        (out_dir / REJECTED_DIR / "README.txt").write_text(
            f"{verdict}\nvitexport moved these files here: they failed a parity gate, or come after one that failed.\n"
            "A run into the same folder that passes (e.g. with a looser --set parity... tolerance) resumes from them "
            "and moves them back, or removes them.\n")
    else:
        verdict = f"REJECTED: {res.stage} failed its gate ({_why(res)}): nothing this run wrote may ship; see {report}"
    err = res.failure().with_advice(advice)
    err.rejected = [out_dir / REJECTED_DIR / n for n in moved]
    err.verdict = verdict
    return err


def _gb(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.2f} GB"


def _record_peak(arts: Artifacts, stage: str, peak: int | None) -> None:
    if peak is not None:
        arts.stage_peak_bytes[stage] = peak


def _stage_line(res: StageResult, peak: int | None = None, resumed: str | None = None) -> str:
    m = res.metrics
    verdict = "pass" if res.passed else "FAIL"
    changed = f" changed={res.changed}" if res.changed is not None else ""
    extra = (f" top1={m.top1_agreement:.4f} gated={m.top1_agreement_gated:.4f}"
             if m.top1_agreement is not None and m.top1_agreement_gated is not None else "")
    acc = f" acc={m.accuracy:.4f}" if m.accuracy is not None else ""
    acc += res.task_metrics.short() if res.task_metrics is not None else ""  # map=0.9981 box_iou=0.987
    if res.output_metrics:  # several outputs: the line's figures are the primary's; the worst other one is said too
        name, worst = min(res.output_metrics.items(), key=lambda kv: kv[1].cosine_min)
        acc += f" worst={name} cos_min={worst.cosine_min:.6f}" if worst.cosine_min < m.cosine_min else ""
    # a parity check of a second or more is said: the wait a heartbeat line counted includes it
    check = f" + check {res.parity_seconds:.2f}s" if res.parity_seconds >= 1.0 else ""
    when = f"resumed from OUT ({resumed})" if resumed else f"({res.seconds:.2f}s{check}{f', peak {_gb(peak)}' if peak else ''})"
    return f"[{verdict}] {res.stage:<16} {res.engine:<12} max_abs={m.max_abs:.3g} cos_min={m.cosine_min:.6f}{extra}{acc}{changed} {when}"


def _versions() -> dict[str, str]:
    return {
        "vitexport": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "onnxsim": importlib.metadata.version("onnxsim"),  # its installed version: no import needed
        "numpy": np.__version__,
    }


def _quantize_details(run: ParityRun, res: StageResult) -> dict | None:
    """The quantize stage's details (this stage's, or the INT8 file's an engine stage was built from)."""
    return res.details.get("quantize") or next((s.details["quantize"] for s in run.stages if "quantize" in s.details), None)


def _profile(res: StageResult) -> dict:
    """The quantizer's profile (seconds and ONNX Runtime runs per step) with the gate's own check, for the manifest."""
    prof = (res.details.get("quantize") or {}).get("profile")
    return {"profile": {**prof, "gate_seconds": round(res.parity_seconds, 3)}} if prof else {}


def _write_outputs(arts: Artifacts, run: ParityRun, recipe: Recipe, model: LoadedModel, rejected: dict | None = None) -> None:
    for name, path in write_reports(arts.out_dir, run).items():
        arts.files[name] = Path(path)
    arts.parity = run
    manifest = {
        "vitexport": __version__,
        "model": display_path(model.uri),
        "target": recipe.name,
        # what the outputs mean (the task metrics parity gates) and who said so (the source's class, --task)
        "task": {"task": str(model.task), "from": model.task_source},
        "passed": run.passed,
        # "rejected": a gate failed; ``rejected`` names it, its value against the threshold, and the
        # files moved into rejected/ (none of them may ship)
        "status": "passed" if run.passed and rejected is None else "rejected",
        "rejected": rejected,
        "versions": _versions(),
        "recipe": recipe.model_dump(mode="json"),
        "inputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")} for k, v in model.example_inputs.items()},
        # every output of the files, in their order (one output is "output")
        "outputs": {k: {"shape": v} for k, v in arts.outputs.items()},
        "stages": {s.stage: {"seconds": round(s.seconds, 4), "passed": s.passed,
                             "peak_rss_bytes": arts.stage_peak_bytes.get(s.stage),
                             # a resumed stage's seconds are its recorded run's, finished then
                             "resumed_from": arts.resumed_from.get(s.stage), **_profile(s)} for s in run.stages},
        "reference_peak_rss_bytes": arts.stage_peak_bytes.get("reference"),
        "process_peak_rss_bytes": process_peak_bytes(),
        "skipped_stages": list(run.skipped),
        # the image folders' preprocessing and how the calibration data compares with the parity data
        "data_check": run.extra.get("data_check"),
        "resumed_stages": list(arts.resumed),
        # what the INT8 engine will run (INT8 share of GEMM MACs, FP16 / FP32 bytes, FP32 islands)
        "precision": next((s.details["quantize"].get("precision") for s in run.stages if "quantize" in s.details), None),
        # what the target's runtime runs, read from the runtime itself (rk3588: RKNN's op table; openvino:
        # the CPU plugin's runtime model): ops on the NPU / CPU, INT8 share of GEMM/Conv MACs, float parts
        "runtime": {s.stage: s.details["runtime"] for s in run.stages if "runtime" in s.details},
        "artifacts": {
            name: {"sha256": sha256_file(p), "bytes": p.stat().st_size}
            for name, p in sorted(arts.files.items())
            if p.is_file()
        },
    }
    path = arts.out_dir / "manifest.json"
    atomic_write_json(path, manifest)
    arts.files["manifest.json"] = path
