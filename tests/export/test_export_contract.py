"""The target contract: every recipe's rules broken once, with a clear error and no partial file."""
from __future__ import annotations

import onnx
import pytest
from export_helpers import adapter, feeds, image, leftovers, make_graph_model, onnx_parity, op_counts, tiny_timm
from onnx import TensorProto, helper

from vitexport.errors import BadInput, ContractViolation
from vitexport.export import check_contract, export_onnx, simplify_onnx
from vitexport.recipe import Tolerance
from vitexport.targets import build_target, load_recipe, load_target, registered_targets

_NOT_LISTED = ["Exp", "Log", "Abs", "Tanh"]


def _rules(target: str) -> list[str]:
    c = load_recipe(target).contract
    rules = ["max_opset", "static_shapes", "allowed_domains"]
    rules += ["allowed_ops"] if c.allowed_ops is not None else []
    rules += ["forbidden_ops"] if c.forbidden_ops else []
    rules += ["forbid_float16"] if c.forbid_float16 else []
    return rules


CASES = [(t, r) for t in list(registered_targets()) for r in _rules(t)]


def _violating_model(target: str, rule: str) -> tuple[onnx.ModelProto, str, str]:
    """A small graph breaking ``rule`` of ``target``: (model, node name expected, op expected)."""
    c = load_recipe(target).contract
    opset = min(c.max_opset, 17)
    if rule == "max_opset":
        # ReduceMean changed at opset 18 and ReduceMax at 20, so the message can name the node that needs it.
        op, at = ("ReduceMean", 18) if c.max_opset < 18 else ("ReduceMax", 20)
        assert at > c.max_opset
        return make_graph_model(op, opset=at, out_shape=(1, 1)), f"the_{op.lower()}", op
    if rule == "static_shapes":
        m = make_graph_model("Relu", opset=opset)
        m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
        return m, "x", ""
    if rule == "allowed_domains":
        return make_graph_model("FastGelu", opset=opset, domain="com.microsoft"), "the_fastgelu", "FastGelu"
    if rule == "allowed_ops":
        op = next(o for o in _NOT_LISTED if o not in c.allowed_ops)
        return make_graph_model(op, opset=opset), f"the_{op.lower()}", op
    if rule == "forbidden_ops":
        op = c.forbidden_ops[-1]  # Pow on orin-jp5: y = x ** x needs two inputs
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
        y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4])
        node = helper.make_node(op, ["x", "x"], ["output"], name=f"the_{op.lower()}")
        m = helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        return m, f"the_{op.lower()}", op
    if rule == "forbid_float16":
        return make_graph_model("Relu", opset=opset, dtype=TensorProto.FLOAT16), "x", ""
    raise AssertionError(rule)


@pytest.mark.parametrize("target,rule", CASES, ids=[f"{t}-{r}" for t, r in CASES])
def test_every_recipe_contract_violated_once(target, rule, tmp_path):
    model, node, op = _violating_model(target, rule)
    src = tmp_path / "in" / "model.raw.onnx"
    src.parent.mkdir()
    onnx.save(model, str(src))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(ContractViolation) as err:
        simplify_onnx(src, out_dir / "model.fp32.onnx", load_target(target))
    msg = str(err.value)
    assert msg.startswith("model.fp32.onnx: ")
    assert f"contract.{rule}" in msg and f"recipes/{target}.yaml" in msg and "; hint: " in msg
    assert f"'{node}'" in msg and (f"({op})" in msg if op else True)
    assert err.value.exit_code == 2 and isinstance(err.value, BadInput)
    assert leftovers(out_dir) == []  # no artifact, no temporary file


def test_erf_on_npu_names_node_key_and_tanh_hint(tmp_path):
    # A stricter NPU whose op list lacks Erf: exact GELU must be refused at export time, and the
    # hinted setting must then pass.
    ops = [o for o in load_recipe("npu").contract.allowed_ops if o != "Erf"]
    strict = [f"contract.allowed_ops=[{', '.join(ops)}]"]
    model, size = tiny_timm("vit")
    model = adapter(model)
    inputs = image(size)
    recipe = load_recipe("npu", strict)
    export_onnx(model, inputs, tmp_path / "raw.onnx", recipe.export)
    with pytest.raises(ContractViolation) as err:
        simplify_onnx(tmp_path / "raw.onnx", tmp_path / "model.fp32.onnx", build_target(recipe))
    msg = str(err.value)
    assert msg.startswith("model.fp32.onnx: node '/model/model/blocks/blocks.0/mlp/act/Erf' (Erf) not in "
                          "contract.allowed_ops of recipes/npu.yaml; hint: use the tanh GELU approximation "
                          "(--set export.gelu_approximation=tanh")
    assert msg.endswith("(+1 more: Erf)")
    assert [v.op for v in err.value.violations] == ["Erf", "Erf"]
    assert not (tmp_path / "model.fp32.onnx").exists()

    tanh = load_recipe("npu", [*strict, "export.gelu_approximation=tanh"])
    export_onnx(model, inputs, tmp_path / "raw.onnx", tanh.export)
    simplify_onnx(tmp_path / "raw.onnx", tmp_path / "model.fp32.onnx", build_target(tanh))
    ops_after = op_counts(tmp_path / "model.fp32.onnx")
    assert "Erf" not in ops_after and "Pow" not in ops_after and ops_after["Tanh"] == 2
    # The approximation changes outputs slightly; it is a different function, not a broken one.
    res = onnx_parity(model, inputs, tmp_path / "model.fp32.onnx", Tolerance(max_abs=1e-2, cosine_min=0.9999), feeds(size))
    assert res, res.failed_check


def test_orin_jp5_without_decomposition_is_refused_for_pow(tmp_path):
    # Below opset 17 TorchScript writes LayerNorm with Pow(x - mean, 2): the FP16 overflow of DOMAIN.md.
    recipe = load_recipe("orin-jp5", ["export.decompose_layernorm=false"])
    model, size = tiny_timm("vit")
    export_onnx(adapter(model), image(size), tmp_path / "raw.onnx", recipe.export)
    with pytest.raises(ContractViolation) as err:
        simplify_onnx(tmp_path / "raw.onnx", tmp_path / "model.fp32.onnx", build_target(recipe))
    assert "(Pow) is in contract.forbidden_ops of recipes/orin-jp5.yaml" in str(err.value)
    assert "export.decompose_layernorm=true" in str(err.value)
    assert leftovers(tmp_path) == ["raw.onnx"]


def test_check_contract_runs_the_onnx_checker():
    model = make_graph_model("NotAnOnnxOp", opset=17)
    with pytest.raises(ContractViolation, match="fails the ONNX checker"):
        check_contract(model, load_target("orin"), artifact="model.fp32.onnx")
    check_contract(make_graph_model("Relu", opset=17), load_target("orin"))  # a valid graph passes


def test_recipe_path_and_custom_recipe_names(tmp_path):
    model = make_graph_model("Exp", opset=13)
    with pytest.raises(ContractViolation, match=r"of my/npu\.yaml; hint"):
        check_contract(model, load_target("npu"), "my/npu.yaml")
