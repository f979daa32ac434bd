"""The INT8-share gate (issue 28): every target declares the share of GEMM/Conv multiply-accumulates its
backend must run in INT8 (and, where the backend reports placement, the compute ops it may put on the
CPU); a run below it exits 1 through the parity path (REJECTED, ``rejected/``) naming every float layer,
largest first, with why; ``--set parity.<stage>.int8_share_min=...`` accepts it.

The CLI cases run real models: on orin a ViT whose head size (48) TensorRT fuses no INT8 attention for,
so annotate leaves attention's batched MatMuls float (53 % INT8); on rk3588 a 3x3 conv stack that runs INT8 and exits 0 (0.6 % INT8 before the qdq layout Q/DQ'd conv outputs; the rk3588
failure's reasons are tested on a printed op table in tests/targets/rknn/test_rknn_log.py).
"""
from __future__ import annotations

import json
import textwrap

import pytest

from cli_helpers import run_cli
from vitexport.parity.advice import failure_advice
from vitexport.parity.share import FloatLayer, Int8Share, gate_int8_share
from vitexport.parity.stage import StageResult
from vitexport.recipe import Tolerance
from vitexport.targets import load_recipe, load_target
from vitexport.targets._registry import registered_targets, target_class
from vitexport.targets.rknn.client import rknn_missing


def _share() -> Int8Share:
    return Int8Share(0.5, "the backend's table", 4000, [FloatLayer("small", "Conv", 500, "float16"),
                                                        FloatLayer("big", "Conv", 1500, "float16", "a compiler rule")],
                     cpu_compute=[FloatLayer("sm", "Softmax", 0, "on the CPU")], cpu_moves=["Reshape:r"],
                     hints=["target_options.route=rknn"])


def test_below_the_share_the_stage_fails_naming_the_largest_float_layer_first_and_why():
    res = StageResult(stage="build_engine", engine="x", details={"int8_share": _share().to_dict()})
    gate_int8_share(res, Tolerance(int8_share_min=0.95, cpu_compute_ops_max=0))
    assert not res.passed
    share, cpu = res.checks
    assert (share.metric, share.passed, cpu.metric, cpu.value, cpu.passed) == ("int8_share", False, "cpu_compute_ops", 1, False)
    assert share.why.index("big") < share.why.index("small") and "why: a compiler rule" in share.why
    assert "Reshape" not in cpu.why and "sm (Softmax" in cpu.why  # data movement on the CPU is said, not gated
    note = next(n for n in res.notes if n.startswith("INT8 share: 50.0%"))
    assert "big (Conv, 1.5 k MACs, float16)" in note and "Reshape:r" in note
    advice = failure_advice("build_engine", share, load_recipe("rk3588"), calib_samples=32)
    assert advice.startswith("not in INT8 by the backend's table") and "target_options.route=rknn" in advice
    assert advice.endswith("or accept it: parity.build_engine.int8_share_min=0.5")
    # gated again (a resumed stage, a looser --set): the checks are replaced, not added to
    gate_int8_share(res, Tolerance(int8_share_min=0.5, cpu_compute_ops_max=1))
    assert res.passed and [c.metric for c in res.checks] == ["int8_share", "cpu_compute_ops"]
    assert sum(n.startswith("INT8 share: ") for n in res.notes) == 1


def test_a_stage_without_a_share_or_a_gate_is_left_alone():
    res = StageResult(stage="simulate", engine="x")
    gate_int8_share(res, Tolerance(int8_share_min=0.95))
    assert res.passed and res.checks == []
    res = StageResult(stage="quantize_int8", engine="x", details={"int8_share": _share().to_dict()})
    gate_int8_share(res, Tolerance())  # a stage the target does not gate: the figure is said only
    assert res.passed and res.checks == [] and res.notes[0].startswith("INT8 share: 50.0%")


@pytest.mark.parametrize("name", sorted(registered_targets()))
def test_every_target_declares_its_share_where_its_backend_reports_it(name):
    cls = target_class(name)
    stage = cls.int8_share_stage
    assert stage is not None and 0.5 <= cls.int8_share_min <= 1.0
    tol = load_target(name).recipe.tolerance(stage)
    assert tol.int8_share_min == cls.int8_share_min and tol.cpu_compute_ops_max == cls.cpu_compute_ops_max
    # the recipe overrides it, 0 turns it off, and other stages stay ungated
    assert load_target(name, [f"parity.{stage}.int8_share_min=0.5"]).recipe.tolerance(stage).int8_share_min == 0.5
    assert load_target(name, [f"parity.{stage}.int8_share_min=0"]).recipe.tolerance(stage).int8_share_min == 0
    recipe = load_target(name).recipe
    others = [s for s in ("quantize_int8", *(t.name for t in cls.target_stages)) if s != stage]
    assert all(recipe.tolerance(s).int8_share_min is None for s in others)


def _model(tmp_path, body: str) -> str:
    path = tmp_path / "net.py"
    path.write_text(textwrap.dedent(body))
    return f"python:{path}:build"


WIDE_HEAD = """
    import timm, torch

    def build():
        torch.manual_seed(0)
        # one head of 48: TensorRT fuses no INT8 attention for it, so annotate leaves Q·Kᵀ and attn·V float
        m = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1, img_size=32, patch_size=2,
                              embed_dim=48, num_heads=1, num_classes=10)
        return m.eval(), {"x": torch.randn(1, 3, 32, 32)}
"""

CONV_STACK = """
    import torch
    from torch import nn

    def build():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(16, 10))
        return m.eval(), {"x": torch.randn(1, 3, 16, 16)}
"""


def _fails_then_passes_with_the_share_lowered(tmp_path, target: str, body: str, stage: str, named: list[str],
                                              sets: tuple[str, ...] = ()) -> dict:
    out = tmp_path / "out"
    args = ["export", "--target", target, "--model", _model(tmp_path, body), "--out", str(out),
            "--set", "quantization.measure_latency=false", *(a for s in sets for a in ("--set", s))]
    bad = run_cli(*args)
    assert bad.returncode == 1, bad.stderr[-2000:]
    err = bad.stdout + bad.stderr  # the REJECTED line is the run's last line on stdout
    assert f"parity gate failed at stage '{stage}': int8_share=" in err and "REJECTED" in err
    assert all(n in err for n in named), err
    assert f"accept it: parity.{stage}.int8_share_min=" in err
    assert (out / "rejected").is_dir()
    doc = json.loads((out / "parity.json").read_text())
    failed = next(s for s in doc["stages"] if s["stage"] == stage)
    share = failed["details"]["int8_share"]
    assert share["share"] < 0.9 and share["float_layers"][0]["macs"] >= share["float_layers"][-1]["macs"]
    # accepted explicitly: the stage is resumed from rejected/ and gated again with the lower limit
    ok = run_cli(*args, "--set", f"parity.{stage}.int8_share_min={share['share'] / 2:.4f}")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert f"{stage:<16} onnxruntime" in ok.stdout and "gated again with this run's tolerance" in ok.stdout, ok.stdout
    assert not (out / "rejected").exists()
    return share


@pytest.mark.slow
def test_orin_a_vit_with_float_attention_exits_1_naming_the_matmuls_and_why(tmp_path):
    share = _fails_then_passes_with_the_share_lowered(
        tmp_path, "orin", WIDE_HEAD, "quantize_int8", ["attn/MatMul (MatMul, 3.2 M MACs, FP16)",
                                                       "why: head size 48 is not one TensorRT fuses in INT8"],
        sets=("quantization.fallback.enabled=false",))
    assert 0.5 < share["share"] < 0.6 and len(share["float_layers"]) == 2


@pytest.mark.slow
def test_rk3588_a_conv_stack_runs_int8_and_exits_0(tmp_path):
    """3x3 convs with Relu, global pooling and a Linear: in the qdq layout every conv runs INT8 in
    RKNN's op table (it ran 0.6 % INT8 before the convs' outputs were Q/DQ'd)."""
    missing = rknn_missing()
    if missing:
        pytest.skip(missing)
    out = tmp_path / "out"
    res = run_cli("export", "--target", "rk3588", "--model", _model(tmp_path, CONV_STACK), "--out", str(out),
                  "--set", "quantization.measure_latency=false", "--set", "target_options.calibration_samples=4")
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    doc = json.loads((out / "parity.json").read_text())
    share = next(s for s in doc["stages"] if s["stage"] == "build_engine")["details"]["int8_share"]
    assert share["share"] >= 0.95 and share["cpu_compute"] == [], share
