"""The RKNN layout transforms keep the model's function (checked in ONNX Runtime) and write the
forms rknn-toolkit2 compiles; no RKNN needed here."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from rknn_models import DIM, TOKENS, masked_attention, qdq_linear, qdq_patch_conv
from vitexport.toolchains.rknn_graph import (
    RKNN_FILL, ConvsInFloat, FullShapeMasks, LinearsAsConv, PatchConvsAs1x1, linear_sites, output_ranges, patch_convs,
    rknn_hazards,
)


def _run(model: ir.Model, x: np.ndarray) -> np.ndarray:
    proto = ir.serde.serialize_model(model)
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_full_shape_masks_keeps_the_output_and_names_the_crash():
    model = ir.serde.deserialize_model(masked_attention())
    x = np.random.RandomState(0).randn(1, 1, TOKENS, DIM).astype(np.float32)
    before = _run(model, x)
    hazards = rknn_hazards(model)
    assert len(hazards) == 1 and "mask_where" in hazards[0] and "segfault" in hazards[0]
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
    assert "broadcasts" in rknn_hazards(model)[0]
    assert FullShapeMasks()(model).report.changed == 1
    expand = next(n for n in model.graph if n.op_type == "Expand")
    assert expand.inputs[0].name == "keep" and list(expand.inputs[1].const_value.numpy()) == [1, 1, TOKENS, TOKENS]
    np.testing.assert_allclose(run(), before, rtol=0, atol=1e-6)
    assert rknn_hazards(model) == []


def test_linears_as_conv_writes_qdq_convs_with_the_same_function():
    model = ir.serde.deserialize_model(qdq_linear())
    xs = [np.random.RandomState(i).randn(1, TOKENS, DIM).astype(np.float32) for i in range(4)]
    before = [_run(model, x) for x in xs]
    sites = linear_sites(model)
    assert [s.matmul.name for s in sites] == ["linear"] and sites[0].bias_add is not None
    ranges = output_ranges(model, [{"x": x} for x in xs], [sites[0].output.name])
    report = LinearsAsConv(ranges)(model).report
    assert report.changed == 1
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


def _images(n: int) -> list[np.ndarray]:
    return [np.random.RandomState(i).randn(1, 3, 16, 16).astype(np.float32) for i in range(n)]


def test_convs_in_float_drops_their_qdq():
    model = ir.serde.deserialize_model(qdq_patch_conv())
    x = _images(1)[0]
    before = _run(model, x)
    assert ConvsInFloat()(model).report.changed == 1
    conv = next(n for n in model.graph if n.op_type == "Conv")
    assert conv.inputs[0].producer() is None and conv.inputs[1].const_value is not None  # reads x, float weights
    assert np.abs(_run(model, x) - before).max() < 0.05  # only the input's rounding is gone


def test_patch_conv_as_space_to_depth_and_1x1_keeps_the_function():
    model = ir.serde.deserialize_model(qdq_patch_conv())
    xs = _images(4)
    before = [_run(model, x) for x in xs]
    convs = patch_convs(model)
    assert [c.name for c in convs] == ["patch"]
    ranges = output_ranges(model, [{"x": x} for x in xs], ["c"])
    assert PatchConvsAs1x1(ranges)(model).report.changed == 1
    conv = next(n for n in model.graph if n.op_type == "Conv")
    assert list(conv.attributes["kernel_shape"].as_ints()) == [1, 1]
    assert conv.inputs[0].producer().op_type == "DequantizeLinear"
    assert conv.inputs[0].producer().inputs[0].producer().inputs[0].producer().op_type == "Reshape"
    assert [u[0].op_type for u in conv.outputs[0].uses()] == ["QuantizeLinear"]
    assert ConvsInFloat()(model).report.changed == 0  # in the INT8 layout: left alone
    lo, hi = ranges["c"]
    for x, ref in zip(xs, before):
        assert np.abs(_run(model, x) - ref).max() <= max(-lo, hi) / 127 * 0.51 + 1e-5
