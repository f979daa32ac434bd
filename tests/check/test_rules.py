"""The checker on planted faults: each named rule fires on its fault, with the node it names, and on
nothing else; the clean layouts (float32 Q/DQ, float16 Q/DQ at opset 19) pass every target."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from planted import linear, save, single_op

from vitexport.check import check_file, rules_checked
from vitexport.check.types import type_violations
from vitexport.errors import BadInput
from vitexport.targets import load_target, registered_targets
from vitexport.targets.tensorrt.ops import TENSORRT_8_6, TENSORRT_10_3

# (id, recipe, overrides, model, {rule: node it names (None: not a node)})
PLANTED = [
    ("zero-point", "orin", [], lambda: linear(zero_point=3), {"orin.int8": "act_q"}),
    ("uint8", "orin", [], lambda: linear(zp_dtype=np.uint8), {"orin.int8": "act_q"}),
    ("float16-npu", "npu", [], lambda: single_op("Relu", opset=13, dtype=TensorProto.FLOAT16),
     {"contract.forbid_float16": None}),
    ("dynamic-dim", "orin", [], lambda: linear(batch="n"), {"contract.static_shapes": None}),
    ("trt-op", "orin", [], lambda: single_op("Det", opset=11, shape=(2, 3, 3)), {"tensorrt.ops": "the_det"}),
    ("trt8-op", "orin-jp5", [], lambda: single_op("Mish", opset=18), {"tensorrt.ops": "the_mish",
                                                                        "tensorrt.opset": None,
                                                                        "contract.max_opset": "the_mish"}),
    ("forbidden-op", "orin-jp5", [], lambda: single_op("Pow", opset=16, n_inputs=2),
     {"contract.forbidden_ops": "the_pow"}),
    ("npu-op", "npu", [], lambda: single_op("Exp", opset=13), {"contract.allowed_ops": "the_exp"}),
    ("weight-axis", "orin", [], lambda: linear(weight_axis=0), {"orin.per_channel": "w_dq"}),
    ("act-per-channel", "orin", [], lambda: linear(act_channels=True), {"orin.per_channel": "act_q"}),
    ("npu-per-channel", "npu", [], lambda: linear(opset=13, zp_dtype=np.uint8), {"npu.per_tensor": "w_dq"}),
    ("scale-zero", "cpu", [], lambda: linear(act_scale=0.0), {"qdq.scale": "act_q"}),
    ("dq-into-add", "orin", [], lambda: linear(consumer="Add"), {"orin.float_consumer": "act_dq"}),
    ("float16-below-19", "orin", [], lambda: linear(dtype=TensorProto.FLOAT16),
     {"orin.float16_qdq": "act_q", "onnx.checker": None, "onnx.types": "act_q"}),
]


def _rules_by_node(result) -> dict[str, str | None]:
    """Each broken rule and the node its first violation names."""
    out: dict[str, str | None] = {}
    for v in result.errors:
        out.setdefault(v.rule, v.node)
    return out


@pytest.mark.parametrize("case,recipe,overrides,build,expected", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_fault_names_its_rule_and_node(case, recipe, overrides, build, expected, tmp_path):
    result = check_file(save(build(), tmp_path / f"{case}.onnx"), load_target(recipe, overrides))
    assert not result
    got = _rules_by_node(result)
    assert set(got) == set(expected), result.lines()
    for rule, node in expected.items():
        if node is not None:
            assert got[rule] == node, (rule, result.lines())
    for line, v in zip(result.lines(), result.errors):
        assert line.startswith(f"{case}.onnx: ") and v.rule in line and "; hint: " in line
        assert v.node is None or f"'{v.node}'" in line


def test_every_violation_is_listed_not_only_the_first(tmp_path):
    m = linear(zero_point=3, weight_axis=0, consumer="Add")
    result = check_file(save(m, tmp_path / "m.onnx"), load_target("orin"))
    assert [(v.rule, v.node) for v in result.errors] == [
        ("orin.int8", "act_q"), ("orin.int8", "act_dq"), ("orin.float_consumer", "act_dq"),
        ("orin.per_channel", "w_dq")]


@pytest.mark.parametrize("recipe", list(registered_targets()))
def test_clean_float32_qdq_passes_every_target_but_npu_per_tensor(recipe, tmp_path):
    target = load_target(recipe)
    opset = min(target.recipe.contract.max_opset, 17)
    m = linear(opset=opset, weight_axis=None if target.force_per_tensor else 1)
    result = check_file(save(m, tmp_path / "m.onnx"), load_target(recipe))
    assert result, result.lines()
    assert result.rules == rules_checked(load_target(recipe)) and "onnx.checker" in result.rules


def test_orin_takes_float16_qdq_at_opset_19(tmp_path):
    """The orin INT8 files: float16 activations and Q/DQ scales at opset 19 (orin.yaml admits 19)."""
    m = linear(opset=19, dtype=TensorProto.FLOAT16)
    result = check_file(save(m, tmp_path / "m.onnx"), load_target("orin"))
    assert result, result.lines()
    # the same file is refused where float16 is (npu), and by TensorRT 8.6 (orin-jp5) for its opset
    npu = check_file(tmp_path / "m.onnx", load_target("npu", ["contract.max_opset=19"]))
    assert {"contract.forbid_float16", "npu.per_tensor"} <= {v.rule for v in npu.errors}
    jp5 = check_file(tmp_path / "m.onnx", load_target("orin-jp5"))
    assert {v.rule for v in jp5.errors} == {"contract.max_opset", "tensorrt.opset"}


def test_bad_axis_outside_the_rank(tmp_path):
    m = linear(weight_axis=0)
    m.graph.node[2].attribute[0].i = 2  # weight DQ: axis 2 of a 2-D weight
    rules = {v.rule: v for v in check_file(save(m, tmp_path / "m.onnx"), load_target("cpu")).errors}
    assert rules["qdq.axis"].node == "w_dq" and "outside its rank-2 input" in rules["qdq.axis"].problem


def test_integer_path_is_never_quantized(tmp_path):
    m = single_op("Relu", dtype=TensorProto.INT32, opset=17)
    from onnx import helper, numpy_helper

    m.graph.initializer.extend([numpy_helper.from_array(np.float32(1.0), "s"), numpy_helper.from_array(np.int8(0), "z")])
    m.graph.node[0].CopyFrom(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="ids_q"))
    m.graph.node.append(helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="ids_dq"))
    m.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    result = check_file(save(m, tmp_path / "m.onnx"), load_target("cpu"))
    assert [(v.rule, v.node) for v in result.errors] == [("qdq.integer_path", "ids_q")]


def test_shared_pairs_break_orin_but_not_cpu(tmp_path):
    from onnx import helper

    m = linear()
    m.graph.node.append(helper.make_node("MatMul", ["x_dq", "w"], ["y2"], name="mm2"))
    m.graph.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, 4, 6]))
    path = save(m, tmp_path / "m.onnx")
    assert [(v.rule, v.node) for v in check_file(path, load_target("orin")).errors] == [
        ("orin.dedicated_pairs", "act_dq")]
    assert check_file(path, load_target("cpu"))


def test_quantizer_validation_is_the_same_checker(tmp_path):
    """``Target.validate`` returns the checker's Violations for the target's rules."""
    model = ir.from_proto(linear(zero_point=3))
    problems = load_target("orin").validate(model)
    assert problems == load_target("orin").rules().violations(model)
    assert [p.rule for p in problems] == ["orin.int8", "orin.int8"] and "zero point 3" in str(problems[0])
    assert load_target("orin").validate(ir.from_proto(linear())) == []


def test_tensorrt_op_lists():
    """The parser lists hold what a ViT export writes and lack what JetPack 6's parser has no importer for."""
    vit_ops = {"Conv", "MatMul", "Gemm", "Add", "Mul", "Div", "Sub", "Sqrt", "ReduceMean", "LayerNormalization",
               "Softmax", "Erf", "Reshape", "Transpose", "Concat", "Gather", "Slice", "Where", "Cast",
               "QuantizeLinear", "DequantizeLinear", "Tanh", "Pow", "Abs", "ReduceMax", "Max", "Equal", "Expand"}
    assert vit_ops <= TENSORRT_8_6.ops < TENSORRT_10_3.ops
    assert {"Gelu", "CastLike"} <= TENSORRT_10_3.ops - TENSORRT_8_6.ops
    assert not {"STFT", "HannWindow", "Unique", "Det", "MatMulInteger", "QLinearMatMul"} & TENSORRT_10_3.ops
    assert (TENSORRT_10_3.min_opset, TENSORRT_10_3.max_opset, TENSORRT_8_6.max_opset) == (9, 20, 17)


def test_unreadable_file_is_bad_input(tmp_path):
    (tmp_path / "junk.onnx").write_bytes(b"not a protobuf at all")
    with pytest.raises(BadInput, match="junk.onnx"):
        check_file(tmp_path / "junk.onnx", load_target("orin"))
    with pytest.raises(BadInput, match="no such ONNX file"):
        check_file(tmp_path / "absent.onnx", load_target("orin"))


def test_the_exports_contract_step_runs_the_same_rules(tmp_path):
    """simplify_onnx refuses what ``vitexport check`` refuses (here an op TensorRT 10.3 cannot parse),
    before writing anything."""
    from vitexport.errors import ContractViolation
    from vitexport.export import simplify_onnx

    src = save(single_op("Det", opset=11, shape=(2, 3, 3)), tmp_path / "model.raw.onnx")
    with pytest.raises(ContractViolation) as err:
        simplify_onnx(src, tmp_path / "model.fp32.onnx", load_target("orin"))
    assert str(err.value).startswith("model.fp32.onnx: node 'the_det' (Det) has no importer in TensorRT 10.3")
    assert "[tensorrt.ops]" in str(err.value)
    assert [v.rule for v in err.value.violations] == [v.rule for v in check_file(src, load_target("orin")).errors]
    assert not (tmp_path / "model.fp32.onnx").exists()


def test_operand_types_are_checked_against_the_schema():
    """A float16 ``scales`` on Resize (what ONNX Runtime refuses with INVALID_GRAPH) is rule
    ``onnx.types``, naming the node and the operand; a mixed-type constraint is caught too."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 3, 4, 4])
    y = helper.make_tensor_value_info("z", TensorProto.FLOAT16, [1, 3, 8, 8])
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float16), "sc")
    other = numpy_helper.from_array(np.ones((1, 3, 8, 8), np.float32), "one")
    nodes = [helper.make_node("Resize", ["x", "", "sc"], ["y"], name="up", mode="nearest"),
             helper.make_node("Add", ["y", "one"], ["z"], name="add")]
    m = ir.from_proto(helper.make_model(helper.make_graph(nodes, "g", [x], [y], [scales, other]),
                                        opset_imports=[helper.make_opsetid("", 19)]))
    got = [(v.rule, v.node) for v in type_violations(m)]
    assert got == [("onnx.types", "up"), ("onnx.types", "add")]
    assert "input 'scales' ('sc') as tensor(float16)" in type_violations(m)[0].problem
    scales_ok = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "sc")
    fixed = ir.from_proto(helper.make_model(helper.make_graph(nodes[:1], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 3, 8, 8])], [scales_ok]),
                                            opset_imports=[helper.make_opsetid("", 19)]))
    assert type_violations(fixed) == []
