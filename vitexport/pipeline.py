"""The ordered stages, each gated by parity against one golden reference.

model source → freeze_layernorm → mask_to_where → fuse_qkv → export_onnx → simplify →
quantize_int8 → build_engine (only where TensorRT and a GPU exist).

Every artifact is written atomically. After each stage the run's state (stage → content key, artifact
hashes, parity result) is saved, so a run that was killed resumes from the last finished stage: a
stage whose key (a hash of everything it consumes) and artifacts are unchanged is not run again.
"""
from __future__ import annotations

import gc
import hashlib
import json
import logging
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from . import __version__
from .calibration import SampleSet
from .calibration.session import release_memory
from .engines import QDQ_AS_FLOAT, OnnxRuntimeRunner, TorchRunner, tensorrt_available
from .errors import ParityFailure
from .io import atomic_path, atomic_write_json, display_path, sha256_file
from .memory import PeakMeter, process_peak_bytes, resident_bytes
from .parity import GoldenReference, ParityRun, StageResult, capture_reference, check_stage, write_reports
from .recipe import STAGE_NAMES, Recipe
from .sources import LoadedModel

_log = logging.getLogger("vitexport.pipeline")

__all__ = ["Artifacts", "run_pipeline", "PASS_STAGES", "STAGE_NAMES"]

PASS_STAGES = ("freeze_layernorm", "mask_to_where", "fuse_qkv")
STATE_FILE = ".vitexport-state.json"


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
    resumed: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.parity and self.parity.passed)


def _hash(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, bytes):
            h.update(p)
        else:
            h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def _module_hash(module: torch.nn.Module, example_inputs: dict[str, torch.Tensor]) -> str:
    """Content hash of a module: its state, its structure and its input shapes."""
    h = hashlib.sha256()
    for k, v in module.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    h.update(repr(module).encode())
    h.update(json.dumps({k: [list(v.shape), str(v.dtype)] for k, v in example_inputs.items()}).encode())
    return h.hexdigest()[:24]


def _unmasked(reference: GoldenReference) -> np.ndarray | None:
    """Output positions that belong to real tokens (a text encoder's ``attention_mask == 1``)."""
    out = reference.outputs.get("output")
    masks = [np.concatenate([f[k] for f in reference.feeds]) for k in reference.feeds[0] if "mask" in k]
    if out is None or not masks:
        return None
    m = masks[0].astype(bool)
    if out.shape[: m.ndim] != m.shape:
        return None
    return np.broadcast_to(m.reshape(m.shape + (1,) * (out.ndim - m.ndim)), out.shape)


class _State:
    """The resume record: stage name → {key, artifacts {name: sha256}, result}."""

    def __init__(self, out_dir: Path, load: bool = True):
        self.path = out_dir / STATE_FILE
        self.data: dict = {}
        if load and self.path.is_file():
            try:
                self.data = json.loads(self.path.read_text())
            except (OSError, json.JSONDecodeError):
                self.data = {}  # a damaged record only costs a full run

    def lookup(self, stage: str, key: str, out_dir: Path) -> dict | None:
        rec = self.data.get(stage)
        if not rec or rec.get("key") != key:
            return None
        for name, sha in rec.get("artifacts", {}).items():
            p = out_dir / name
            if not p.is_file() or sha256_file(p) != sha:
                return None
        return rec

    def record(self, stage: str, key: str, artifacts: dict[str, Path], result: dict) -> None:
        self.data[stage] = {
            "key": key,
            "artifacts": {p.name: sha256_file(p) for p in artifacts.values()},
            "result": result,
        }
        atomic_write_json(self.path, self.data)


def run_pipeline(
    model: LoadedModel,
    recipe: Recipe,
    out_dir: Path,
    *,
    calib: SampleSet,
    parity_data: SampleSet,
    data_note: str = "",
    layers: bool = False,
    resume: bool = True,
    keep_source: bool = True,
    log: Callable[[str], None] = lambda s: None,
) -> Artifacts:
    """Run every enabled stage, gate each with parity, write reports and the manifest.

    Args:
        model: the loaded model (untouched unless ``keep_source`` is False; the passes work on a copy).
        recipe: the validated recipe.
        out_dir: output folder (created).
        calib: calibration samples.
        parity_data: parity samples (labels optional), already cut to the export batch.
        data_note: said in the report (e.g. "synthetic inputs: no data given").
        layers: add per-layer localisation to the quantized stage.
        resume: reuse finished stages whose content keys match.
        keep_source: False hands the model over: the passes rewrite ``model.module`` in place and
            it is released (``model.module`` becomes None) after the export, so the ONNX stages run
            without a torch copy of the weights (ViT-B/16: 2 × 344 MB less). ``layers`` needs it kept.
        log: receives one line per stage.
    Returns:
        :class:`Artifacts`; ``artifacts.passed`` is the verdict.
    Raises:
        ParityFailure: a stage missed its tolerance (reports are written first).
        BadInput / ContractViolation: from the stages.
    """
    from .export import export_onnx, simplify_onnx
    from .passes import get_pass

    if layers and not keep_source:
        raise ValueError("per-layer localisation (layers=True) compares with the source model: keep_source must be True")
    from .quantize import build_engine, get_target, quantize_int8, write_engine_script

    out_dir.mkdir(parents=True, exist_ok=True)
    state = _State(out_dir, load=resume)
    arts = Artifacts(out_dir)
    batch = next(iter(model.example_inputs.values())).shape[0]

    # The golden reference is captured once, first, from the untouched model: exporters and passes
    # may change a module's state, and every stage is compared with this one set of outputs.
    meter = PeakMeter()
    _log.debug("golden reference: the untouched model on %d parity sample(s)", len(parity_data))
    with TorchRunner(model.module, model.example_inputs, name="untouched") as runner:
        reference = capture_reference(runner, list(parity_data.batches(batch)), labels=parity_data.labels,
                                      source=parity_data.source, layers=True if layers else None)
    ref_path = out_dir / "reference.npz"
    reference.save(out_dir)
    _record_peak(arts, "reference", meter.lap())
    arts.files["reference.npz"] = ref_path
    unmasked = _unmasked(reference)

    run = ParityRun(model=display_path(model.uri), target=recipe.name, data=display_path(parity_data.source), stages=[], passed=True)
    if data_note:
        run.notes.append(data_note)
    key = _hash(__version__, _module_hash(model.module, model.example_inputs), parity_data.fingerprint())

    def finish(result: StageResult) -> None:
        _record_peak(arts, result.stage, meter.lap())
        run.stages.append(result)
        arts.stage_seconds[result.stage] = result.seconds
        log(_stage_line(result, arts.stage_peak_bytes.get(result.stage)))
        if not result.passed:
            run.passed = False
            _write_outputs(arts, run, recipe, model)
            check = result.first_failure
            raise ParityFailure(result.stage, check.metric, check.value, check.limit, check.op)

    def reuse(stage: str, stage_key: str) -> bool:
        rec = state.lookup(stage, stage_key, out_dir)
        if rec is None:
            return False
        res = StageResult.from_dict(rec["result"])
        res.notes = [*res.notes, "resumed: artifacts of an earlier run with the same content key"]
        arts.resumed.append(stage)
        for name in rec.get("artifacts", {}):
            arts.files[name] = out_dir / name
        finish(res)
        return True

    # --- torch passes ----------------------------------------------------------------------------
    # The first pass copies the model (the caller's module is never touched); later passes rewrite
    # that copy in place, so a ViT-B holds two sets of weights here, not four. A model the pipeline
    # may consume (``keep_source=False``: loaded for this run, no per-layer comparison to come) is
    # rewritten in place from the start: one set of weights.
    current, owned = model.module, not keep_source
    for stage in PASS_STAGES:
        spec = getattr(recipe.stages, stage)
        if not spec.enabled:
            run.skipped.append(stage)
            continue
        _log.debug("stage %s (resident %s)", stage, _gb(resident_bytes()))
        t0 = time.perf_counter()
        current, report = get_pass(stage)(current, model.example_inputs, spec, inplace=owned)
        owned = True
        seconds = time.perf_counter() - t0
        with TorchRunner(current, model.example_inputs, name=stage) as runner:
            res = check_stage(
                stage, runner, reference, recipe.tolerance(stage), changed=report.changed, seconds=seconds,
                notes=[report.summary(), *[f"skipped {s.site}: {s.reason}" for s in report.skipped], *report.notes],
                unmasked=unmasked,
            )
        res.details["pass_report"] = report.to_dict()
        finish(res)

    # --- ONNX export and simplify -----------------------------------------------------------------
    # The passes' rewrites of attention live in hooks and attributes a state dict does not show: the
    # stage settings are part of the key. The contract decides which index ops the export lowers.
    key = _hash(key, _module_hash(current, model.example_inputs), recipe.export.model_dump(mode="json"),
                recipe.stages.model_dump(mode="json"), recipe.contract.allowed_ops)
    raw = out_dir / "model.raw.onnx"
    if not reuse("export_onnx", key):
        _log.debug("stage export_onnx (resident %s)", _gb(resident_bytes()))
        _trim()  # the exporter holds about two more copies of the weights: start from a trimmed heap
        t0 = time.perf_counter()
        exp = export_onnx(current, model.example_inputs, raw, recipe.export, contract=recipe.contract)
        seconds = time.perf_counter() - t0
        with OnnxRuntimeRunner(raw, name="export_onnx") as runner:
            res = check_stage("export_onnx", runner, reference, recipe.tolerance("export_onnx"), seconds=seconds, unmasked=unmasked,
                              notes=[f"exporter: {exp.exporter}, opset {exp.opset}", *exp.notes])
        res.details["export"] = exp.to_dict()
        res.artifacts["model.raw.onnx"] = str(raw)
        state.record("export_onnx", key, {"raw": raw}, res.to_dict())
        finish(res)
    arts.files["model.raw.onnx"] = raw
    # the rewritten torch model is not needed past the export: free its weights before ONNX work
    del current
    if not keep_source:
        model.module = None  # type: ignore[assignment]  # rewritten and exported: nothing reads it again
    _trim()

    key = _hash(key, sha256_file(raw), recipe.contract.model_dump(mode="json"), recipe.export.simplify)
    fp32 = out_dir / "model.fp32.onnx"
    if not reuse("simplify", key):
        _log.debug("stage simplify (resident %s)", _gb(resident_bytes()))
        t0 = time.perf_counter()
        simp = simplify_onnx(raw, fp32, recipe)
        seconds = time.perf_counter() - t0
        with OnnxRuntimeRunner(fp32, name="simplify") as runner:
            res = check_stage("simplify", runner, reference, recipe.tolerance("simplify"), seconds=seconds, unmasked=unmasked, notes=simp.notes)
        res.details["simplify"] = simp.to_dict()
        res.artifacts["model.fp32.onnx"] = str(fp32)
        state.record("simplify", key, {"fp32": fp32}, res.to_dict())
        finish(res)
    arts.files["model.fp32.onnx"] = fp32

    # --- INT8 -------------------------------------------------------------------------------------
    if recipe.stages.quantize_int8.enabled:
        int8 = out_dir / "model.int8.onnx"
        key = _hash(key, sha256_file(fp32), calib.fingerprint(), recipe.calibration.model_dump(mode="json"),
                    recipe.quantization.model_dump(mode="json"), recipe.target.value, recipe.tolerance("quantize_int8").model_dump(mode="json"))
        if not reuse("quantize_int8", key):
            _log.debug("stage quantize_int8 (resident %s)", _gb(resident_bytes()))
            t0 = time.perf_counter()
            q = quantize_int8(fp32, int8, calib, recipe, out_dir, parity_feeds=reference.feeds, reference=reference.outputs["output"])
            seconds = time.perf_counter() - t0
            # The gate measures what the target computes: ONNX Runtime's fused integer kernels for
            # cpu, float Q/DQ semantics (fake quantization) for TensorRT and NPU targets.
            native = get_target(recipe).runs_in_onnxruntime
            notes = list(q.notes)
            if not native:
                notes.append("INT8 parity: Q/DQ evaluated as float ops in ONNX Runtime (session.disable_quant_qdq), "
                             f"the arithmetic the {recipe.target.value} runtime performs")
            with OnnxRuntimeRunner(int8, name="quantize_int8", config=None if native else QDQ_AS_FLOAT) as runner:
                res = check_stage("quantize_int8", runner, reference, recipe.tolerance("quantize_int8"), seconds=seconds, unmasked=unmasked, notes=notes)
            res.details["quantize"] = q.to_dict()
            produced = {"int8": int8}
            for extra in ("calibration.json", "calibration.cache"):
                if (out_dir / extra).is_file():
                    produced[extra] = out_dir / extra
            if recipe.target.value == "orin":
                produced["script"] = write_engine_script(int8, out_dir / "build_engine.sh", recipe)
            if layers:
                _add_layers(res, model, fp32, int8, reference, recipe)
            for p in produced.values():
                res.artifacts[p.name] = str(p)
            state.record("quantize_int8", key, produced, res.to_dict())
            finish(res)
        for name in ("model.int8.onnx", "calibration.json", "calibration.cache", "build_engine.sh"):
            if (out_dir / name).is_file():
                arts.files[name] = out_dir / name
    else:
        run.skipped.append("quantize_int8")

    # --- TensorRT ---------------------------------------------------------------------------------
    if recipe.stages.build_engine.enabled and recipe.target.value == "orin" and "model.int8.onnx" in arts.files:
        if tensorrt_available():  # pragma: no cover - needs TensorRT and a GPU
            from .engines import TensorRTRunner

            plan = out_dir / "model.int8.plan"
            t0 = time.perf_counter()
            build_engine(arts.files["model.int8.onnx"], plan)
            seconds = time.perf_counter() - t0
            with TensorRTRunner(plan, name="build_engine") as runner:
                res = check_stage("build_engine", runner, reference, recipe.tolerance("build_engine"), seconds=seconds, unmasked=unmasked)
            arts.files["model.int8.plan"] = plan
            finish(res)
        else:
            run.notes.append("build_engine: TensorRT or a GPU is not available here; build_engine.sh holds the trtexec command")
    _write_outputs(arts, run, recipe, model)
    return arts


def _add_layers(res: StageResult, model: LoadedModel, fp32: Path, int8: Path, reference: GoldenReference, recipe: Recipe) -> None:
    from .parity import localize_layers

    rep = localize_layers(model.module, reference.feeds, {"fp32": fp32, "int8": int8},
                          budget=recipe.tolerance("quantize_int8"), reference_layers=reference.layers)
    res.attach_layers(rep)


def _trim() -> None:
    """Collect cycles (torch modules hold some) and hand the freed heap back to the OS."""
    gc.collect()
    release_memory()


def _gb(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.2f} GB"


def _record_peak(arts: Artifacts, stage: str, peak: int | None) -> None:
    if peak is not None:
        arts.stage_peak_bytes[stage] = peak


def _stage_line(res: StageResult, peak: int | None = None) -> str:
    m = res.metrics
    verdict = "pass" if res.passed else "FAIL"
    changed = f" changed={res.changed}" if res.changed is not None else ""
    extra = f" top1={m.top1_agreement:.4f}" if m.top1_agreement is not None else ""
    acc = f" acc={m.accuracy:.4f}" if m.accuracy is not None else ""
    return f"[{verdict}] {res.stage:<16} {res.engine:<12} max_abs={m.max_abs:.3g} cos_min={m.cosine_min:.6f}{extra}{acc}{changed} ({res.seconds:.2f}s{f', peak {_gb(peak)}' if peak else ''})"


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import onnxsim

    return {
        "vitexport": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "onnxsim": getattr(onnxsim, "__version__", "unknown"),
        "numpy": np.__version__,
    }


def _write_outputs(arts: Artifacts, run: ParityRun, recipe: Recipe, model: LoadedModel) -> None:
    for name, path in write_reports(arts.out_dir, run).items():
        arts.files[name] = Path(path)
    arts.parity = run
    manifest = {
        "vitexport": __version__,
        "model": display_path(model.uri),
        "target": recipe.name,
        "passed": run.passed,
        "versions": _versions(),
        "recipe": recipe.model_dump(mode="json"),
        "inputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")} for k, v in model.example_inputs.items()},
        "stages": {s.stage: {"seconds": round(s.seconds, 4), "passed": s.passed,
                             "peak_rss_bytes": arts.stage_peak_bytes.get(s.stage)} for s in run.stages},
        "reference_peak_rss_bytes": arts.stage_peak_bytes.get("reference"),
        "process_peak_rss_bytes": process_peak_bytes(),
        "skipped_stages": list(run.skipped),
        "resumed_stages": list(arts.resumed),
        "artifacts": {
            name: {"sha256": sha256_file(p), "bytes": p.stat().st_size}
            for name, p in sorted(arts.files.items())
            if p.is_file()
        },
    }
    path = arts.out_dir / "manifest.json"
    atomic_write_json(path, manifest)
    arts.files["manifest.json"] = path
