"""The stage list a recipe gets: the Stage protocol, order, toggles, and what a target contributes."""
from __future__ import annotations

import json

import pytest

from vitexport.targets.tensorrt.runner import tensorrt_available
from vitexport.recipe import PASS_STAGES, StageName
from vitexport.stages import Contribution, QuantizeStage, Stage, content_key, pipeline_stages
from vitexport.targets import load_recipe, load_target, registered_targets
from vitexport.targets.tensorrt.engine import TENSORRT, BuildEngineStage


@pytest.mark.parametrize("name", list(registered_targets()))
def test_every_target_gets_its_stages_in_pipeline_order(name):
    target = load_target(name)
    recipe = target.recipe
    stages = pipeline_stages(target)
    assert all(isinstance(s, Stage) for s in stages)
    names = [s.name for s in stages]
    assert names == [n for n in recipe.stage_names() if n in names] and len(set(names)) == len(names)
    assert names[:7] == [*PASS_STAGES, StageName.export_onnx, StageName.simplify, StageName.quantize_int8]
    # only the torch stages read the torch model: the loop frees it after the export, or after the compile of a
    # target whose compiler reads the torch program (ethos-u: ExecuTorch quantizes what the passes left)
    torch_stages = [s.name for s in stages if s.needs_torch]
    head = [*PASS_STAGES, StageName.export_onnx]
    assert torch_stages[:len(head)] == head
    assert torch_stages[len(head):] == (["build_engine"] if name.startswith("ethos-u") else [])
    for stage in stages:
        assert recipe.tolerance(stage.name) is getattr(recipe.parity, stage.name)


def test_the_orin_target_contributes_the_engine_stage_and_script():
    orin, cpu, npu = (load_target(n) for n in ("orin", "cpu", "npu"))
    assert orin.contribution() is TENSORRT and load_target("orin-jp5").contribution() is TENSORRT
    assert cpu.contribution() == npu.contribution() == Contribution()
    assert [s.name for s in pipeline_stages(orin)][-1] == "build_engine"
    assert "build_engine" not in [s.name for s in pipeline_stages(cpu)]
    quantize = next(s for s in pipeline_stages(orin) if isinstance(s, QuantizeStage))
    assert quantize.artifacts == TENSORRT.artifacts  # build_engine.sh is written with the Q/DQ model


def test_the_engine_stage_follows_both_toggles():
    stage = BuildEngineStage()
    assert stage.enabled(load_recipe("orin"))
    assert not stage.enabled(load_recipe("orin", ["stages.build_engine.enabled=false"]))
    assert not stage.enabled(load_recipe("orin", ["stages.quantize_int8.enabled=false"]))  # nothing to build


def test_content_keys_hash_values_not_identities():
    assert content_key("a", {"x": 1, "y": [2]}) == content_key("a", {"y": [2], "x": 1})
    assert content_key("a", b"\x00") != content_key("a", b"\x01") != content_key("b", b"\x01")
    assert content_key(StageName.simplify) == content_key("simplify")


@pytest.mark.tensorrt
@pytest.mark.skipif(not tensorrt_available(), reason="needs the tensorrt package and an NVIDIA GPU")
@pytest.mark.parametrize("recipe", ["orin", "orin-jp5"])
def test_engine_stage_builds_and_gates_the_engine(recipe, tmp_path):  # pragma: no cover - needs TensorRT
    """The engine is built the way the target says (strongly typed or not) and passes its gate."""
    from cli_helpers import run_cli

    proc = run_cli("export", "--target", recipe, "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    stages = {s["stage"]: s for s in json.loads((tmp_path / "parity.json").read_text())["stages"]}
    assert stages["build_engine"]["engine"] == "tensorrt" and stages["build_engine"]["passed"]
    assert (tmp_path / "model.int8.plan").stat().st_size > 0


_FLOAT64_SAMPLER = '''
import torch
import torch.nn.functional as F


class Sampler(torch.nn.Module):
    """Samples its input in float64 on a grid computed in float64, and returns float64: an interface the export
    keeps (float64 between float32 inputs and outputs, as in Mask2Former, is written in float32)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Conv2d(3, 4, 1)

    def forward(self, x):
        h = self.proj(x)
        grid = torch.tanh(h[:, :2].permute(0, 2, 3, 1)).double()
        return F.grid_sample(h.double(), grid, align_corners=False).mean((2, 3))


def build():
    torch.manual_seed(0)
    return Sampler()
'''


def test_an_op_onnx_runtime_cannot_run_is_exit_2_naming_the_node(tmp_path, capsys):
    from vitexport.cli import main

    (tmp_path / "sampler.py").write_text(_FLOAT64_SAMPLER)
    rc = main(["export", "--model", f"python:{tmp_path / 'sampler.py'}:build", "--input-shape", "1,3,8,8",
               "--target", "cpu", "--out", str(tmp_path / "o"), "--set", "parity_data.synthetic_samples=4",
               "--set", "calibration.num_samples=4"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "ONNX Runtime" in err and "has no CPU kernel for node '" in err and "GridSample-16 on float64 inputs" in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()


def test_a_stage_max_abs_limit_sits_on_the_error_the_stages_before_it_left():
    """Every stage is compared with the untouched model: a fold after a reparameterisation that left 2e-5
    (within its own 1e-4) may add its own 1e-5 to that, not fail for what it did not do (timm's LeViT)."""
    from vitexport.parity.metrics import Check
    from vitexport.stages import RunContext

    ctx = RunContext(model=None, target=load_target("cpu"), out_dir=None, calib=None, reference=None, unmasked=None, key="")
    own = ctx.recipe.tolerance(StageName.freeze_layernorm).max_abs
    assert ctx.tolerance(StageName.freeze_layernorm).max_abs == own  # nothing carried yet
    ctx.carry([Check("max_abs/ref_scale", 2e-5, 1e-4, "<=", True), Check("cosine_min", 1.0, 0.99, ">=", True)])
    assert ctx.tolerance(StageName.freeze_layernorm).max_abs == pytest.approx(own + 2e-5)
    # per output: the largest; a stage without a max_abs gate carries nothing new
    ctx.carry([Check("max_abs/ref_scale[a]", 1e-6, 1e-5, "<=", True), Check("max_abs/ref_scale[b]", 3e-6, 1e-5, "<=", True)])
    ctx.carry([Check("cosine_min", 0.99, 0.98, ">=", True)])
    assert ctx.tolerance(StageName.export_onnx).max_abs == pytest.approx(ctx.recipe.tolerance(StageName.export_onnx).max_abs + 3e-6)
    # the INT8 stage has no max_abs gate: nothing to add to
    assert ctx.tolerance(StageName.quantize_int8).max_abs is None
    # an absolute error is not added to a relative limit
    ctx.carry([Check("max_abs", 0.5, 1.0, "<=", True)])
    assert ctx.tolerance(StageName.freeze_layernorm).max_abs == own
