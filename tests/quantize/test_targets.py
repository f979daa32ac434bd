"""Placement rules per target: Q/DQ only where the target allows it."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from qcases import recipe
from vitexport.quantize import TARGETS, check_placement, quantize_int8
from vitexport.quantize.graph import GraphIndex
from vitexport.recipe import TargetKind

FLOAT_OPS = {"LayerNormalization", "Softmax", "Add", "Erf", "Div", "Sub", "ReduceMean", "Sqrt", "Pow"}


def _quantize(case, tmp_path, name, *overrides):
    out = tmp_path / "model.int8.onnx"
    rep = quantize_int8(case.path, out, case.calib, recipe(name, "quantization.fallback.enabled=false", *overrides),
                        tmp_path)
    return onnx.load(str(out)), rep


def _dq_fed(idx: GraphIndex, node) -> list[int]:
    return [j for j, t in enumerate(node.input) if t in idx.producer and idx.producer[t].op_type == "DequantizeLinear"]


def _residual_adds(idx: GraphIndex):
    """Adds of two non-constant tensors (the residual connections)."""
    return [n for n in idx.nodes if n.op_type == "Add" and not any(idx.is_const(t) for t in n.input)]


@pytest.mark.parametrize("kind", list(TARGETS))
def test_every_target_has_rules(kind):
    assert TARGETS[kind].kind is kind


def test_orin_rules(vit17, tmp_path):
    m, rep = _quantize(vit17, tmp_path, "orin")
    idx = GraphIndex(m)
    assert check_placement(m, "orin") == []
    qs = [n for n in idx.nodes if n.op_type == "QuantizeLinear"]
    dqs = [n for n in idx.nodes if n.op_type == "DequantizeLinear"]
    assert qs and dqs and rep.quantized_nodes > 0
    for n in qs + dqs:  # symmetric: int8 zero point 0
        zp = idx.const_value(n.input[2])
        assert zp.dtype == np.int8 and not zp.any(), n.name
    # nothing float-only is fed by a DequantizeLinear; residual Adds are never quantized
    for n in idx.nodes:
        if n.op_type in FLOAT_OPS:
            assert not _dq_fed(idx, n), f"{n.op_type} {n.name} has a Q/DQ input"
    adds = _residual_adds(idx)
    assert len(adds) >= 4
    for a in adds:
        assert not _dq_fed(idx, a)
    # each activation DQ has exactly one consumer (dedicated pairs)
    for n in dqs:
        if n.input[0] not in idx.initializers:
            assert len(idx.consumers[n.output[0]]) == 1
    # weights: int8 initializers + per-channel DQ on the output-channel axis
    for n in idx.nodes:
        dq = idx.producer.get(n.input[1]) if n.op_type in ("MatMul", "Gemm", "Conv") else None
        if dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in idx.initializers:
            w = numpy_helper.to_array(idx.initializers[dq.input[0]])
            assert w.dtype == np.int8
            axis = idx.attr(dq, "axis", 1)
            if n.op_type == "Conv":
                assert axis == 0
            elif n.op_type == "Gemm" and idx.attr(n, "transB", 0):
                assert axis == 0
            else:
                assert axis == w.ndim - 1
            assert idx.const_value(dq.input[1]).shape == (w.shape[axis],)
    # the attention batched MatMuls (head 64, 17 tokens) get INT8 inputs on both sides
    att = [n for n in idx.nodes if n.op_type == "MatMul" and len(_dq_fed(idx, n)) == 2
           and not any(idx.producer[t].input[0] in idx.initializers for t in n.input)]
    assert len(att) == 4  # QK^T and PV in each of 2 blocks


def test_orin_skips_attention_without_fused_head_size(vit_head48, tmp_path):
    m, rep = _quantize(vit_head48, tmp_path, "orin")
    reasons = " ".join(rep.skipped_nodes.values())
    assert "head size 48" in reasons
    idx = GraphIndex(m)
    for n in idx.nodes:
        if n.op_type == "MatMul" and not any(idx.is_const(t) for t in n.input):
            if not any(t in idx.producer and idx.producer[t].op_type == "DequantizeLinear"
                       and idx.producer[t].input[0] in idx.initializers for t in n.input):
                assert not _dq_fed(idx, n), n.name


@pytest.mark.parametrize("asym", [True, False])
def test_npu_rules(outlier_vit13, tmp_path, asym):
    m, rep = _quantize(outlier_vit13, tmp_path, "npu", f"quantization.asymmetric_activations={str(asym).lower()}")
    assert check_placement(m, "npu") == []
    idx = GraphIndex(m)
    assert idx.opset() <= 13
    f16 = onnx.TensorProto.FLOAT16
    assert all(i.data_type != f16 for i in m.graph.initializer)
    assert all(et != f16 for _, et in idx.shapes.values())
    for n in idx.nodes:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert idx.const_value(n.input[1]).size == 1, "per tensor only"
    acts = [n for n in idx.nodes if n.op_type == "QuantizeLinear"]
    dtypes = {idx.const_value(n.input[2]).dtype for n in acts}
    assert dtypes == ({np.dtype(np.uint8)} if asym else {np.dtype(np.int8)})
    # quantization adds no op but Q/DQ (both in the npu recipe's allowed list)
    before = {n.op_type for n in onnx.load(str(outlier_vit13.path)).graph.node}
    added = {n.op_type for n in idx.nodes} - before
    assert added == {"QuantizeLinear", "DequantizeLinear"}
    assert added <= set(recipe("npu").contract.allowed_ops)
    for a in _residual_adds(idx):
        assert not _dq_fed(idx, a)


def test_cpu_rules_fuse_into_integer_kernels(vit17, tmp_path):
    m, rep = _quantize(vit17, tmp_path, "cpu")
    assert check_placement(m, "cpu") == []
    assert rep.quantized_nodes >= 10
    idx = GraphIndex(m)
    acts = [n for n in idx.nodes if n.op_type == "QuantizeLinear"]
    assert {idx.const_value(n.input[2]).dtype for n in acts} == {np.dtype(np.uint8)}  # U8S8
    for n in idx.nodes:
        if n.op_type == "DequantizeLinear" and n.input[0] in idx.initializers:
            w = numpy_helper.to_array(idx.initializers[n.input[0]])
            if w.dtype == np.int8:
                assert np.abs(w.astype(np.int32)).max() <= 63  # 7-bit weights (no VNNI saturation)
    gemms = [n for n in idx.nodes if n.op_type == "Gemm"]
    assert gemms and all(idx.producer[n.input[2]].op_type == "DequantizeLinear" for n in gemms)  # int32 bias
    # ONNX Runtime turns every quantized Gemm / MatMul into an integer kernel
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "opt.onnx")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    assert np.isfinite(sess.run(None, vit17.feeds[0])[0]).all()
    ops = [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]
    assert "QGemm" in ops and "Gemm" not in ops and "MatMul" not in ops


def test_placement_checker_catches_violations(vit17, tmp_path):
    m, _ = _quantize(vit17, tmp_path, "orin")
    idx = GraphIndex(m)
    q = next(n for n in idx.nodes if n.op_type == "QuantizeLinear")
    zp = idx.initializers[q.input[2]]
    zp.CopyFrom(numpy_helper.from_array(np.asarray(3, np.int8), zp.name))
    assert any("zero point" in p for p in check_placement(m, TargetKind.orin))


@pytest.mark.parametrize("name", ["orin", "npu", "cpu"])
def test_qdq_only_where_the_target_allows(vit17, outlier_vit13, tmp_path, name):
    case = outlier_vit13 if name == "npu" else vit17
    m, _ = _quantize(case, tmp_path, name)
    idx = GraphIndex(m)
    for n in idx.nodes:
        if n.op_type == "QuantizeLinear":
            assert {c.op_type for c, _ in idx.consumers[n.output[0]]} == {"DequantizeLinear"}
        if n.op_type == "DequantizeLinear":
            consumers = {c.op_type for c, _ in idx.consumers[n.output[0]]}
            assert consumers <= {"MatMul", "Gemm", "Conv"}, (n.name, consumers)


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
        quantize_int8(path, tmp_path / "q.onnx", vit17.calib, recipe("npu"), tmp_path)
