"""Placement rules per target: Q/DQ only where the target allows it."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from qcases import target
from qgraph import const, consumers, dq_fed, load, producer_op, residual_adds, weight_dq
from vitexport.check import check_file
from vitexport.graph.query import attr, is_const, opset_version
from vitexport.quantize import quantize_int8
from vitexport.targets import registered_targets

FLOAT_OPS = {"LayerNormalization", "Softmax", "Add", "Erf", "Div", "Sub", "ReduceMean", "Sqrt", "Pow"}


def _quantize(case, tmp_path, name, *overrides):
    out = tmp_path / "model.int8.onnx"
    rep = quantize_int8(case.path, out, case.calib, target(name, "quantization.fallback.enabled=false", *overrides),
                        tmp_path)
    return load(out), rep


def _passes_check(path, name):
    """The file passes every rule ``vitexport check --target name`` runs."""
    result = check_file(path, target(name))
    assert result, result.lines()


@pytest.mark.parametrize("name", list(registered_targets()))
def test_every_target_has_rules(name):
    t = target(name)
    assert t.name == name and t.recipe.target == name
    assert set(t.rules().RULES) >= {"qdq.scale", "qdq.axis", "qdq.integer_path"}


@pytest.mark.slow
def test_orin_rules(vit17, tmp_path):
    m, rep = _quantize(vit17, tmp_path, "orin")
    assert target("orin").validate(m) == []
    for f in (vit17.path, tmp_path / "model.int8.onnx"):  # the float and Q/DQ files pass `vitexport check`
        _passes_check(f, "orin")
    qs = [n for n in m.graph if n.op_type == "QuantizeLinear"]
    dqs = [n for n in m.graph if n.op_type == "DequantizeLinear"]
    assert qs and dqs and rep.quantized_nodes > 0
    for n in qs + dqs:  # symmetric: int8 zero point 0
        zp = const(n.inputs[2])
        assert zp.dtype == np.int8 and not zp.any(), n.name
    # nothing float-only is fed by a DequantizeLinear; residual Adds are never quantized
    for n in m.graph:
        if n.op_type in FLOAT_OPS:
            assert not dq_fed(n), f"{n.op_type} {n.name} has a Q/DQ input"
    adds = residual_adds(m)
    assert len(adds) >= 4
    for a in adds:
        assert not dq_fed(a)
    # each activation DQ has exactly one consumer (dedicated pairs)
    for n in dqs:
        if not is_const(n.inputs[0]):
            assert len(consumers(n.outputs[0])) == 1
    # weights: int8 initializers + per-channel DQ on the output-channel axis
    for n in m.graph:
        if n.op_type in ("MatMul", "Gemm", "Conv") and weight_dq(n.inputs[1]):
            dq = n.inputs[1].producer()
            w = const(dq.inputs[0])
            assert w.dtype == np.int8
            axis = attr(dq, "axis", 1)
            if n.op_type == "Conv" or (n.op_type == "Gemm" and attr(n, "transB", 0)):
                assert axis == 0
            else:
                assert axis == w.ndim - 1
            assert const(dq.inputs[1]).shape == (w.shape[axis],)
    # the attention batched MatMuls (head 64, 17 tokens) get INT8 inputs on both sides
    att = [n for n in m.graph if n.op_type == "MatMul" and len(dq_fed(n)) == 2 and not any(weight_dq(v) for v in n.inputs)]
    assert len(att) == 4  # QK^T and PV in each of 2 blocks


@pytest.mark.slow
def test_orin_skips_attention_without_fused_head_size(vit_head48, tmp_path):
    m, rep = _quantize(vit_head48, tmp_path, "orin")
    reasons = " ".join(rep.skipped_nodes.values())
    assert "head size 48" in reasons
    for n in m.graph:
        if n.op_type == "MatMul" and not any(is_const(v) or weight_dq(v) for v in n.inputs):
            assert not dq_fed(n), n.name


@pytest.mark.slow
@pytest.mark.parametrize("asym", [True, False])
def test_npu_rules(outlier_vit13, tmp_path, asym):
    m, rep = _quantize(outlier_vit13, tmp_path, "npu", f"quantization.asymmetric_activations={str(asym).lower()}")
    assert target("npu").validate(m) == []
    assert opset_version(m) <= 13
    f16 = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
    assert all(v.dtype not in f16 for v in m.graph.initializers.values())
    assert all(o.dtype not in f16 for n in m.graph for o in n.outputs)
    for n in m.graph:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert const(n.inputs[1]).size == 1, "per tensor only"
    acts = [n for n in m.graph if n.op_type == "QuantizeLinear"]
    dtypes = {const(n.inputs[2]).dtype for n in acts}
    assert dtypes == ({np.dtype(np.uint8)} if asym else {np.dtype(np.int8)})
    # quantization adds no op but Q/DQ (both in the npu recipe's allowed list)
    before = {n.op_type for n in onnx.load(str(outlier_vit13.path)).graph.node}
    added = {n.op_type for n in m.graph} - before
    assert added == {"QuantizeLinear", "DequantizeLinear"}
    assert added <= set(target("npu").recipe.contract.allowed_ops)
    for a in residual_adds(m):
        assert not dq_fed(a)


def test_cpu_rules_fuse_into_integer_kernels(vit17, tmp_path):
    m, rep = _quantize(vit17, tmp_path, "cpu")
    assert target("cpu").validate(m) == []
    _passes_check(tmp_path / "model.int8.onnx", "cpu")
    assert rep.quantized_nodes >= 10
    acts = [n for n in m.graph if n.op_type == "QuantizeLinear"]
    assert {const(n.inputs[2]).dtype for n in acts} == {np.dtype(np.uint8)}  # U8S8
    for n in m.graph:
        if n.op_type == "DequantizeLinear" and is_const(n.inputs[0]):
            w = const(n.inputs[0])
            if w.dtype == np.int8:
                assert np.abs(w.astype(np.int32)).max() <= 63  # 7-bit weights (no VNNI saturation)
    gemms = [n for n in m.graph if n.op_type == "Gemm"]
    assert gemms and all(producer_op(n.inputs[2]) == "DequantizeLinear" for n in gemms)  # int32 bias
    # ONNX Runtime turns every quantized Gemm / MatMul into an integer kernel
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "opt.onnx")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    sess = ort.InferenceSession(str(tmp_path / "model.int8.onnx"), opts, providers=["CPUExecutionProvider"])
    assert np.isfinite(sess.run(None, vit17.feeds[0])[0]).all()
    ops = [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]
    assert "QGemm" in ops and "Gemm" not in ops and "MatMul" not in ops


def test_placement_checker_catches_violations(vit17, tmp_path):
    m, _ = _quantize(vit17, tmp_path, "orin")
    q = next(n for n in m.graph if n.op_type == "QuantizeLinear")
    q.inputs[2].const_value = ir.tensor(np.asarray(3, np.int8), name=q.inputs[2].name)
    assert any("zero point" in str(p) for p in target("orin").validate(m))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["orin", "npu", "cpu"])
def test_qdq_only_where_the_target_allows(vit17, outlier_vit13, tmp_path, name):
    case = outlier_vit13 if name == "npu" else vit17
    m, _ = _quantize(case, tmp_path, name)
    for n in m.graph:
        if n.op_type == "QuantizeLinear":
            assert {c.op_type for c in consumers(n.outputs[0])} == {"DequantizeLinear"}
        if n.op_type == "DequantizeLinear":
            ops = {c.op_type for c in consumers(n.outputs[0])}
            assert ops <= {"MatMul", "Gemm", "Conv"}, (n.name, ops)


def test_npu_refuses_a_float16_model(vit17, tmp_path):
    from onnx import TensorProto, helper

    from vitexport.errors import ContractViolation

    m = onnx.load(str(vit17.path))
    first = next(n for n in m.graph.node if "x" in n.input)
    first.input[list(first.input).index("x")] = "x_f32"
    m.graph.node.insert(0, helper.make_node("Cast", ["x"], ["x_f16"], to=TensorProto.FLOAT16, name="to16"))
    m.graph.node.insert(1, helper.make_node("Cast", ["x_f16"], ["x_f32"], to=TensorProto.FLOAT, name="to32"))
    path = tmp_path / "f16.onnx"
    onnx.save(m, str(path))
    with pytest.raises(ContractViolation, match="float16"):
        quantize_int8(path, tmp_path / "q.onnx", vit17.calib, target("npu"), tmp_path)
