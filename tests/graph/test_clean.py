"""vitexport.graph.clean: the final pass every saved file goes through (save_model)."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_census import census

from vitexport.graph import load_model, save_model
from vitexport.graph.clean import clean_model


def _messy(width: int = 8) -> onnx.ModelProto:
    """x, mask → MatMul 'mm' → Add (nameless) → y, written out of order, with an unused initializer
    'stale', a dead Q/DQ chain on x, a value_info naming a removed tensor, two nodes named 'dup'
    and an input 'mask' no node reads."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((width, 6)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b"),
             numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.int8(0), "z"),
             numpy_helper.from_array(np.ones(5, np.float32), "stale")]
    nodes = [helper.make_node("Add", ["h", "b"], ["y"]),  # nameless, and before its input's producer
             helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="dup"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xdq"], name="dup")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, width]),
                                       helper.make_tensor_value_info("mask", TensorProto.INT64, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])], inits,
                          value_info=[helper.make_tensor_value_info("gone", TensorProto.FLOAT, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _run(path, x):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x, "mask": np.ones((2, 8), np.int64)})[0]


def test_a_saved_model_carries_nothing_dead_and_keeps_its_inputs(tmp_path):
    src = tmp_path / "messy.onnx"
    onnx.save(_messy(), str(src))  # onnx's own writer: the file as another tool would leave it
    before = census(src)
    assert before["unused_initializers"] == ["s", "z", "stale"] and before["dead_nodes"] == ["dup", "dup"]
    assert before["nameless_nodes"] == ["Add"] and before["dangling_value_info"] == ["gone"]

    model = load_model(src)
    report = clean_model(model)
    assert report.changed > 0 and "unused initializers removed: 3" in report.notes
    assert "unused nodes removed: 2" in report.notes and "nodes sorted topologically" in report.notes
    assert report.skipped == {"input 'mask'": "no node reads it; kept: inputs are the model's interface"}
    out = tmp_path / "clean.onnx"
    save_model(model, out)
    found = census(out)
    assert found["unused_inputs"] == ["mask"]  # the interface stays (graph.clean's docstring)
    assert not any(v for k, v in found.items() if k != "unused_inputs"), found
    g = onnx.load(str(out)).graph
    assert [n.name for n in g.node] == ["mm", "Add_y"] and [i.name for i in g.input] == ["x", "mask"]
    # the intermediate tensor, typed and shaped by inference (onnx-ir also types the initializers)
    assert {"h"} <= {v.name for v in g.value_info} <= {"h", "w", "b"}
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    w, b = (numpy_helper.to_array(t) for t in _messy().graph.initializer[:2])
    np.testing.assert_allclose(_run(out, x), x @ w + b, rtol=1e-6)
    # ONNX Runtime refuses the source outright: "two nodes with same node name" (lint.duplicate_node_name)
    with pytest.raises(Exception, match="same node name"):
        _run(src, x)


def test_cleaning_is_deterministic_and_idempotent(tmp_path):
    first, second = tmp_path / "a.onnx", tmp_path / "b.onnx"
    save_model(load_model(_save(tmp_path)), first)
    save_model(load_model(_save(tmp_path)), second)
    assert first.read_bytes() == second.read_bytes()
    again = load_model(first)
    assert clean_model(again).changed == 0
    save_model(again, tmp_path / "c.onnx")
    assert (tmp_path / "c.onnx").read_bytes() == first.read_bytes()


def test_initializer_order_survives_shape_inference():
    """onnx-ir's bridge to onnx.shape_inference re-adds initializers over 1 kB last; the pass puts
    them back, so the file lists its weights in the order the model had them."""
    model = ir.from_proto(_messy(width=64))  # 'w': 64 x 6 floats, 1.5 kB
    clean_model(model)
    assert list(model.graph.initializers) == ["w", "b"]


def _save(tmp_path) -> str:
    path = tmp_path / "src.onnx"
    onnx.save(_messy(), str(path))
    return str(path)
