"""The TensorRT targets' artifacts: build_engine.sh (always) and a TensorRT engine (only where TensorRT and a GPU are)."""
from __future__ import annotations

import importlib.util
import os
import stat
import subprocess

import pytest

from qcases import target
from vitexport.targets.tensorrt.runner import tensorrt_available
from vitexport.errors import BadInput
from vitexport.quantize import quantize_int8
from vitexport.targets.tensorrt.engine import build_engine, write_engine_script


def test_engine_script_tensorrt10(tmp_path):
    onnx_path = tmp_path / "model.int8.onnx"
    onnx_path.write_bytes(b"")
    script = write_engine_script(onnx_path, tmp_path / "build_engine.sh", target("orin"))
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash")
    assert "--onnx=model.int8.onnx" in text and "--stronglyTyped" in text and "--saveEngine=model.int8.plan" in text
    assert "--int8" not in text and "--fp16" not in text  # not allowed with --stronglyTyped
    assert os.stat(script).st_mode & stat.S_IXUSR
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert not list(tmp_path.glob(".build_engine.sh.*")), "no temporary file left behind"


def test_engine_script_tensorrt8_for_jetpack5(tmp_path):
    script = write_engine_script(tmp_path / "out" / "model.int8.onnx", tmp_path / "build_engine.sh", target("orin-jp5"))
    text = script.read_text()
    assert "--stronglyTyped" not in text and "--int8 --fp16" in text
    assert "--onnx=out/model.int8.onnx" in text and "--saveEngine=out/model.int8.plan" in text


def test_engine_script_runs_trtexec_from_path(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "trtexec").write_text('#!/usr/bin/env bash\necho "ARGS $*"\n')
    (fake / "trtexec").chmod(0o755)
    script = write_engine_script(tmp_path / "model.int8.onnx", tmp_path / "build_engine.sh", target("orin"))
    res = subprocess.run([str(script), "--verbose"], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"})
    assert res.returncode == 0
    assert res.stdout.split() == ["ARGS", "--onnx=model.int8.onnx", "--stronglyTyped", "--saveEngine=model.int8.plan",
                                  "--memPoolSize=workspace:2048", "--skipInference", "--verbose"]


@pytest.mark.skipif(tensorrt_available(), reason="TensorRT is available here")
def test_build_engine_without_tensorrt_is_a_clean_error(tmp_path):
    with pytest.raises(BadInput, match="tensorrt"):
        build_engine(tmp_path / "model.int8.onnx", tmp_path / "model.int8.plan")
    assert not (tmp_path / "model.int8.plan").exists()


@pytest.mark.tensorrt
@pytest.mark.skipif(not tensorrt_available(), reason="needs the tensorrt package and an NVIDIA GPU")
def test_build_engine_with_tensorrt(vit17, tmp_path):  # pragma: no cover - needs TensorRT
    import numpy as np

    from vitexport.targets.tensorrt.runner import TensorRTRunner
    from vitexport.parity.metrics import compute_metrics

    out = tmp_path / "model.int8.onnx"
    quantize_int8(vit17.path, out, vit17.calib, target("orin", "quantization.fallback.enabled=false"), tmp_path)
    plan = build_engine(out, tmp_path / "model.int8.plan")
    assert plan.stat().st_size > 0
    with TensorRTRunner(plan) as r:
        got = np.concatenate([r.infer(f)["output"] for f in vit17.feeds])
    assert compute_metrics(vit17.reference, got).cosine_min >= 0.98


def test_a_folder_named_tensorrt_is_not_tensorrt(monkeypatch, tmp_path):
    """pytest puts tests/targets/ on sys.path, and tests/targets/tensorrt/ then imports as an empty
    namespace package: the check must not take it for the installed TensorRT."""
    from vitexport.targets.tensorrt.runner import tensorrt_missing

    (tmp_path / "tensorrt").mkdir()
    (tmp_path / "polygraphy").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    missing = tensorrt_missing()
    if importlib.util.find_spec("tensorrt").origin is None:
        assert "tensorrt" in missing
    if importlib.util.find_spec("polygraphy").origin is None:
        assert "polygraphy" in missing


@pytest.mark.skipif(tensorrt_available(), reason="TensorRT is available here")
def test_parity_compare_opens_a_plan_through_the_orin_target(tmp_path):
    """``vitexport parity --compare A model.plan``: the plan reaches TensorRT's runner through the orin
    target's ``open_artifact`` (parity/ names no backend), which says what is missing here."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from vitexport.api import compare

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["output"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "a.onnx")
    np.savez(tmp_path / "d.npz", x=np.ones((2, 4), np.float32))
    (tmp_path / "model.plan").write_bytes(b"not an engine")
    with pytest.raises(BadInput, match=r"running the TensorRT engine model\.plan needs the 'tensorrt' extra"):
        compare(str(tmp_path / "a.onnx"), str(tmp_path / "model.plan"), tmp_path / "d.npz")
