"""One MAC formula (vitexport.graph.macs) behind the plan's counts and the Q/DQ file's INT8 share:
a depthwise, a grouped, a pointwise and a strided patch conv, a MatMul and a Gemm with transB, each
against its MACs counted by hand."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper as nh
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from qcases import target
from vitexport.graph.macs import conv_groups, layer_macs
from vitexport.quantize.precision import precision_summary

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "targets" / "rknn"))
from rknn_models import CONV_MACS, qdq_convs  # noqa: E402

#: after the convs: 16 tokens x 32 channels → MatMul to 8 (K = 32), mean over tokens → Gemm to 5 (K = 8)
MATMUL_MACS, GEMM_MACS = 16 * 8 * 32, 5 * 8


def _float_model() -> ir.Model:
    """The convolutions of :func:`qdq_convs` in float, then the tokens through a MatMul and a Gemm
    (``transB=1``, as torch exports a Linear on a 2-D input)."""
    rs = np.random.RandomState(0)
    nodes, inits, x = [], [], "x"
    for name, (groups, cin, cout, k, stride, _) in CONV_MACS.items():
        inits.append(nh.from_array(rs.randn(cout, cin // groups, k, k).astype(np.float32), f"{name}_w"))
        pad = (k - 1) // 2 if stride == 1 else 0
        nodes.append(helper.make_node("Conv", [x, f"{name}_w"], [f"{name}_c"], kernel_shape=[k, k], strides=[stride] * 2,
                                      pads=[pad] * 4, group=groups, name=name))
        x = f"{name}_c"
    inits += [nh.from_array(np.array([1, 32, 16], np.int64), "shape"),
              nh.from_array(rs.randn(32, 8).astype(np.float32), "mm_w"), nh.from_array(rs.randn(5, 8).astype(np.float32), "gemm_w")]
    nodes += [helper.make_node("Reshape", [x, "shape"], ["tokens_t"], name="flatten"),
              helper.make_node("Transpose", ["tokens_t"], ["tokens"], perm=[0, 2, 1], name="tokens"),
              helper.make_node("MatMul", ["tokens", "mm_w"], ["mm"], name="matmul"),
              helper.make_node("ReduceMean", ["mm"], ["pooled"], axes=[1], keepdims=0, name="pool"),
              helper.make_node("Gemm", ["pooled", "gemm_w"], ["y"], transB=1, name="gemm")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits)
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    proto.ir_version = 8
    onnx.checker.check_model(proto)
    return ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(proto))


HAND = {**{name: v[-1] for name, v in CONV_MACS.items()}, "matmul": MATMUL_MACS, "gemm": GEMM_MACS}


def test_the_formula_by_hand():
    assert layer_macs("Conv", (1, 16, 4, 4), (16, 1, 3, 3), groups=16) == CONV_MACS["depthwise"][-1]
    assert layer_macs("Conv", (1, 16, 4, 4), (16, 4, 3, 3), groups=4) == CONV_MACS["grouped"][-1]
    assert layer_macs("Conv", (1, 16, 4, 4), (16, 3, 4, 4)) == CONV_MACS["patch"][-1]
    assert layer_macs("MatMul", (1, 16, 8), (32, 8)) == MATMUL_MACS
    assert layer_macs("Gemm", (1, 5), (5, 8), trans_b=True) == layer_macs("Gemm", (1, 5), (8, 5)) == GEMM_MACS
    with pytest.raises(ValueError, match="not \\[Cout, Cin/16"):  # a depthwise weight left in RKNN's (1, C, k, k)
        layer_macs("Conv", (1, 16, 4, 4), (1, 16, 3, 3), groups=16)


def test_annotate_counts_each_layer_as_computed():
    plan = target("cpu").annotate(_float_model())
    assert {n.node: n.macs for n in plan.nodes} == HAND


def test_the_files_share_counts_the_same_macs():
    """precision_summary (the INT8 share in every report) counts what the plan counts: all float here,
    all INT8 in the Q/DQ file of the same convolutions."""
    p = precision_summary(_float_model())
    assert p["float_gemm_macs"] == sum(HAND.values()) and p["int8_gemm_macs"] == 0
    # each float GEMM/Conv named with its MACs, largest first: what the INT8-share gate lists
    assert [(f["node"], f["macs"]) for f in p["float_gemms"]] == sorted(HAND.items(), key=lambda kv: -kv[1])
    qdq = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(qdq_convs()))
    p = precision_summary(qdq)
    assert p["int8_gemm_macs"] == sum(v[-1] for v in CONV_MACS.values()) and p["int8_gemm_macs_share"] == 1.0
    assert conv_groups(qdq) == {"depthwise": 16, "grouped": 4}
