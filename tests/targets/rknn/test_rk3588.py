"""The rk3588 target end to end: a timm ViT through the whole pipeline into ``model.rknn`` with
rknn-toolkit2 for real (its worker, its simulator), what RKNN's op table says the NPU runs, and the
clear exit 2 when the toolchain is missing. The pipeline test skips (saying why) only where
``make setup-rknn`` could not make the venv."""
from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
import timm
import torch

from cli_helpers import run_cli
from vitexport.calibration.data import NpzSamples
from vitexport.pipeline import run_pipeline
from vitexport.progress import Heartbeat
from vitexport.sources.base import LoadedModel, OutputAdapter
from vitexport.targets import load_target
from vitexport.targets.rknn.client import RKNN_VENV_ENV, rknn_missing

IMG = 32


@pytest.fixture(scope="module")
def rknn():
    missing = rknn_missing()
    if missing:
        pytest.skip(missing)


def _vit() -> tuple[LoadedModel, NpzSamples, NpzSamples]:
    """ViT-Tiny width (192, 3 heads), two blocks at 32x32 with 8x8 patches (16 tokens + cls)."""
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, img_size=IMG, patch_size=8,
                            num_classes=10)
    module = OutputAdapter(vit.eval(), ["image"], keyword=False).eval()
    images = np.random.default_rng(0).standard_normal((40, 3, IMG, IMG)).astype(np.float32)
    model = LoadedModel(module, {"image": torch.from_numpy(images[:1])}, "vit_tiny", "timm", "timm:vit_tiny(depth=2)")
    return model, NpzSamples({"image": images[:32]}), NpzSamples({"image": images[32:]})


@pytest.mark.slow
def test_a_vit_compiles_to_rknn_all_on_the_npu_in_int8_and_passes_the_simulator(rknn, tmp_path):
    model, calib, parity = _vit()
    target = load_target("rk3588", ["quantization.measure_latency=false", "target_options.calibration_samples=8"])
    lines: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arts = run_pipeline(model, target, tmp_path / "out", calib=calib, parity_data=parity, log=lines.append,
                            heartbeat=Heartbeat(every_s=2.0))
    assert arts.passed
    stages = {s.stage: s for s in arts.parity.stages}
    assert {"build_engine", "simulate"} <= set(stages)
    # the worker call that compiles also runs the simulator: its time is simulate's, not 0
    assert stages["simulate"].seconds > 0.05 and stages["build_engine"].seconds > stages["simulate"].seconds
    # the compile's wait shows, with the worker's step
    assert any(l.startswith("build_engine: still running, ") and "(rknn-toolkit2: " in l for l in lines), lines
    assert stages["simulate"].metrics.cosine_min > 0.99  # random init, synthetic inputs: near the float model
    assert (tmp_path / "out" / "model.rknn").stat().st_size > 0
    runtime = json.loads((tmp_path / "out" / "manifest.json").read_text())["runtime"]["build_engine"]
    assert runtime["route"] == "qdq" and runtime["on_cpu"] == [] and runtime["on_npu"] == runtime["ops"]
    assert runtime["int8_share"] >= 0.95, runtime["macs_by_dtype"]


def test_a_missing_toolchain_is_exit_2_naming_the_make_target_before_any_work(tmp_path):
    env = {**os.environ, RKNN_VENV_ENV: str(tmp_path / "nowhere")}
    proc = run_cli("export", "--target", "rk3588", "--out", str(tmp_path / "out"), env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "make setup-rknn" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_an_unknown_route_is_exit_2_naming_the_key(tmp_path):
    proc = run_cli("export", "--target", "rk3588", "--set", "target_options.route=fastest",
                   "--out", str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 2
    assert "target_options.route" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_model_whose_weights_sit_in_a_data_file_compiles_and_is_gated(rknn, tmp_path, monkeypatch):
    """A large model (all-mpnet-base-v2: 420 MB) is saved with its weights in ``<name>.data``: the laid-out
    file RKNN compiled moved into the output folder without it, and the build_engine gate's ONNX Runtime session
    failed ("External data path does not exist", exit 3). Here every saved model takes a data file."""
    monkeypatch.setattr("vitexport.graph.files.EXTERNAL_DATA_MIN_BYTES", 0)
    model, calib, parity = _vit()
    target = load_target("rk3588", ["quantization.measure_latency=false", "target_options.calibration_samples=8"])
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arts = run_pipeline(model, target, out, calib=calib, parity_data=parity)
    assert arts.passed and "build_engine" in {s.stage for s in arts.parity.stages}
    assert (out / "model.int8.onnx.data").is_file() and (out / "model.rknn.onnx.data").is_file()
    assert not list(out.glob(".rknn-*"))  # the compile's scratch folder is gone
