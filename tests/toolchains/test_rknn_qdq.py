"""RKNN's INT8 layout keeps the Q/DQ model's function (checked in ONNX Runtime, float Q/DQ semantics):
only the rounding of the outputs it adds a Q/DQ to may differ; no RKNN needed here."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from rknn_models import DIM, HEADS, TOKENS, qdq_attention, qdq_linear, qdq_patch_conv
from vitexport.toolchains.rknn_graph import output_ranges, patch_convs, rknn_hazards
from vitexport.toolchains.rknn_qdq import (
    BatchedProbsInFloat, ConvsInFloat, LinearsAsConv, MoveScoreScales, OutputQdq, PatchConvsInInt8, linear_sites, patch_split, score_matmuls,
)
from vitexport.toolchains.rknn_routes import layout_hazards, qdq_layout


def _run(model: ir.Model, feed: dict[str, np.ndarray]) -> np.ndarray:
    proto = ir.serde.serialize_model(model)
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]


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
