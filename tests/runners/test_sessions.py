"""The one session factory: weights fed from the model's own arrays, intermediate outputs, configs."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vitexport.runners.sessions import CALIBRATION, LOW_MEMORY, QDQ_AS_FLOAT, TIMING, Session
from vitexport.graph import load_model, save_model


def _model(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 128)).astype(np.float32)  # 32 KB: fed as an input
    b = rng.standard_normal((128,)).astype(np.float32)  # 512 B: stays a constant
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["output"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 128])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, str(tmp_path / "m.onnx"))
    return tmp_path / "m.onnx", w


def test_ir_model_weights_are_fed_without_a_copy(tmp_path):
    path, w = _model(tmp_path)
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    save_model(ir.load(str(path)), tmp_path / "ext.onnx", external_min_bytes=1024)
    model = load_model(tmp_path / "ext.onnx")  # weights memory-mapped from ext.onnx.data
    sess = Session(model, LOW_MEMORY)
    assert list(sess.weights) == ["w"] and sess.input_names == ["x"]
    assert np.shares_memory(sess.weights["w"], model.graph.initializers["w"].const_value.numpy())
    np.testing.assert_allclose(sess.run(None, {"x": x, "unused": x})[0], want, rtol=1e-6)
    h = Session(model, LOW_MEMORY, outputs=["h"]).run(["h"], {"x": x})[0]  # an intermediate tensor
    np.testing.assert_allclose(h, x @ w, rtol=1e-5, atol=1e-5)


def test_a_calibration_session_prepacks_the_models_own_arrays(tmp_path):
    path, w = _model(tmp_path)
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    save_model(ir.load(str(path)), tmp_path / "ext.onnx", external_min_bytes=1024)
    model = load_model(tmp_path / "ext.onnx")
    sess = Session(model, CALIBRATION)
    assert sess.weights == {} and sess.input_names == ["x"]  # the weight is an initializer now, nothing to feed
    arrays, values = sess._shared
    assert np.shares_memory(arrays["w"], model.graph.initializers["w"].const_value.numpy())  # handed over, not copied
    with pytest.raises(RuntimeError, match="does not have configuration"):  # pre-packing left on
        sess.session.get_session_options().get_session_config_entry("session.disable_prepacking")
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], Session(model, LOW_MEMORY).run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)
    h = Session(model, CALIBRATION, outputs=["h"]).run(["h"], {"x": x})[0]  # intermediate tensors too
    np.testing.assert_allclose(h, x @ w, rtol=1e-5, atol=1e-5)
    assert model.graph.initializers["w"].const_value is not None and "w" not in [v.name for v in model.graph.inputs]


def test_configs_reach_onnx_runtime(tmp_path):
    path, _ = _model(tmp_path)
    opts = Session(path, QDQ_AS_FLOAT).session.get_session_options()
    assert opts.get_session_config_entry("session.disable_quant_qdq") == "1"
    assert opts.get_session_config_entry("session.disable_prepacking") == "1"
    # a Q/DQ evaluation recycles buffers in an arena, without the pattern's whole-run block; calibration has neither
    assert opts.enable_cpu_mem_arena and not opts.enable_mem_pattern
    assert not Session(path, LOW_MEMORY).session.get_session_options().enable_cpu_mem_arena
    timing = Session(path, TIMING)
    assert timing.weights == {}  # a timed session reads the file itself: pre-packed constant weights
    assert timing.session.get_session_options().intra_op_num_threads == 2


def _qdq_model() -> ir.Model:
    """x → MatMul(DequantizeLinear(int8 weight)): the weight is a quantized constant."""
    rng = np.random.default_rng(2)
    q = rng.integers(-127, 128, (256, 256), dtype=np.int8)  # 64 KB of int8: not a float weight to feed
    g = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["q", "s"], ["w"]), helper.make_node("MatMul", ["x", "w"], ["output"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 256])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 256])],
        [numpy_helper.from_array(q, "q"), numpy_helper.from_array(np.float32(0.01), "s")],
    )
    return ir.from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_in_memory_model_with_large_constants_goes_through_a_file(tmp_path, monkeypatch):
    import vitexport.runners.sessions as sessions

    model = _qdq_model()
    x = np.random.default_rng(3).standard_normal((2, 256)).astype(np.float32)
    small = Session(model, QDQ_AS_FLOAT).run(None, {"x": x})[0]  # serialised: below the threshold
    monkeypatch.setattr(sessions, "_FILE_MIN_BYTES", 1024)
    monkeypatch.setattr(sessions.tempfile, "tempdir", str(tmp_path))
    sess = Session(model, QDQ_AS_FLOAT)
    assert sess.weights == {}  # the int8 weight stays a constant: ONNX Runtime folds its dequantization
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], small)
    np.testing.assert_allclose(small, x @ (model.graph.initializers["q"].const_value.numpy() * np.float32(0.01)),
                               rtol=1e-5, atol=1e-4)
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone once the session holds the model
    assert model.graph.initializers["q"].const_value is not None  # the model is untouched
