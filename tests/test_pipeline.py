"""The staged pipeline through the Python API: ownership of the source model, the INT8 gate's runtime."""
from __future__ import annotations

import json

import numpy as np
import torch

from vitexport.api import prepare
from vitexport.pipeline import run_pipeline

FAST = ("calibration.num_samples=16", "parity_data.synthetic_samples=8", "quantization.measure_latency=false")


def _run(tiny_vit_file, out, target="orin", keep_source=True):
    model, recipe, calib, parity, notes = prepare(f"python:{tiny_vit_file}:build_with_inputs", target, overrides=FAST)
    before = {k: v.clone() for k, v in model.module.state_dict().items()}
    arts = run_pipeline(model, recipe, out, calib=calib, parity_data=parity, keep_source=keep_source)
    return model, before, arts


def test_kept_source_is_untouched(tiny_vit_file, tmp_path):
    model, before, arts = _run(tiny_vit_file, tmp_path / "a")
    assert arts.passed
    after = model.module.state_dict()
    assert after.keys() == before.keys()  # the LayerNorm affine terms were frozen in a copy, not here
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_consumed_source_gives_the_same_artifacts(tiny_vit_file, tmp_path):
    """Handing the model over (the CLI's way, to free its weights before ONNX work) changes no byte."""
    _, _, kept = _run(tiny_vit_file, tmp_path / "a")
    model, _, consumed = _run(tiny_vit_file, tmp_path / "b", keep_source=False)
    assert consumed.passed and model.module is None
    for name in ("model.fp32.onnx", "model.int8.onnx"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


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
