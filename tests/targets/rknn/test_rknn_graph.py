"""The float-graph forms RKNN compiles keep the model's function (checked in ONNX Runtime), and the
hazard check names the node and the rule; no RKNN needed here."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
from onnx import helper

from rknn_models import DIM, TOKENS, masked_attention, patch_merging, qdq_patch_conv
from vitexport.targets.rknn.graph import RKNN_FILL, CollapseTransposes, FullShapeMasks, rknn_hazards


def _run(model: ir.Model, x: np.ndarray) -> np.ndarray:
    proto = ir.serde.serialize_model(model)
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_full_shape_masks_keeps_the_output_and_names_the_crash():
    model = ir.serde.deserialize_model(masked_attention())
    x = np.random.RandomState(0).randn(1, 1, TOKENS, DIM).astype(np.float32)
    before = _run(model, x)
    hazards = [str(h) for h in rknn_hazards(model)]
    assert len(hazards) == 1 and "mask_where" in hazards[0] and "segfault" in hazards[0]
    assert "[rknn.where_broadcast]" in hazards[0]
    report = FullShapeMasks()(model).report
    assert report.changed == 1
    where = next(n for n in model.graph if n.op_type == "Where")
    assert tuple(where.inputs[0].const_value.shape) == (1, 1, TOKENS, TOKENS)
    assert float(where.inputs[2].const_value.numpy()) == RKNN_FILL
    np.testing.assert_allclose(_run(model, x), before, rtol=0, atol=1e-6)
    assert rknn_hazards(model) == []
    assert FullShapeMasks()(model).report.changed == 0  # a second run finds nothing to do


def test_a_mask_computed_at_run_time_is_expanded():
    model = ir.serde.deserialize_model(masked_attention(runtime_mask=True))
    feed = {"x": np.random.RandomState(0).randn(1, 1, TOKENS, DIM).astype(np.float32),
            "keep": np.arange(TOKENS).reshape(1, 1, 1, TOKENS) < 5}

    def run() -> np.ndarray:
        proto = ir.serde.serialize_model(model).SerializeToString()
        return ort.InferenceSession(proto, providers=["CPUExecutionProvider"]).run(None, feed)[0]

    before = run()
    assert "broadcasts" in str(rknn_hazards(model)[0])
    assert FullShapeMasks()(model).report.changed == 1
    expand = next(n for n in model.graph if n.op_type == "Expand")
    assert expand.inputs[0].name == "keep" and list(expand.inputs[1].const_value.numpy()) == [1, 1, TOKENS, TOKENS]
    np.testing.assert_allclose(run(), before, rtol=0, atol=1e-6)
    assert rknn_hazards(model) == []


def test_a_runtime_mask_read_by_several_wheres_is_expanded_once():
    proto = masked_attention(runtime_mask=True)
    nodes = list(proto.graph.node)
    i = next(k for k, n in enumerate(nodes) if n.name == "mask_where")
    nodes.insert(i + 1, helper.make_node("Where", ["keep", "sm", "fill"], ["sm2"], name="again"))
    next(n for n in nodes if n.op_type == "Softmax").input[0] = "sm2"
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    model = ir.serde.deserialize_model(proto)
    assert FullShapeMasks()(model).report.changed == 2
    assert [n.op_type for n in model.graph].count("Expand") == 1  # one full-shape mask, read by both


def test_collapse_transposes_writes_swins_patch_merging_in_4d():
    model = ir.serde.deserialize_model(patch_merging())
    x = np.random.RandomState(0).randn(1, 16, 8).astype(np.float32)
    before = _run(model, x)
    report = CollapseTransposes()(model).report
    assert report.changed == 1
    perms = [list(n.attributes["perm"].as_ints()) for n in model.graph if n.op_type == "Transpose"]
    assert perms == [[0, 2, 1, 3]]  # [2, 2, 4, 8]: (row pairs, their parity) swapped with (columns, channels)
    np.testing.assert_array_equal(_run(model, x), before)
    assert CollapseTransposes()(model).report.changed == 0


def test_a_large_patch_conv_on_qdq_is_a_hazard_and_a_small_one_is_not():
    big, small = (ir.serde.deserialize_model(qdq_patch_conv(size=32, patch=p)) for p in (16, 4))
    found = rknn_hazards(big)
    assert [(h.rule, h.node.name) for h in found] == [("rknn.patch_conv", "patch")]
    assert rknn_hazards(small) == []


def test_append_after_repoints_readers_and_a_graph_output():
    from onnx import TensorProto, helper

    from vitexport.targets.rknn.graph import append_after, new_initializer

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Neg", ["r"], ["n"], name="neg")],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("r", TensorProto.FLOAT, [2]),
                           helper.make_tensor_value_info("n", TensorProto.FLOAT, [2])])
    model = ir.serde.deserialize_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    r = next(n for n in model.graph if n.name == "relu").outputs[0]
    mul = ir.node("Mul", [r, new_initializer(model, "three", np.array(3.0, np.float32))], name="times3")
    append_after(model, r, [mul])
    assert [n.name for n in model.graph] == ["relu", "times3", "neg"]
    sess = ort.InferenceSession(ir.serde.serialize_model(model).SerializeToString(), providers=["CPUExecutionProvider"])
    out_r, out_n = sess.run(None, {"x": np.array([-1.0, 2.0], np.float32)})
    assert out_r.tolist() == [0.0, 6.0] and out_n.tolist() == [-0.0, -6.0]  # the output and the reader see the Mul
