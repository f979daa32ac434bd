"""RKNN's INT8 layout keeps the Q/DQ model's function (checked in ONNX Runtime, float Q/DQ semantics):
only the rounding of the outputs it adds a Q/DQ to may differ; no RKNN needed here."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

from rknn_models import (
    DIM, HEADS, TOKENS, qdq_attention, qdq_convs, qdq_hybrid_block, qdq_linear, qdq_patch_conv, qdq_strided_conv, qdq_unhalved_gelu,
)
from vitexport.runners.sessions import QDQ_AS_FLOAT, session_options
from vitexport.targets.rknn.graph import HalvedGelus, infer_shapes, output_ranges, patch_convs, rknn_hazards, strided_convs
from vitexport.targets.rknn.qdq import (
    FUSED_ACTIVATIONS, BatchedProbsInFloat, ConvOutputsQdq, ConvsInFloat, CpuQuantizesInFloat, LinearsAsConv, MoveScoreScales, OutputQdq, PatchConvsInInt8,
    channel_scale, position_add, conv_output, conv_outputs_to_measure, feeds_softmax, linear_sites, patch_split, pooled_shortcut, quantized_convs, score_matmuls, stride_split,
)
from vitexport.targets.rknn.routes import layout_hazards, qdq_layout


def _run(model: ir.Model, feed: dict[str, np.ndarray]) -> np.ndarray:
    """Q/DQ as float (the NPU's arithmetic): ONNX Runtime's x86 integer kernels saturate u8 x s8 int16 sums on
    CPUs without VNNI, which would test the host CPU rather than the rewrite."""
    proto = ir.serde.serialize_model(model)
    sess = ort.InferenceSession(proto.SerializeToString(), session_options(QDQ_AS_FLOAT), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)[0]


def test_linears_as_conv_writes_qdq_convs_with_the_same_function():
    model = ir.serde.deserialize_model(qdq_linear())
    xs = [{"x": np.random.RandomState(i).randn(1, TOKENS, DIM).astype(np.float32)} for i in range(4)]
    before = [_run(model, x) for x in xs]
    sites = linear_sites(model)
    assert [s.matmul.name for s in sites] == ["linear"] and sites[0].bias_add is not None
    ranges = output_ranges(model, xs, [sites[0].output.name])
    assert LinearsAsConv(ranges)(model).report.changed == 1
    ops = [n.op_type for n in model.graph]
    assert "MatMul" not in ops and "Add" not in ops and ops.count("Conv") == 1
    conv = next(n for n in model.graph if n.op_type == "Conv")
    assert conv.inputs[0].producer().op_type == "DequantizeLinear"  # no layout op between DQ and the Conv
    assert [u[0].op_type for u in conv.outputs[0].uses()] == ["QuantizeLinear"]
    w_dq = conv.inputs[1].producer()
    assert w_dq.attributes["axis"].as_int() == 0 and tuple(w_dq.inputs[0].const_value.shape) == (32, DIM, 1, 1)
    lo, hi = ranges["lin"]
    step = max(-lo, hi) / 127  # the file's activations are symmetric int8: so is the new output Q/DQ
    for x, ref in zip(xs, before):
        assert np.abs(_run(model, x) - ref).max() <= step * 0.51 + 1e-6  # only the output's own rounding differs


def test_linears_without_a_range_are_left_alone():
    model = ir.serde.deserialize_model(qdq_linear())
    report = LinearsAsConv({})(model).report
    assert report.changed == 0 and report.skipped == {"linear": "no output range"}


def _images(n: int, size: int = 16) -> list[dict[str, np.ndarray]]:
    return [{"x": np.random.RandomState(i).randn(1, 3, size, size).astype(np.float32)} for i in range(n)]


def test_convs_in_float_drops_their_qdq():
    model = ir.serde.deserialize_model(qdq_patch_conv())
    x = _images(1)[0]
    before = _run(model, x)
    assert ConvsInFloat()(model).report.changed == 1
    conv = next(n for n in model.graph if n.op_type == "Conv")
    assert conv.inputs[0].producer() is None and conv.inputs[1].const_value is not None  # reads x, float weights
    assert np.abs(_run(model, x) - before).max() < 0.05  # only the input's rounding is gone


@pytest.mark.parametrize("size,patch,kernels", [(16, 4, [[4, 4]]), (32, 16, [[4, 4], [4, 4]]), (40, 20, [[1, 1]])])
def test_patch_convs_in_int8_keep_the_function(size, patch, kernels):
    """p ≤ 4: only the output Q/DQ'd; p = 16: a one-hot 4x4 space-to-depth conv and a 4x4 one; p = 20
    (no split into two ≤ 4x4 convs): patches to channels and a 1x1 conv. Every conv reads a DQ and is
    read by a Q: RKNN's INT8 form."""
    model = ir.serde.deserialize_model(qdq_patch_conv(size=size, patch=patch))
    xs = _images(4, size)
    before = [_run(model, x) for x in xs]
    assert [c.name for c in patch_convs(model)] == ["patch"]
    ranges = output_ranges(model, xs, ["c"])
    assert PatchConvsInInt8(ranges)(model).report.changed == 1
    convs = [n for n in model.graph if n.op_type == "Conv"]
    assert [list(c.attributes["kernel_shape"].as_ints()) for c in convs] == kernels
    for conv in convs:
        assert conv.inputs[0].producer().op_type == "DequantizeLinear"
        assert [u[0].op_type for u in conv.outputs[0].uses()] == ["QuantizeLinear"]
    assert ConvsInFloat()(model).report.changed == 0  # in the INT8 layout: left alone
    assert rknn_hazards(model) == []
    lo, hi = ranges["c"]
    for x, ref in zip(xs, before):
        assert np.abs(_run(model, x) - ref).max() <= max(-lo, hi) / 127 * 0.51 + 1e-5


def test_patch_split_factors():
    assert [patch_split(p) for p in (2, 4, 8, 12, 14, 16, 20)] == [None, None, 4, 4, None, 4, None]


def _qkv(n: int) -> list[dict[str, np.ndarray]]:
    shape = (1, HEADS, TOKENS, DIM)
    return [{k: np.random.RandomState(3 * i + j).randn(*shape).astype(np.float32) for j, k in enumerate("qkv")}
            for i in range(n)]


def test_the_score_scale_moves_after_qk_and_the_scores_get_a_qdq():
    """timm scales q before Q·Kᵀ, so the scores go straight into Softmax (a Q/DQ there crashes RKNN):
    the scale moves after the MatMul, the q Q/DQ takes s / c (the same int8 values), the scores' Q/DQ
    goes before the scale."""
    model = ir.serde.deserialize_model(qdq_attention())
    feeds = _qkv(4)
    before = [_run(model, f) for f in feeds]
    assert [m.name for m in score_matmuls(model)] == ["qk"]
    assert MoveScoreScales()(model).report.changed == 1
    np.testing.assert_allclose(_run(model, feeds[0]), before[0], atol=1e-6)  # the same function so far
    qk = score_matmuls(model)[0]
    assert next(iter(qk.outputs[0].uses()))[0].op_type == "Mul"
    ranges = output_ranges(model, feeds, [qk.outputs[0].name])
    assert OutputQdq(ranges)(model).report.changed == 1
    assert rknn_hazards(model) == [] and score_matmuls(model) == []  # the scores are quantized now
    lo, hi = ranges[qk.outputs[0].name]
    for f, ref in zip(feeds, before):
        # the scores' rounding (≤ half a step, times the scale) moves the probabilities a little
        assert np.abs(_run(model, f) - ref).max() < 0.5 * (hi - lo) / 255 * DIM ** -0.5 * 4 * np.abs(f["v"]).max()


def test_the_whole_layout_of_an_attention_has_no_hazard():
    model = ir.serde.deserialize_model(qdq_attention())
    assert layout_hazards(model) == []  # checked on a copy
    assert [n.name for n in score_matmuls(model)] == ["qk"]  # the model itself is untouched
    report = qdq_layout(model, _qkv(2))
    assert report["rknn_move_score_scales"] == 1 and report["rknn_output_qdq"] == 1


def test_a_file_already_in_the_layout_is_checked_as_it_stands():
    """``vitexport check model.rknn.onnx --target rk3588``: the laid-out file says so, so its hazards are
    read without laying it out again (which declared its output Q/DQ twice: an internal error)."""
    model = ir.serde.deserialize_model(qdq_patch_conv(size=16, patch=4))
    qdq_layout(model, _images(2, 16))
    laid_out = ir.serde.serialize_model(model)
    assert layout_hazards(ir.serde.deserialize_model(laid_out)) == []
    assert ir.serde.serialize_model(model) == laid_out  # checked on a copy


@pytest.mark.parametrize("batch, tokens, changed", [(4, 16, 1), (2, 32, 1), (1, 16, 0), (4, 8, 0), (2, 24, 0)])
def test_batched_probabilities_lose_their_qdq_where_rknn_converts_them_on_the_cpu(batch, tokens, changed, monkeypatch):
    """Softmax outputs [batch > 1, H, T, T] with T a multiple of 16 (Swin's windows) come out of Q/DQ:
    attn·V reads the Softmax itself; anything else keeps its INT8 probabilities."""
    import rknn_models

    monkeypatch.setattr(rknn_models, "TOKENS", tokens)
    model = ir.serde.deserialize_model(rknn_models.qdq_attention(batch=batch))
    shape = (batch, HEADS, tokens, DIM)
    feed = {k: np.random.RandomState(j).randn(*shape).astype(np.float32) for j, k in enumerate("qkv")}
    before = _run(model, feed)
    assert BatchedProbsInFloat()(model).report.changed == changed
    pv = next(n for n in model.graph if n.name == "pv")
    assert pv.inputs[0].producer().op_type == ("Softmax" if changed else "DequantizeLinear")
    after = _run(model, feed)
    if changed:  # only the probabilities' rounding (half a 1/127 step each) left, and one step of y's Q/DQ
        bound = 0.5 / 127 * tokens * np.abs(feed["v"]).max() + 4.0 / 127
        assert np.abs(after - before).max() <= bound
    else:
        np.testing.assert_array_equal(after, before)


def test_a_quantization_rknn_converts_on_the_cpu_loses_its_qdq_and_nothing_else():
    """CpuQuantizesInFloat takes off the Q/DQ pairs RKNN's op table named on the CPU (the probabilities'
    here): attn·V reads the Softmax; the other pairs, and names that are no QuantizeLinear, stay."""
    model = ir.serde.deserialize_model(qdq_attention())
    feed = {k: np.random.RandomState(j).randn(1, HEADS, TOKENS, DIM).astype(np.float32) for j, k in enumerate("qkv")}
    before = _run(model, feed)
    pairs = sum(n.op_type == "QuantizeLinear" for n in model.graph)
    report = CpuQuantizesInFloat({"pa_Q", "softmax", "no_such_node"})(model).report
    assert report.changed == 1 and "RKNN converted it on the CPU" in report.skipped["pa_Q"]
    assert "pa_Q" in report.skipped["pv"]  # the reader's reason, for the INT8-share gate's float layers
    assert sum(n.op_type == "QuantizeLinear" for n in model.graph) == pairs - 1
    pv = next(n for n in model.graph if n.name == "pv")
    assert pv.inputs[0].producer().op_type == "Softmax"
    # only the probabilities' rounding is gone: half a 1/127 step each, summed over the tokens, times |v|
    bound = 0.5 / 127 * TOKENS * np.abs(feed["v"]).max() + 4.0 / 127
    assert 0 < np.abs(_run(model, feed) - before).max() <= bound


def _float_qdq_run(model: ir.Model, feed: dict[str, np.ndarray]) -> np.ndarray:
    """ONNX Runtime with Q/DQ as float ops (the gate's arithmetic): a rounding tie flips no int8 kernel."""
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_quant_qdq", "1")
    proto = ir.serde.serialize_model(model).SerializeToString()
    return ort.InferenceSession(proto, so, providers=["CPUExecutionProvider"]).run(None, feed)[0]


@pytest.mark.parametrize("act", ["relu", "clip", "silu", "hardswish"])
def test_every_quantized_conv_gets_its_output_qdq_where_rknn_wants_it(act):
    """After the layout every Conv reads a DQ and its output is read by Q only: after a Relu/Clip RKNN
    fuses (ConvRelu INT8), before a SiLU/HardSwish (which RKNN would fuse and run in float16); no Conv is
    stripped; the padded AveragePool counts its padding, times a border map; the function is kept up to
    the rounding of the added Q/DQ."""
    model = ir.serde.deserialize_model(qdq_hybrid_block(act=act))
    feeds = _images16(4)
    before = [_float_qdq_run(model, f) for f in feeds]
    report = qdq_layout(model, feeds)
    # Relu/Clip: their outputs are the next conv's input, Q'd already; only the pointwise conv needs a pair
    assert report["rknn_conv_outputs_qdq"] == (1 if act in FUSED_ACTIVATIONS_LOWER else 3)
    assert report["rknn_convs_in_float"] == 0
    assert report["rknn_padded_avgpools"] == 1
    for conv in (n for n in model.graph if n.op_type == "Conv"):
        assert conv.inputs[0].producer().op_type == "DequantizeLinear"
        fused = [u for u, _ in conv.outputs[0].uses() if u.op_type in FUSED_ACTIVATIONS]
        qdq_after = fused[0].outputs[0] if fused else conv.outputs[0]
        assert {u.op_type for u, _ in qdq_after.uses()} == {"QuantizeLinear"}, conv.name
        assert bool(fused) == (act in FUSED_ACTIVATIONS_LOWER and conv.name != "pointwise"), conv.name
    pool = next(n for n in model.graph if n.op_type == "AveragePool")
    assert pool.attributes["count_include_pad"].as_int() == 1
    assert [u.op_type for u, _ in pool.outputs[0].uses()] == ["Mul"]
    for f, ref in zip(feeds, before):
        # the pointwise conv's new output Q/DQ (the other convs reuse the next op's) rounds the residual's input
        assert _cos(_float_qdq_run(model, f), ref) > 0.999


FUSED_ACTIVATIONS_LOWER = ("relu", "clip")


def _images16(n: int) -> list[dict[str, np.ndarray]]:
    return [{"x": np.random.RandomState(i).randn(1, 16, 16, 16).astype(np.float32)} for i in range(n)]


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_a_conv_whose_output_a_quantize_already_reads_shares_it():
    """conv → Relu → Q (the next conv's input): nothing added, the Relu output is already INT8's."""
    model = ir.serde.deserialize_model(qdq_convs())
    convs = quantized_convs(model)
    assert [conv_output(c).producer().op_type for c in convs] == ["Relu"] * 4
    assert conv_outputs_to_measure(model) == ["y"]  # the last Relu: a graph output nothing quantizes yet
    report = ConvOutputsQdq({"y": (0.0, 4.0)}, np.dtype(np.int8))(model).report
    assert report.changed == 1 and model.graph.outputs[0].name == "y"
    assert model.graph.outputs[0].producer().op_type == "DequantizeLinear"


def test_a_stride_8_patch_conv_splits_into_a_space_to_depth_conv_and_a_stride_2_one():
    """PiT's 16x16 stride-8 patch conv (RKNN crashes on any Q/DQ conv of stride 8): a one-hot 4x4
    stride-4 conv and a 4x4 stride-2 one, the same function (the one-hot conv moves values exactly)."""
    model = ir.serde.deserialize_model(qdq_strided_conv())
    assert rknn_hazards(model) == []  # a split fits: the layout makes it (the float graph is checked before it)
    assert [c.name for c in strided_convs(model)] == ["patch"] and stride_split(strided_convs(model)[0]) == 4
    feeds = _images(3, 32)
    before = [_float_qdq_run(model, f) for f in feeds]
    report = qdq_layout(model, feeds)
    assert report["rknn_patch_convs_in_int8"] == 1 and report["rknn_convs_in_float"] == 0
    convs = [n for n in model.graph if n.op_type == "Conv"]
    assert [(list(c.attributes["kernel_shape"].as_ints()), list(c.attributes["strides"].as_ints())) for c in convs] == [
        ([4, 4], [4, 4]), ([4, 4], [2, 2])]
    assert rknn_hazards(model) == []
    for f, ref in zip(feeds, before):
        np.testing.assert_allclose(_float_qdq_run(model, f), ref, atol=1e-5)


def test_a_strided_conv_no_split_fits_is_left_float_with_the_reason():
    """A 5x5 stride-8 conv: no factor divides both, so it stays as it is, its Q/DQ off, and the hazard
    (RKNN refuses a float conv of stride 8 too) names the node and the rule before RKNN runs."""
    model = ir.serde.deserialize_model(qdq_strided_conv(size=37, kernel=5, stride=8))
    report = qdq_layout(model, _images(2, 37))
    assert report["rknn_patch_convs_in_int8"] == 0 and report["rknn_conv_outputs_qdq"] == 0
    assert report["rknn_convs_in_float"] == 1
    assert "stride 8: no space-to-depth step of 2 to 4 divides" in report["skipped"]["patch"]
    (hazard,) = rknn_hazards(model)
    assert hazard.rule == "rknn.conv_stride" and str(hazard).startswith("node patch: stride-8 Conv: RKNN 2.5.0 compiles no")
    assert "no space-to-depth step of 2 to 4 divides" in str(hazard)


def _pooled_shortcut_model() -> ir.Model:
    """EfficientFormerV2's downsampling query: DQ(x) → 3x3 stride-2 depthwise conv, + AveragePool 1x1
    stride 2 of x, → Q/DQ → 1x1 conv."""
    rs = np.random.RandomState(0)
    inits = [nh.from_array(np.array(4 / 127, np.float32), "s"), nh.from_array(np.array(0, np.int8), "z"),
             nh.from_array(rs.randint(-127, 127, (8, 1, 3, 3)).astype(np.int8), "wq"),
             nh.from_array(np.full(8, 0.01, np.float32), "ws"), nh.from_array(np.zeros(8, np.int8), "wz"),
             nh.from_array(rs.randint(-127, 127, (8, 8, 1, 1)).astype(np.int8), "pq")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]), helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
             helper.make_node("Conv", ["xd", "w"], ["local"], group=8, kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4, name="local"),
             helper.make_node("AveragePool", ["xd"], ["pool"], kernel_shape=[1, 1], strides=[2, 2], name="pool"),
             helper.make_node("Add", ["local", "pool"], ["q"], name="add"),
             helper.make_node("QuantizeLinear", ["q", "s", "z"], ["qq"]), helper.make_node("DequantizeLinear", ["qq", "s", "z"], ["qd"]),
             helper.make_node("DequantizeLinear", ["pq", "ws", "wz"], ["pw"], axis=0),
             helper.make_node("Conv", ["qd", "pw"], ["y"], kernel_shape=[1, 1], name="proj")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])], inits)
    return ir.serde.deserialize_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))


def test_a_conv_beside_a_pooled_shortcut_stays_float_with_the_reason():
    """conv(x) + pool(x): RKNN crashes with the conv in INT8 (EfficientFormerV2 at 224), so its Q/DQ comes
    off, said per node; the 1x1 projection after the sum is laid out for INT8 as usual."""
    model = _pooled_shortcut_model()
    assert [pooled_shortcut(c) for c in quantized_convs(model)] == [True, False]
    report = qdq_layout(model, [{"x": np.random.RandomState(i).randn(1, 8, 8, 8).astype(np.float32)} for i in range(2)])
    assert report["rknn_convs_in_float"] == 1 and "pooled shortcut" in report["skipped"]["local"]
    local = next(n for n in model.graph if n.name == "local")
    assert local.inputs[0].producer() is None and local.inputs[1].const_value is not None  # float16 in RKNN
    proj = next(n for n in model.graph if n.name == "proj")
    assert proj.inputs[0].producer().op_type == "DequantizeLinear"
    assert [u.op_type for u, _ in proj.outputs[0].uses()] == ["QuantizeLinear"]


def _talking_heads_model() -> ir.Model:
    """EfficientFormerV2's talking heads: scores (1, 4 heads, 16, 16) → Q/DQ → 1x1 conv across the heads
    → Softmax over the keys."""
    rs = np.random.RandomState(0)
    inits = [nh.from_array(np.array(4 / 127, np.float32), "s"), nh.from_array(np.array(0, np.int8), "z"),
             nh.from_array(rs.randint(-127, 127, (4, 4, 1, 1)).astype(np.int8), "wq"),
             nh.from_array(np.full(4, 0.01, np.float32), "ws"), nh.from_array(np.zeros(4, np.int8), "wz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]), helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
             helper.make_node("Conv", ["xd", "w"], ["mix"], kernel_shape=[1, 1], name="talking_head1"),
             helper.make_node("Softmax", ["mix"], ["y"], axis=-1, name="softmax")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], inits)
    return ir.serde.deserialize_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))


def test_a_conv_feeding_a_softmax_stays_float_with_the_reason_and_no_hazard():
    """A head-mixing 1x1 conv right before Softmax: its output Q/DQ would make Softmax read a
    DequantizeLinear (RKNN segfaults: rule rknn.softmax_qdq), so it gets none and runs float16, said per node."""
    model = _talking_heads_model()
    assert [feeds_softmax(c) for c in quantized_convs(model)] == [True]
    assert conv_outputs_to_measure(model) == []
    feeds = [{"x": np.random.RandomState(i).randn(1, 4, 16, 16).astype(np.float32)} for i in range(2)]
    report = qdq_layout(model, feeds)
    assert report["rknn_convs_in_float"] == 1 and "feeds a Softmax" in report["skipped"]["talking_head1"]
    assert layout_hazards(model) == [] and rknn_hazards(model) == []
    softmax = next(n for n in model.graph if n.name == "softmax")
    assert softmax.inputs[0].producer().op_type == "Conv"
    assert _run(model, feeds[0]).shape == (1, 4, 16, 16)


def test_a_float_conv_after_an_int8_conv_keeps_reading_its_qdq_so_that_one_stays_int8():
    """FastViT: the fallback kept a 1x1 conv float right after a 7x7 downsampling conv. Taking the float
    conv's input Q/DQ off took off the 7x7 conv's output Q/DQ too, and RKNN ran it (34 % of the MACs) in float16."""
    rs = np.random.RandomState(0)
    inits = [nh.from_array(np.array(4 / 127, np.float32), "s"), nh.from_array(np.array(0, np.int8), "z"),
             nh.from_array(rs.randint(-127, 127, (8, 1, 7, 7)).astype(np.int8), "wq"),
             nh.from_array(np.full(8, 0.01, np.float32), "ws"), nh.from_array(np.zeros(8, np.int8), "wz"),
             nh.from_array(rs.randn(8, 8, 1, 1).astype(np.float32), "pw")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]), helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
             helper.make_node("Conv", ["xd", "w"], ["down"], group=8, kernel_shape=[7, 7], strides=[2, 2], pads=[3] * 4, name="down"),
             helper.make_node("Conv", ["down", "pw"], ["y"], kernel_shape=[1, 1], name="proj")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    model = ir.serde.deserialize_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    report = qdq_layout(model, [{"x": np.random.RandomState(i).randn(1, 8, 16, 16).astype(np.float32)} for i in range(2)])
    assert report["rknn_conv_outputs_qdq"] == 1
    down, proj = (next(n for n in model.graph if n.name == k) for k in ("down", "proj"))
    assert [u.op_type for u, _ in down.outputs[0].uses()] == ["QuantizeLinear"]  # the 7x7 conv in INT8
    assert proj.inputs[0].producer().op_type == "DequantizeLinear" and proj.inputs[1].const_value is not None
    assert layout_hazards(model) == []


def test_a_gelu_without_its_half_gets_it_back_with_a_double_after():
    """x·(1 + erf(x/√2)) (RKNN runs its Erf on the CPU) is followed by ·0.5·2 (the whole GELU RKNN fuses):
    the same function; a whole GELU is left alone."""
    model = ir.serde.deserialize_model(qdq_unhalved_gelu())
    feed = {"x": np.random.RandomState(0).randn(1, 16, 8, 8).astype(np.float32)}
    before = _float_qdq_run(model, feed)
    assert HalvedGelus()(model).report.changed == 1
    mul = next(n for n in model.graph if n.name == "gelu_mul")
    (half,) = [u for u, _ in mul.outputs[0].uses()]
    (double,) = [u for u, _ in half.outputs[0].uses()]
    assert (half.inputs[1].const_value.numpy(), double.inputs[1].const_value.numpy()) == (0.5, 2.0)
    assert [u.name for u, _ in double.outputs[0].uses()] == ["mid"]
    np.testing.assert_allclose(_float_qdq_run(model, feed), before, rtol=1e-6, atol=1e-6)
    assert HalvedGelus()(model).report.changed == 0  # now a whole GELU


def test_a_grouped_conv_gets_its_bias_as_int32_at_the_scale_onnx_runtime_uses_and_keeps_its_function():
    """RKNN 2.5.0 aborts deriving its own bias scale for NextViT's 12-group 3x3 conv (clip_truncate < 0): a grouped
    conv's float bias becomes an int32 DequantizeLinear at activation scale × weight scale; depthwise and dense
    convs keep their float bias; the outputs stay those of the Q/DQ file within the bias's rounding."""
    model = ir.serde.deserialize_model(qdq_convs())
    x = {"x": np.random.RandomState(0).randn(1, 3, 16, 16).astype(np.float32)}
    before = _run(model, x)
    ConvOutputsQdq({"y": (0.0, 4.0)}, np.dtype(np.int8))(model)
    convs = {n.name: n for n in model.graph if n.op_type == "Conv"}
    bias_dq = convs["grouped"].inputs[2].producer()
    assert bias_dq is not None and bias_dq.op_type == "DequantizeLinear"
    q, scale = bias_dq.inputs[0].const_value.numpy(), bias_dq.inputs[1].const_value.numpy()
    ws = next(n for n in model.graph if n.name == "grouped_w_DQ").inputs[1].const_value.numpy()
    assert q.dtype == np.int32 and np.allclose(scale, np.float32(4.0 / 127) * ws)
    assert all(convs[n].inputs[2].producer() is None for n in ("patch", "depthwise", "pointwise"))
    after = _run(model, x)
    assert np.abs(after - before).max() <= 4.0 / 127 + 1e-6  # at most one step of the output Q/DQ the pass added
    # a dead channel's tiny weight scale beside a live bias: no int32 holds bias / scale, so the float bias stays
    dead = ir.serde.deserialize_model(qdq_convs())
    ws_value = next(n for n in dead.graph if n.name == "grouped_w_DQ").inputs[1]
    tiny = ws_value.const_value.numpy().copy()
    tiny[0] = 1e-12
    ws_value.const_value = ir.tensor(tiny, name=ws_value.name)
    ConvOutputsQdq({"y": (0.0, 4.0)}, np.dtype(np.int8))(dead)
    assert next(n for n in dead.graph if n.name == "grouped").inputs[2].producer() is None


def _positioned_rows_linears(rows: str = "Transpose") -> ir.Model:
    """A conv stage's map turned into token rows by a Transpose, a constant position embedding added (one value per
    token and channel), then two Q/DQ'd Linears reading the sum: DETR's encoder before its q and k projections
    (``rows="Relu"``: rows an activation made, x already [1, T, D])."""
    rs = np.random.RandomState(0)
    inits = [nh.from_array((rs.randn(1, TOKENS, DIM) * 0.5).astype(np.float32), "pos"),
             nh.from_array(np.array(6 / 127, np.float32), "s"), nh.from_array(np.array(0, np.int8), "z")]
    to_rows = (helper.make_node("Transpose", ["x"], ["rows"], perm=[0, 2, 1], name="to_rows") if rows == "Transpose"
               else helper.make_node(rows, ["x"], ["rows"], name="to_rows"))
    nodes = [to_rows, helper.make_node("Add", ["rows", "pos"], ["rows_pos"], name="pos_Add"),
             helper.make_node("QuantizeLinear", ["rows_pos", "s", "z"], ["xq"], name="x_Q"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="x_DQ")]
    for k in ("q", "k"):
        w = (rs.randn(DIM, 8) * 0.2).astype(np.float32)
        ws = np.abs(w).max(axis=0) / 127
        inits += [nh.from_array(np.round(w / ws).astype(np.int8), f"{k}_wq"), nh.from_array(ws.astype(np.float32), f"{k}_ws"),
                  nh.from_array(np.zeros(8, np.int8), f"{k}_wz")]
        nodes += [helper.make_node("DequantizeLinear", [f"{k}_wq", f"{k}_ws", f"{k}_wz"], [f"{k}_w"], axis=1, name=f"{k}_w_DQ"),
                  helper.make_node("MatMul", ["xd", f"{k}_w"], [k], name=f"{k}_proj")]
    nodes.append(helper.make_node("Add", ["q", "k"], ["y"], name="join"))
    x_shape = [1, DIM, TOKENS] if rows == "Transpose" else [1, TOKENS, DIM]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, TOKENS, 8])], inits)
    return ir.serde.deserialize_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))


def test_a_position_add_on_transposed_rows_moves_onto_each_linears_conv_view():
    """RKNN 2.5.0 segfaults on DETR's position Add between the rows' Transpose and the conv view's: each Linear's
    conv view adds the constant, laid out as [1, Cin, 1, T], after its Transpose and before its input Q/DQ, the
    same function, and the Add on the rows goes; an Add on rows an activation made stays as it is."""
    model = _positioned_rows_linears()
    feeds = [{"x": np.random.RandomState(i).randn(1, DIM, TOKENS).astype(np.float32)} for i in range(2)]
    before = _float_qdq_run(model, feeds[0])
    ranges = output_ranges(model, feeds, ["q", "k"])
    infer_shapes(model)  # as linear_sites does before LinearsAsConv reads them
    add = model.graph.node("pos_Add")
    rows, pos = position_add(add.outputs[0], TOKENS, DIM)
    assert rows.name == "rows" and pos.shape == (TOKENS, DIM)
    assert position_add(add.outputs[0], TOKENS, DIM + 1) is None  # not one value per token and channel
    assert LinearsAsConv(ranges)(model).report.changed == 2
    assert "pos_Add" not in {n.name for n in model.graph}
    moved = [n for n in model.graph if n.op_type == "Add" and n.name.endswith("_nc_position_Add")]
    assert len(moved) == 2
    for n in moved:
        assert n.inputs[0].producer().op_type == "Transpose" and n.inputs[1].const_value.numpy().shape == (1, DIM, 1, TOKENS)
        assert [u.op_type for u, _ in n.outputs[0].uses()] == ["QuantizeLinear"]
    # the Q/DQ pairs quantize the same sums: only the Linears' output Q/DQ, which the layout adds, moves the values
    np.testing.assert_allclose(_float_qdq_run(model, feeds[0]), before, atol=4 * float(np.ptp(before)) / 255)
    relu = _positioned_rows_linears("Relu")
    assert position_add(relu.graph.node("pos_Add").outputs[0], TOKENS, DIM) is None
    LinearsAsConv(output_ranges(relu, [{"x": f["x"].transpose(0, 2, 1)} for f in feeds], ["q", "k"]))(relu)
    assert "pos_Add" in {n.name for n in relu.graph}  # left where it was


def _smoothed_rows_linear(rows: str = "Transpose") -> ir.Model:
    """A conv stage's map turned into token rows by a Transpose, the smoothing Mul vitexport inserts, then a
    Q/DQ'd Linear: NextViT's E-MHSA q/k/v input (``rows="Relu"``: rows an activation made, x already [1, T, D])."""
    rs = np.random.RandomState(0)
    w = (rs.randn(DIM, 8) * 0.2).astype(np.float32)
    ws = np.abs(w).max(axis=0) / 127
    inits = [nh.from_array(np.linspace(0.5, 2.0, DIM).astype(np.float32), "smooth"),
             nh.from_array(np.array(4 / 127, np.float32), "s"), nh.from_array(np.array(0, np.int8), "z"),
             nh.from_array(np.round(w / ws).astype(np.int8), "wq"), nh.from_array(ws.astype(np.float32), "ws"),
             nh.from_array(np.zeros(8, np.int8), "wz"), nh.from_array((rs.randn(8) * 0.1).astype(np.float32), "b")]
    to_rows = (helper.make_node("Transpose", ["x"], ["rows"], perm=[0, 2, 1], name="to_rows") if rows == "Transpose"
               else helper.make_node(rows, ["x"], ["rows"], name="to_rows"))
    nodes = [to_rows,
             helper.make_node("Mul", ["rows", "smooth"], ["rows_smoothed"], name="rows_smooth_Mul"),
             helper.make_node("QuantizeLinear", ["rows_smoothed", "s", "z"], ["xq"], name="x_Q"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="x_DQ"),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=1, name="w_DQ"),
             helper.make_node("MatMul", ["xd", "w"], ["mm"], name="linear"),
             helper.make_node("Add", ["mm", "b"], ["y"], name="bias")]
    x_shape = [1, DIM, TOKENS] if rows == "Transpose" else [1, TOKENS, DIM]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, TOKENS, 8])], inits)
    return ir.serde.deserialize_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))


def test_a_smoothing_mul_on_transposed_rows_becomes_a_depthwise_conv_on_the_linears_conv_view():
    """RKNN 2.5.0 crashes on that Mul (SIGSEGV in OpEmit, NextViT): the Linear's conv view scales its channels
    with a float 1x1 depthwise conv (zero bias) right before its input Q/DQ instead, the same function; a Mul
    the rows were not made by a Transpose or Reshape for (a GELU's output) stays as it is."""
    model = _smoothed_rows_linear()
    assert channel_scale(model.graph.node("rows_smooth_Mul").outputs[0], DIM)[0].name == "rows"
    feeds = [{"x": np.random.RandomState(i).randn(1, DIM, TOKENS).astype(np.float32)} for i in range(2)]
    before = _run(model, feeds[0])
    ranges = output_ranges(model, feeds, ["y"])
    assert LinearsAsConv(ranges)(model).report.changed == 1
    assert [n.op_type for n in model.graph].count("Mul") == 0
    smooth = next(n for n in model.graph if n.op_type == "Conv" and n.attributes["group"].as_int() == DIM)
    assert smooth.inputs[0].producer().op_type == "Transpose"
    assert [u.op_type for u, _ in smooth.outputs[0].uses()] == ["QuantizeLinear"]
    assert not smooth.inputs[2].const_value.numpy().any()
    np.testing.assert_allclose(_run(model, feeds[0]), before, atol=2 * float(np.ptp(before)) / 255)
    relu = _smoothed_rows_linear("Relu")
    LinearsAsConv(output_ranges(relu, [{"x": f["x"].transpose(0, 2, 1)} for f in feeds], ["y"]))(relu)
    assert channel_scale(relu.graph.node("rows_smooth_Mul").outputs[0], DIM) is None
    assert [n.op_type for n in relu.graph].count("Mul") == 1  # left where it was
