"""Float models with weights held once outside the protobuf (FloatSession, spill to disk)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from vitexport.calibration.session import FloatSession, is_placeholder, materialize, spill_to_disk, split_weights


def _model():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 128)).astype(np.float32)  # 32 KB: split
    b = rng.standard_normal((128,)).astype(np.float32)  # 512 B: stays
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["output"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 128])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), w


def test_split_feed_and_spill(tmp_path):
    model, w = _model()
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    sk, arrays = split_weights(model)
    assert list(arrays) == ["w"] and np.array_equal(arrays["w"], w)
    inits = {i.name: i for i in sk.graph.initializer}
    assert is_placeholder(inits["w"]) and not inits["w"].raw_data and not is_placeholder(inits["b"])
    assert np.array_equal(numpy_helper.to_array(materialize(inits["w"], arrays)), w)
    got = FloatSession(sk, arrays).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # extra outputs of an intermediate tensor
    h = FloatSession(sk, arrays, outputs=["h"]).run(["h"], {"x": x})[0]
    np.testing.assert_allclose(h, x @ w, rtol=1e-5, atol=1e-5)
    assert spill_to_disk(arrays, tmp_path / "w.bin", min_total=0)
    assert isinstance(arrays["w"], np.memmap) and np.array_equal(arrays["w"], w)
    np.testing.assert_allclose(FloatSession(sk, arrays).run(None, {"x": x})[0], want, rtol=1e-6)
    assert not spill_to_disk(arrays, tmp_path / "none.bin")  # below the default threshold: nothing
    assert not (tmp_path / "none.bin").exists()
    onnx.checker.check_model(model)
