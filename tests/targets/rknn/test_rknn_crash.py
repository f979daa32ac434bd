"""The forms RKNN 2.5.0 compiled where a laid-out file crashed it (vitexport/targets/rknn/crash.py)."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from vitexport.runners.sessions import QDQ_AS_FLOAT, Session
from vitexport.targets.rknn.crash import CrashForms

C = 4


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _qdq(x: str, name: str) -> list[onnx.NodeProto]:
    return [helper.make_node("QuantizeLinear", [x, "s", "zp"], [f"{name}_q"], name=f"{name}_Q"),
            helper.make_node("DequantizeLinear", [f"{name}_q", "s", "zp"], [f"{name}_dq"], name=f"{name}_DQ")]


def _model(nodes, inputs, extra=()) -> ir.Model:
    inits = [_const("s", np.float32(0.05)), _const("zp", np.int8(0)), *extra]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    proto = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    return ir.serde.deserialize_model(proto)


def _attention_map() -> ir.Model:
    """Float attention probabilities times V, reshaped to a feature map that an INT8 Conv reads through a Relu."""
    w = np.random.default_rng(0).standard_normal((C, C, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["v", "p"], ["av"], name="attn_MatMul"),
             helper.make_node("Reshape", ["av", "map_shape"], ["map"], name="attn_Reshape"),
             helper.make_node("Relu", ["map"], ["r"], name="Relu"), *_qdq("r", "r"),
             helper.make_node("Conv", ["r_dq", "w"], ["y"], name="proj_Conv")]
    inputs = [helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, C, 16]),
              helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 16, 16])]
    return _model(nodes, inputs, [_const("map_shape", np.asarray([1, C, 4, 4], np.int64)), _const("w", w)])


def _residual(group: int) -> ir.Model:
    """``x + Conv(x)``, the Conv (depthwise where ``group`` is the channel count) between Q/DQ pairs."""
    w = np.random.default_rng(1).standard_normal((C, C // group, 3, 3)).astype(np.float32)
    nodes = [*_qdq("x", "x"), helper.make_node("Conv", ["x_dq", "w"], ["c"], name="dw_Conv", group=group, pads=[1, 1, 1, 1]),
             *_qdq("c", "c"), helper.make_node("Add", ["x", "c_dq"], ["y"], name="residual_Add")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 4, 4])], [_const("w", w)])


def _run(model: ir.Model, feeds: dict) -> np.ndarray:
    return Session(ir.serde.serialize_model(model).SerializeToString(), QDQ_AS_FLOAT).run(None, feeds)[0]


def test_a_float_attentions_map_passes_through_an_identity_conv_and_nothing_changes():
    rng = np.random.default_rng(2)
    feeds = {"v": rng.standard_normal((1, C, 16), np.float32), "p": rng.random((1, 16, 16), np.float32)}
    model = _attention_map()
    want = _run(model, feeds)
    rep = CrashForms()(model).report
    identity = next(n for n in model.graph if n.name == "attn_Reshape_rknn_identity")
    assert rep.changed == 1 and identity.op_type == "Conv" and identity.attributes["group"].value == C
    assert identity.inputs[0].producer().name == "attn_Reshape"
    assert next(n for n in model.graph if n.name == "Relu").inputs[0] is identity.outputs[0]
    assert "RKNN 2.5.0 crashed on the file without it" in rep.skipped["attn_Reshape_rknn_identity"]
    np.testing.assert_array_equal(_run(model, feeds), want)


def test_a_quantized_attention_is_left_alone():
    model = _attention_map()
    matmul = next(n for n in model.graph if n.op_type == "MatMul")
    dq = ir.node("DequantizeLinear", [matmul.inputs[1], model.graph.initializers["s"], model.graph.initializers["zp"]],
                 name="p_DQ")
    model.graph.insert_before(matmul, dq)
    matmul.replace_input_with(1, dq.outputs[0])  # its probabilities dequantized: RKNN runs it in INT8
    assert CrashForms()(model).report.changed == 0


@pytest.mark.parametrize("group,rewired", [(C, True), (1, False)], ids=["depthwise", "dense"])
def test_x_plus_a_depthwise_conv_of_x_adds_the_quantized_x(group, rewired):
    model = _residual(group)
    rep = CrashForms()(model).report
    add = next(n for n in model.graph if n.op_type == "Add")
    assert rep.changed == int(rewired)
    assert add.inputs[0].name == ("x_dq" if rewired else "x")


def test_build_engine_rewrites_a_crashed_file_once_and_says_so(tmp_path):
    from vitexport.errors import BadInput
    from vitexport.graph.files import load_model, save_model
    from vitexport.targets.rknn.stages import _crash_forms_once

    laid_out = tmp_path / "model.rknn.onnx"
    save_model(_residual(C), laid_out)
    said: list[str] = []
    crash = "model.rknn.onnx: rknn-toolkit2 crashed (SIGSEGV) in stage build (compiler pass OpEmit) (log: x)"
    timeout = BadInput("model.rknn.onnx: rknn-toolkit2 did not finish within 600 s in stage build (log: x)")
    assert not _crash_forms_once(timeout, "qdq", laid_out, {"skipped": {}}, said.append)
    assert not _crash_forms_once(BadInput(crash), "rknn", laid_out, {"skipped": {}}, said.append)  # RKNN's own file
    layout: dict = {"skipped": {}}
    assert _crash_forms_once(BadInput(crash), "qdq", laid_out, layout, said.append)
    assert layout["rknn_crash_forms"] == 1 and said == [
        "RKNN crashed (SIGSEGV): compiling again with 1 node(s) in the forms it compiled where files like this one crashed it"]
    assert next(n for n in load_model(laid_out).graph if n.op_type == "Add").inputs[0].name == "x_dq"
    again = BadInput(crash)
    assert not _crash_forms_once(again, "qdq", laid_out, layout, said.append)
    assert str(again).startswith(crash) and "it crashed again after 1 node(s) were rewritten" in str(again)
