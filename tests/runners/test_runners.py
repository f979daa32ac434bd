"""Runners behind one interface: torch, ONNX Runtime, the ONNX reference evaluator, and TensorRT's (in its
backend folder, vitexport/targets/tensorrt/)."""
from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from vitexport.runners import BaseRunner, OnnxReferenceRunner, OnnxRuntimeRunner, TorchRunner, primary_output
from vitexport.targets.tensorrt.runner import TensorRTRunner, require_tensorrt, tensorrt_available, tensorrt_missing
from vitexport.errors import BadInput


class _Net(nn.Module):
    """Two inputs (float image, int token ids), LayerNorm, attention-like matmul, a classifier."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Conv2d(3, 16, 4, 4)
        self.tok = nn.Embedding(20, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 5)

    def forward(self, x, ids):
        t = self.embed(x).flatten(2).transpose(1, 2) + self.tok(ids)
        h = self.norm(t)
        a = (h @ h.transpose(1, 2) / 4).softmax(-1) @ h
        return self.head((t + a).mean(1))


@pytest.fixture(scope="module")
def net_and_onnx(tmp_path_factory):
    net = _Net().eval()
    ex = {"x": torch.randn(2, 3, 8, 8), "ids": torch.randint(0, 20, (2, 4))}
    path = tmp_path_factory.mktemp("runners") / "net.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, tuple(ex.values()), str(path), input_names=list(ex), output_names=["logits"],
                          dynamo=False, opset_version=17)
    feed = {"x": np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32),
            "ids": np.random.default_rng(1).integers(0, 20, (2, 4)).astype(np.int64)}
    return net, ex, path, feed


def test_three_runners_agree(net_and_onnx):
    net, ex, path, feed = net_and_onnx
    outs = {}
    for runner in (TorchRunner(net, ex), OnnxRuntimeRunner(path), OnnxReferenceRunner(path)):
        with runner:
            assert runner.is_active
            outs[runner.engine] = runner.infer(feed)
        assert not runner.is_active
    assert set(outs) == {"torch", "onnxruntime", "onnx-reference"}
    for name, out in outs.items():
        assert list(out) == ["output"] and out["output"].shape == (2, 5), name
        np.testing.assert_allclose(out["output"], outs["torch"]["output"], rtol=1e-4, atol=1e-5)


def test_inputs_are_checked_in_the_base_class(net_and_onnx):
    _, _, path, feed = net_and_onnx
    with OnnxRuntimeRunner(path) as r:
        with pytest.raises(BadInput, match=r"missing \['ids'\]"):
            r.infer({"x": feed["x"]})
        with pytest.raises(BadInput, match=r"unexpected \['y'\]"):
            r.infer({**feed, "y": feed["x"]})
        with pytest.raises(BadInput, match="has shape"):
            r.infer({**feed, "x": feed["x"][:, :, :4]})
        with pytest.raises(BadInput, match="has shape"):
            r.infer({**feed, "x": feed["x"][:1]})  # a static batch of 2
        out64 = r.infer({**feed, "x": feed["x"].astype(np.float64), "ids": feed["ids"].astype(np.int32)})
        np.testing.assert_array_equal(out64["output"], r.infer(feed)["output"])  # dtypes cast to the model's


def test_torch_runner_batch_is_dynamic(net_and_onnx):
    net, ex, _, feed = net_and_onnx
    with TorchRunner(net, ex) as r:
        assert [s.shape for s in r.input_specs()] == [(-1, 3, 8, 8), (-1, 4)]
        both = r.infer_batches([{k: v[:1] for k, v in feed.items()}, {k: v[1:] for k, v in feed.items()}])
        np.testing.assert_allclose(both["output"], r.infer(feed)["output"], rtol=1e-5, atol=1e-6)


def test_infer_before_activate_is_a_bug():
    r = OnnxReferenceRunner("unused.onnx")
    with pytest.raises(RuntimeError, match="before activate"):
        r.infer({})


def test_ort_named_outputs(net_and_onnx):
    _, _, path, feed = net_and_onnx
    import onnx

    model = onnx.load(str(path))
    inner = next(n.output[0] for n in model.graph.node if n.op_type == "LayerNormalization")
    with OnnxRuntimeRunner(path, output_names=["logits", inner]) as r:  # an intermediate tensor, asked for by name
        out = r.infer(feed)
    assert list(out) == ["logits", inner] and out[inner].shape == (2, 4, 16)
    model.graph.output.append(onnx.helper.make_tensor_value_info(inner, onnx.TensorProto.FLOAT, None))
    with OnnxRuntimeRunner(model.SerializeToString()) as r:  # several graph outputs keep their names
        assert set(r.infer(feed)) == {"logits", inner}


def test_primary_output_shapes():
    t = torch.ones(1, 2)
    assert primary_output(t) is t
    assert primary_output({"logits": t, "aux": torch.zeros(1)}) is t
    assert primary_output((t, torch.zeros(1))) is t
    with pytest.raises(TypeError):
        primary_output({"a": 1})


@pytest.mark.slow
def test_tensorrt_is_imported_lazily():
    """Neither TensorRT, Polygraphy nor matplotlib (report plots) is imported with the package (the
    engine stage and ``vitexport check`` included), and importing configures no logging."""
    code = ("import logging, sys, vitexport.runners, vitexport.parity, vitexport.stages, vitexport.check, "
            "vitexport.quantize, vitexport.cli; print('tensorrt' in sys.modules, 'polygraphy' in sys.modules, "
            "'matplotlib' in sys.modules, bool(logging.getLogger().handlers))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False False False False"
    assert isinstance(tensorrt_available(), bool)
    # ONNX-only work (quantize, calibrate, compare two ONNX files) does not import torch either
    code = ("import sys, vitexport.quantize, vitexport.calibration, vitexport.parity, vitexport.runners, "
            "vitexport.targets, vitexport.check; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    assert issubclass(TensorRTRunner, BaseRunner) and TensorRTRunner.engine == "tensorrt"


@pytest.mark.skipif(tensorrt_available(), reason="TensorRT, Polygraphy and a GPU are all here")
def test_tensorrt_runner_without_tensorrt_is_a_clean_error(tmp_path):
    """The runner names what is missing (a GPU at least, on this machine) in one BadInput line."""
    missing = tensorrt_missing()
    assert missing and set(missing) <= {"tensorrt", "polygraphy", "a CUDA GPU"}
    runner = TensorRTRunner(tmp_path / "model.int8.plan")
    with pytest.raises(BadInput) as err:
        runner.activate()
    msg = str(err.value)
    assert "model.int8.plan" in msg and f"missing here: {', '.join(missing)}" in msg and "\n" not in msg
    assert not runner.is_active
    with pytest.raises(BadInput, match="building a TensorRT engine"):
        require_tensorrt("building a TensorRT engine")


@pytest.mark.tensorrt
@pytest.mark.skipif(not tensorrt_available(), reason="needs tensorrt, polygraphy and an NVIDIA GPU")
def test_tensorrt_runner_matches_onnxruntime(net_and_onnx, tmp_path):  # pragma: no cover - GPU only
    """A float model built strongly typed through Polygraphy (float32 stays float32) runs like ONNX Runtime."""
    from vitexport.targets.tensorrt.engine import build_engine

    _, _, path, feed = net_and_onnx
    plan = build_engine(path, tmp_path / "net.plan", strongly_typed=True)
    with TensorRTRunner(plan) as r, OnnxRuntimeRunner(path) as o:
        assert [s.name for s in r.input_specs()] == ["x", "ids"]
        np.testing.assert_allclose(r.infer(feed)["output"], o.infer(feed)["output"], rtol=1e-3, atol=1e-3)


@pytest.mark.tensorrt
@pytest.mark.skipif(not tensorrt_available(), reason="needs tensorrt, polygraphy and an NVIDIA GPU")
@pytest.mark.parametrize("strongly_typed", [True, False])
def test_tensorrt_qdq_engine_runs_fake_quantization(tmp_path, strongly_typed):  # pragma: no cover - GPU only
    """A Q/DQ model built both ways (TensorRT 10 strongly typed; TensorRT 8's --int8 --fp16) computes
    what ONNX Runtime computes with Q/DQ as float ops."""
    from vitexport.runners import QDQ_AS_FLOAT
    from vitexport.targets.tensorrt.engine import build_engine

    _qdq_matmul(tmp_path / "q.onnx")
    plan = build_engine(tmp_path / "q.onnx", tmp_path / "q.plan", strongly_typed=strongly_typed)
    x = {"x": np.random.default_rng(4).uniform(-3, 3, (3, 6)).astype(np.float32)}
    with TensorRTRunner(plan) as r, OnnxRuntimeRunner(tmp_path / "q.onnx", config=QDQ_AS_FLOAT) as o:
        np.testing.assert_allclose(r.infer(x)["output"], o.infer(x)["output"], rtol=1e-2, atol=2e-2)


def _qdq_matmul(path):
    """x → Q/DQ (scale 0.05) → MatMul with an int8 per-tensor weight → y (float)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(3).integers(-127, 128, (6, 4)).astype(np.int8)
    inits = [numpy_helper.from_array(w, "w_q"), numpy_helper.from_array(np.float32(0.02), "w_s"),
             numpy_helper.from_array(np.int8(0), "zp"), numpy_helper.from_array(np.float32(0.05), "x_s")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "zp"], ["x_q"]),
             helper.make_node("DequantizeLinear", ["x_q", "x_s", "zp"], ["x_dq"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "zp"], ["w_dq"]),
             helper.make_node("MatMul", ["x_dq", "w_dq"], ["y"])]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return w.astype(np.float32) * np.float32(0.02)


def test_ort_runner_config_runs_qdq_as_float(tmp_path):
    """``config`` reaches the session; with QDQ_AS_FLOAT the runner computes exact fake quantization."""
    from vitexport.runners import QDQ_AS_FLOAT

    w = _qdq_matmul(tmp_path / "q.onnx")
    x = np.random.default_rng(4).uniform(-3, 3, (3, 6)).astype(np.float32)
    x_fq = np.clip(np.round(x / np.float32(0.05)), -128, 127).astype(np.float32) * np.float32(0.05)
    with OnnxRuntimeRunner(tmp_path / "q.onnx", config=QDQ_AS_FLOAT) as r:
        opts = r.session.session.get_session_options()
        assert opts.get_session_config_entry("session.disable_quant_qdq") == "1"
        y = r.infer({"x": x})["output"]
    np.testing.assert_allclose(y, x_fq @ w, rtol=1e-5, atol=1e-5)
    with OnnxRuntimeRunner(tmp_path / "q.onnx") as r:  # default: ONNX Runtime's own (fused) kernels
        with pytest.raises(RuntimeError, match="does not have configuration"):
            r.session.session.get_session_options().get_session_config_entry("session.disable_quant_qdq")
