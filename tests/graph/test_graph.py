"""vitexport.graph: onnx-ir files (external data, atomic pairs), weights lifted as inputs, queries."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from vitexport.errors import BadInput
from vitexport.graph import (
    artifact_files,
    const_array,
    load_model,
    producer_through,
    save_model,
    static_shape,
    uses_through,
    weights_as_inputs,
)


def _model(n: int = 64) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((n, 300)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((300,)).astype(np.float32), "b")
    shape = numpy_helper.from_array(np.asarray([2, 300], np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Reshape", ["h", "shape"], ["r"], name="reshape"),
             helper.make_node("Add", ["r", "b"], ["output"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, n])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 300])], initializer=[w, b, shape])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_weights_as_inputs_lifts_without_copies_and_restores_the_model():
    model = ir.from_proto(_model())
    before = ir.serde.serialize_model(model).SerializeToString()
    with weights_as_inputs(model) as (proto, weights):
        assert list(weights) == ["w"]  # 77 kB float: lifted; the bias (1.2 kB) and the int64 shape stay
        assert weights["w"] is model.graph.inputs[-1].const_value  # the model's own tensor, not a copy
        assert [i.name for i in proto.graph.input] == ["x", "w"]
        assert {t.name for t in proto.graph.initializer} == {"b", "shape"}
    assert ir.serde.serialize_model(model).SerializeToString() == before


def test_weights_as_inputs_restores_the_model_when_the_body_raises():
    model = ir.from_proto(_model())
    before = ir.serde.serialize_model(model).SerializeToString()
    with pytest.raises(RuntimeError), weights_as_inputs(model):
        raise RuntimeError("onnxsim failed")
    assert ir.serde.serialize_model(model).SerializeToString() == before


def test_save_small_model_as_one_file_and_large_with_external_data(tmp_path):
    model = ir.from_proto(_model())
    path = tmp_path / "m.onnx"
    assert save_model(model, path) == [path] and not (tmp_path / "m.onnx.data").exists()
    files = save_model(model, path, external_min_bytes=1024)
    assert files == [path, tmp_path / "m.onnx.data"]
    assert artifact_files(path) == files
    loaded = onnx.load(str(path))  # onnx reads the external data beside the file
    assert np.array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), numpy_helper.to_array(_model().graph.initializer[0]))
    # a model saved small again does not leave the old data file behind
    save_model(model, path)
    assert artifact_files(path) == [path] and not (tmp_path / "m.onnx.data").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_saving_a_model_loaded_with_external_data_elsewhere(tmp_path):
    model = ir.from_proto(_model())
    save_model(model, tmp_path / "a.onnx", external_min_bytes=1024)
    memory_mapped = load_model(tmp_path / "a.onnx")
    save_model(memory_mapped, tmp_path / "b.onnx")  # one self-contained file: the weights are read in
    b = onnx.load(str(tmp_path / "b.onnx"), load_external_data=False)
    assert all(t.data_location != TensorProto.EXTERNAL for t in b.graph.initializer)


@pytest.mark.parametrize("content", [b"", b"\x00\x01garbage", b"\x0a\xff\xff\xff\x0f"])
def test_load_refuses_what_is_not_onnx(tmp_path, content):
    (tmp_path / "bad.onnx").write_bytes(content)
    with pytest.raises(BadInput, match="bad.onnx"):
        load_model(tmp_path / "bad.onnx")
    with pytest.raises(BadInput, match="no such"):
        load_model(tmp_path / "missing.onnx")


def test_queries():
    model = ir.from_proto(_model())
    import onnx_ir.passes.common as common

    common.ShapeInferencePass()(model)
    nodes = {n.name: n for n in model.graph}
    r = nodes["reshape"].outputs[0]
    assert producer_through(r)[0] is nodes["mm"]
    assert [(n.name, i) for n, i in uses_through(nodes["mm"].outputs[0])] == [("add", 0)]
    assert const_array(model.graph.initializers["shape"]).tolist() == [2, 300]
    assert static_shape(model.graph.inputs[0]) == (2, 64)
