"""The stage loop through the Python API: ownership of the source model, the INT8 gate's runtime,
resume, failure, and the stages a target contributes."""
from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch

from cli_helpers import run_cli
from vitexport.api import prepare
from vitexport.runners import QDQ_AS_FLOAT, OnnxRuntimeRunner, TorchRunner
from vitexport.errors import ParityFailure
from vitexport.io import sha256_file
from vitexport.pipeline import REJECTED_DIR, STATE_FILE, run_pipeline
from vitexport.progress import Heartbeat
from vitexport.recipe import Recipe, StageName, TargetStage, read_recipe
from vitexport.stages import INT8_ONNX, Contribution, RunContext, StageOutput, pipeline_stages
from vitexport.targets import Target, recipe_file
from vitexport.targets.cpu import CpuTarget

FAST = ("calibration.num_samples=16", "parity_data.synthetic_samples=8")
KEYED = [StageName.export_onnx, StageName.simplify, StageName.quantize_int8]


def _run(tiny_vit_file, out, target="orin", keep_source=True, overrides=(), **kw):
    model, target, calib, parity, notes = prepare(f"python:{tiny_vit_file}:build_with_inputs", target,
                                                  overrides=(*FAST, *overrides))
    before = {k: v.clone() for k, v in model.module.state_dict().items()}
    arts = run_pipeline(model, target, out, calib=calib, parity_data=parity, keep_source=keep_source, **kw)
    return model, before, arts


def _stages(out: Path) -> dict[str, dict]:
    return {s["stage"]: s for s in json.loads((out / "parity.json").read_text())["stages"]}


def test_kept_source_is_untouched(tiny_vit_file, tmp_path):
    model, before, arts = _run(tiny_vit_file, tmp_path / "a")
    assert arts.passed
    after = model.module.state_dict()
    assert after.keys() == before.keys()  # the LayerNorm affine terms were frozen in a copy, not here
    assert all(torch.equal(after[k], before[k]) for k in before)


@pytest.mark.slow
def test_consumed_source_gives_the_same_artifacts(tiny_vit_file, tmp_path):
    """Handing the model over (the CLI's way, to free its weights before ONNX work) changes no byte."""
    _, _, kept = _run(tiny_vit_file, tmp_path / "a")
    model, _, consumed = _run(tiny_vit_file, tmp_path / "b", keep_source=False)
    assert consumed.passed and model.module is None
    for name in ("model.fp32.onnx", "model.int8.onnx"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


@pytest.mark.slow
def test_int8_gate_runs_the_targets_arithmetic(tiny_vit_file, tmp_path):
    """orin's INT8 gate runs Q/DQ as float ops (what TensorRT computes); cpu's runs ONNX Runtime's kernels."""
    _run(tiny_vit_file, tmp_path / "orin")
    _run(tiny_vit_file, tmp_path / "cpu", target="cpu")

    def int8_notes(d):
        stage = next(s for s in json.loads((d / "parity.json").read_text())["stages"] if s["stage"] == "quantize_int8")
        return " ".join(stage["notes"])

    assert "session.disable_quant_qdq" in int8_notes(tmp_path / "orin")
    assert "session.disable_quant_qdq" not in int8_notes(tmp_path / "cpu")
    assert np.load(tmp_path / "orin" / "reference.npz").files  # the golden reference was written
    # orin contributes build_engine.sh (beside the Q/DQ model) and the engine stage (no TensorRT
    # here: a run note); cpu contributes neither
    orin = json.loads((tmp_path / "orin" / "parity.json").read_text())
    cpu = json.loads((tmp_path / "cpu" / "parity.json").read_text())
    assert (tmp_path / "orin" / "build_engine.sh").is_file() and not (tmp_path / "cpu" / "build_engine.sh").exists()
    assert "build_engine.sh" in _stages(tmp_path / "orin")["quantize_int8"]["artifacts"]
    assert any(n.startswith("build_engine: TensorRT or a GPU is not available") for n in orin["notes"])
    assert not any("build_engine" in n for n in cpu["notes"]) and "build_engine" not in cpu["skipped"]


@pytest.mark.slow
def test_rerun_resumes_keyed_stages_and_reruns_what_changed(tiny_vit_file, tmp_path):
    """A finished run resumes every keyed stage to the same bytes; a damaged artifact reruns its
    stage only (the next stage's key still matches), and a changed setting reruns from its stage."""
    out = tmp_path / "o"
    _, _, first = _run(tiny_vit_file, out)
    digests = {n: sha256_file(out / n) for n in ("model.raw.onnx", "model.fp32.onnx", INT8_ONNX, "build_engine.sh")}
    assert first.resumed == [] and set(json.loads((out / STATE_FILE).read_text())) == set(KEYED)

    lines: list[str] = []
    _, _, again = _run(tiny_vit_file, out, log=lines.append)
    assert again.passed and again.resumed == KEYED
    assert {n: sha256_file(out / n) for n in digests} == digests
    assert all("resumed:" in s["notes"][-1] for name, s in _stages(out).items() if name in KEYED)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["resumed_stages"] == KEYED
    # each resumed stage says so on its line, with the time its first run took
    for name in KEYED:
        line = next(l for l in lines if l.split()[1] == name)
        assert f"resumed from OUT (took {first.stage_seconds[name]:.2f} s on " in line, line
        assert manifest["stages"][name]["resumed_from"] and manifest["stages"][name]["seconds"] == round(first.stage_seconds[name], 4)

    (out / "model.fp32.onnx").write_bytes(b"damaged")
    _, _, repaired = _run(tiny_vit_file, out)
    assert repaired.resumed == [StageName.export_onnx, StageName.quantize_int8]
    assert sha256_file(out / "model.fp32.onnx") == digests["model.fp32.onnx"]

    _, _, changed = _run(tiny_vit_file, out, overrides=("calibration.percentile=99.9",))
    assert changed.resumed == [StageName.export_onnx, StageName.simplify]

    _, _, fresh = _run(tiny_vit_file, out, resume=False)
    assert fresh.resumed == [] and sha256_file(out / "model.fp32.onnx") == digests["model.fp32.onnx"]

    # a stricter simplify gate: the Q/DQ model an earlier run left behind is set aside with it
    with pytest.raises(ParityFailure):
        _run(tiny_vit_file, out, overrides=("parity.simplify.cosine_min=1.5",))
    assert not (out / INT8_ONNX).exists() and not (out / "build_engine.sh").exists()
    assert {INT8_ONNX, "build_engine.sh", "model.fp32.onnx"} <= {p.name for p in (out / REJECTED_DIR).iterdir()}


def test_a_failed_gate_sets_its_artifact_aside_and_a_passing_rerun_takes_it_back(tiny_vit_file, tmp_path):
    out = tmp_path / "o"
    with pytest.raises(ParityFailure) as exc:
        _run(tiny_vit_file, out, overrides=("parity.simplify.cosine_min=1.5",))  # a cosine never reaches 1.5
    assert (exc.value.stage, exc.value.metric, exc.value.limit, exc.value.op) == ("simplify", "cosine_min", 1.5, ">=")
    doc = json.loads((out / "parity.json").read_text())
    assert doc["passed"] is False and doc["failed_stage"] == "simplify" and doc["failed_metric"] == "cosine_min"
    assert [s["stage"] for s in doc["stages"]][-2:] == ["export_onnx", "simplify"]  # nothing ran after it
    # the file that failed is set aside (its name in OUT never holds a rejected model); export's stays
    assert not (out / INT8_ONNX).exists() and not (out / "model.fp32.onnx").exists()
    assert (out / REJECTED_DIR / "model.fp32.onnx").is_file() and (out / "model.raw.onnx").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["passed"] is False and manifest["status"] == "rejected"
    rejected = manifest["rejected"]
    assert (rejected["stage"], rejected["metric"], rejected["op"], rejected["limit"]) == ("simplify", "cosine_min", ">=", 1.5)
    assert rejected["value"] < 1.5 and rejected["files"] == ["rejected/model.fp32.onnx"]
    assert "rejected/model.fp32.onnx" in manifest["artifacts"] and "model.fp32.onnx" not in manifest["artifacts"]
    assert exc.value.rejected == [out / REJECTED_DIR / "model.fp32.onnx"]
    assert re.fullmatch(r"REJECTED: simplify failed its gate \(cosine_min [0-9.]+ < 1\.5\): model\.fp32\.onnx must not "
                        r"ship \(moved to .*rejected/\); see .*parity\.md", exc.value.verdict), exc.value.verdict
    assert exc.value.verdict in (out / REJECTED_DIR / "README.txt").read_text()

    # the recipe's own tolerance in the same folder: simplify is resumed from rejected/, gated again,
    # passes, and nothing is left set aside
    lines: list[str] = []
    _, _, again = _run(tiny_vit_file, out, log=lines.append)
    assert again.passed and StageName.simplify in again.resumed
    assert (out / "model.fp32.onnx").is_file() and (out / INT8_ONNX).is_file() and not (out / REJECTED_DIR).exists()
    assert "gated again with this run's tolerance" in next(l for l in lines if l.split()[1] == "simplify")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "passed" and manifest["rejected"] is None


class _FloatQdqEngine:
    """An engine stage a runtime could contribute: cpu's Q/DQ model run as float Q/DQ ops (what a
    fake-quantizing runtime computes), where cpu's own gate runs ONNX Runtime's integer kernels."""

    name: ClassVar[str] = "build_engine"
    needs_torch: ClassVar[bool] = False

    def enabled(self, recipe: Recipe) -> bool:
        return recipe.stages.build_engine.enabled

    def key(self, ctx: RunContext) -> None:
        return None

    def run(self, ctx: RunContext) -> StageOutput:
        engine = ctx.out_dir / "model.engine.onnx"
        shutil.copy(ctx.files[INT8_ONNX], engine)
        return StageOutput(files={engine.name: engine}, notes=["Q/DQ as float ops"])

    def runner(self, ctx: RunContext, out: StageOutput):
        return OnnxRuntimeRunner(out.files["model.engine.onnx"], name=self.name, config=QDQ_AS_FLOAT)


class _EngineCpu(CpuTarget):
    """cpu with the stages an engine target declares (not registered: these tests build it from its recipe)."""

    target_stages = (TargetStage("build_engine"), TargetStage("simulate"))


def _engine_cpu(*overrides: str) -> _EngineCpu:
    """An :class:`_EngineCpu` from cpu's recipe, read with that target's stages (``stages.build_engine``...)."""
    return _EngineCpu(read_recipe(recipe_file("cpu"), [*FAST, *overrides], targets={"cpu": _EngineCpu}))


def _readme(int8: Path, target: Target) -> Path:
    path = int8.parent / "RUN_ME.txt"
    path.write_text(f"{target.recipe.name}: run {int8.name} with Q/DQ as float ops\n")
    return path


@pytest.mark.slow
def test_a_contributed_stage_and_artifact_run_in_the_loop(tiny_vit_file, tmp_path):
    """A contribution's files are written and recorded with quantize_int8; its stage runs after it,
    is gated with the recipe's tolerance for that stage and lands in the reports and the manifest."""
    model, _, calib, parity, _ = prepare(f"python:{tiny_vit_file}:build_with_inputs", "cpu", overrides=FAST)
    target = _engine_cpu()
    stages = pipeline_stages(target, Contribution(artifacts=(_readme,), stages=(_FloatQdqEngine(),)))
    assert [s.name for s in stages][-2:] == [StageName.quantize_int8, "build_engine"]
    arts = run_pipeline(model, target, tmp_path, calib=calib, parity_data=parity, stages=stages)
    assert arts.passed and {"RUN_ME.txt", "model.engine.onnx"} <= set(arts.files)
    by = _stages(tmp_path)
    assert list(by)[-1] == "build_engine" and by["build_engine"]["notes"][0] == "Q/DQ as float ops"
    assert by["build_engine"]["tolerance"]["cosine_min"] == target.recipe.tolerance("build_engine").cosine_min
    assert "RUN_ME.txt" in by["quantize_int8"]["artifacts"]
    assert "RUN_ME.txt" in json.loads((tmp_path / STATE_FILE).read_text())["quantize_int8"]["artifacts"]
    assert "build_engine" in json.loads((tmp_path / "manifest.json").read_text())["stages"]
    # a disabled contributed stage is listed as skipped, like any other
    target = _engine_cpu("stages.build_engine.enabled=false")
    off = run_pipeline(model, target, tmp_path / "off", calib=calib, parity_data=parity,
                       stages=pipeline_stages(target, Contribution(stages=(_FloatQdqEngine(),))))
    assert off.parity.skipped == ["build_engine"] and off.resumed == []


@pytest.mark.slow
def test_an_outlier_planted_in_the_parity_data_does_not_change_the_fallbacks_choice(tiny_vit_file, tmp_path):
    """The fallback chooses its float layers on held-out calibration samples: parity data that the
    gate then scores, however wild, cannot move that choice."""
    from vitexport.calibration.data import NpzSamples

    strict = ("quantization.smooth=false", "quantization.fallback.max_float_layers=4",
              "parity.quantize_int8.cosine_min=0.99999")  # no INT8 model meets it: the fallback acts

    def chosen(parity_of) -> list[str]:
        model, target, calib, parity, _ = prepare(f"python:{tiny_vit_file}:build_with_inputs", "orin",
                                                  overrides=(*FAST, *strict))
        out = tmp_path / str(len(list(tmp_path.iterdir())))
        try:
            run_pipeline(model, target, out, calib=calib, parity_data=parity_of(parity), keep_source=False)
        except ParityFailure:
            pass  # the strict gate may fail on the written file; the choice is what is compared
        q = _stages(out)["quantize_int8"]["details"]["quantize"]
        return [f["node"] for f in q["float_fallback"]]

    def planted(parity):
        arrays = {k: np.concatenate([b[k] for b in parity.batches(len(parity))]) for k in parity.input_names}
        first = next(iter(arrays))
        arrays[first] = arrays[first].copy()
        arrays[first][0] *= 50.0  # one wild sample, seen only by the gate
        return NpzSamples(arrays=arrays, labels=parity.labels, source="planted")

    clean = chosen(lambda p: p)
    assert clean, "the strict budget should make the fallback keep layers in float"
    assert chosen(planted) == clean


class _Sleeper:
    """A stage whose work sleeps, part of it for the next stage (a worker call that runs both, as
    rk3588's compile runs the simulator); its check runs the untouched model (exact)."""

    name: ClassVar[str] = "build_engine"
    needs_torch: ClassVar[bool] = True

    def __init__(self, sleep_s: float, for_next_s: float):
        self.sleep_s, self.for_next_s = sleep_s, for_next_s

    def enabled(self, recipe: Recipe) -> bool:
        return True

    def key(self, ctx: RunContext) -> None:
        return None

    def run(self, ctx: RunContext) -> StageOutput:
        time.sleep(self.sleep_s)
        return StageOutput(later_work_s={"simulate": self.for_next_s} if self.for_next_s else {})

    def runner(self, ctx: RunContext, out: StageOutput):
        return TorchRunner(ctx.model.module, ctx.model.example_inputs, name=self.name)


class _Judge(_Sleeper):
    name: ClassVar[str] = "simulate"


def test_a_long_stage_beats_and_work_done_for_a_later_stage_is_timed_there(tiny_vit_file, tmp_path):
    """A line every ``every_s`` while a stage runs; seconds a stage spent on the next stage's work
    (``later_work_s``) are moved to that stage, so that a stage run inside another's call has a time."""
    model, _, calib, parity, _ = prepare(f"python:{tiny_vit_file}:build_with_inputs", "cpu", overrides=FAST)
    target = _engine_cpu()
    lines: list[str] = []
    arts = run_pipeline(model, target, tmp_path, calib=calib, parity_data=parity, log=lines.append,
                        stages=[_Sleeper(2.6, for_next_s=2.0), _Judge(0.0, 0.0)], heartbeat=Heartbeat(every_s=1.0))
    assert arts.passed
    beats = [l for l in lines if l.startswith("build_engine: still running, ")]
    assert len(beats) >= 2 and beats[0] == "build_engine: still running, 1 s", lines
    assert lines.index(beats[-1]) < next(i for i, l in enumerate(lines) if l.split()[1] == "build_engine")  # all before its line
    assert not any(l.startswith("simulate: still running") for l in lines)  # a short stage: no line
    assert 0.6 <= arts.stage_seconds["build_engine"] < 2.0 and arts.stage_seconds["simulate"] >= 2.0
    assert "(2." in next(l for l in lines if l.split()[1] == "simulate")  # its printed time is the moved one


@pytest.mark.slow
def test_the_cli_sets_a_failed_int8_model_aside_and_a_rerun_says_what_it_resumed(tiny_vit_file, tmp_path):
    """What a user sees: exit 1 leaves no model.int8.onnx in OUT and ends with a REJECTED line; a
    passing re-run into the same folder says "resumed" for each stage it took from the first run,
    with that run's times, and moves nothing aside."""
    out, model = tmp_path / "o", f"python:{tiny_vit_file}:build_with_inputs"
    sets = [a for kv in FAST for a in ("--set", kv)]
    strict = ["--set", "parity.quantize_int8.cosine_min=0.99999999", "--set", "quantization.fallback.enabled=false"]
    first = run_cli("export", "--model", model, "--target", "cpu", "--out", str(out), *sets, *strict)
    assert first.returncode == 1, first.stderr
    last = first.stdout.strip().splitlines()[-1]
    assert last.startswith("REJECTED: quantize_int8 failed its gate (cosine_min ") and "model.int8.onnx" in last
    assert "must not ship" in last and len(first.stderr.strip().splitlines()) == 1  # the error stays one line
    assert not (out / INT8_ONNX).exists() and (out / REJECTED_DIR / INT8_ONNX).is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "rejected" and manifest["rejected"]["stage"] == "quantize_int8"
    assert manifest["rejected"]["limit"] == 0.99999999 and manifest["rejected"]["value"] < 0.99999999

    times = dict(re.findall(r"^\[pass\] (export_onnx|simplify) .* \((\d+\.\d\d)s", first.stdout, re.M))
    again = run_cli("export", "--model", model, "--target", "cpu", "--out", str(out), *sets)
    assert again.returncode == 0, again.stderr
    for stage in ("export_onnx", "simplify"):
        assert re.search(rf"^\[pass\] {stage} .* resumed from OUT \(took {times[stage]} s on \d{{4}}-\d\d-\d\d ",
                         again.stdout, re.M), again.stdout
    assert (out / INT8_ONNX).is_file() and not (out / REJECTED_DIR).exists()
    assert json.loads((out / "manifest.json").read_text())["status"] == "passed"
