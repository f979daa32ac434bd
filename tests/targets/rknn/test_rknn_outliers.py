"""A Linear's outlier output channels keep their resolution in RKNN's INT8 layout: scaled inside the Linear,
multiplied back after its output Q/DQ (checked in ONNX Runtime, and on RKNN's simulator where it exists)."""
from __future__ import annotations

import numpy as np
import onnx.numpy_helper as nh
import onnx_ir as ir
import onnxruntime as ort
import pytest

from rknn_models import DIM, TOKENS, qdq_linear
from vitexport.graph.files import save_model
from vitexport.runners.sessions import QDQ_AS_FLOAT, session_options
from vitexport.targets.rknn.client import RknnRequest, rknn_missing, run_rknn
from vitexport.targets.rknn.outliers import ScaledLinearOutputs, channel_scales
from vitexport.targets.rknn.qdq import LinearsAsConv, linear_sites
from vitexport.targets.rknn.ranges import measure_layout_ranges
from vitexport.targets.rknn.routes import qdq_layout

OUTLIER, FACTOR = 5, 60.0


def _outlier_linear() -> ir.Model:
    """qdq_linear with output channel OUTLIER ×FACTOR (its weight scale, so the int8 weights are the same)."""
    proto = qdq_linear()
    for init in proto.graph.initializer:
        if init.name == "ws":
            ws = nh.to_array(init).copy()
            ws[OUTLIER] *= FACTOR
            init.CopyFrom(nh.from_array(ws, "ws"))
    return ir.serde.deserialize_model(proto)


def _feeds(n: int = 8) -> list[dict[str, np.ndarray]]:
    return [{"x": np.random.RandomState(i).randn(1, TOKENS, DIM).astype(np.float32)} for i in range(n)]


def _run(model: ir.Model, feeds) -> np.ndarray:
    data = ir.serde.serialize_model(model).SerializeToString()
    # Q/DQ as float (the NPU's arithmetic), not ONNX Runtime's x86 integer kernels, which saturate without VNNI
    sess = ort.InferenceSession(data, session_options(QDQ_AS_FLOAT), providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, f)[0] for f in feeds])


def _layout(scaled: bool) -> ir.Model:
    model = _outlier_linear()
    name = linear_sites(model)[0].output.name
    per_channel = measure_layout_ranges(model, _feeds(), [name], np.dtype(np.uint8)).per_channel
    ranges = {name: (float(per_channel[name][0].min()), float(per_channel[name][1].max()))}
    if scaled:
        assert ScaledLinearOutputs(per_channel, ranges)(model).report.changed == 1
    LinearsAsConv(ranges)(model)
    return model


def test_channel_scales_bring_outliers_to_the_median_and_leave_the_rest():
    lo, hi = -np.ones(8), np.ones(8)
    hi[2] = 40.0
    s = channel_scales(lo, hi)
    assert s is not None and s[2] == pytest.approx(40.0) and np.all(np.delete(s, 2) == 1.0)
    assert channel_scales(-np.ones(8), np.ones(8) * 1.5) is None  # no channel far out: nothing to gain


def test_outlier_channel_no_longer_coarsens_every_other_channel():
    ref = _run(_outlier_linear(), _feeds())
    plain, scaled = _run(_layout(False), _feeds()), _run(_layout(True), _feeds())
    others = np.delete(np.arange(ref.shape[-1]), OUTLIER)
    err_plain = np.abs(plain - ref)[..., others].max()
    err_scaled = np.abs(scaled - ref)[..., others].max()
    assert err_scaled < err_plain / 10, (err_scaled, err_plain)
    # the outlier channel keeps its own relative resolution
    rel = np.abs(scaled - ref)[..., OUTLIER].max() / np.abs(ref[..., OUTLIER]).max()
    assert rel < 0.02


def test_qdq_layout_scales_outliers_and_keeps_the_function():
    model, feeds = _outlier_linear(), _feeds()
    ref = _run(model, feeds)
    report = qdq_layout(model, feeds)
    assert report["rknn_scaled_linear_outputs"] == 1
    mul = next(n for n in model.graph if n.op_type == "Mul")
    assert mul.inputs[0].producer().op_type in ("DequantizeLinear", "Transpose", "Reshape")  # after the output Q/DQ
    out = _run(model, feeds)
    assert np.abs(out - ref).max() / np.abs(ref).max() < 0.02


@pytest.mark.slow
def test_scaled_linear_runs_int8_on_the_npu(tmp_path):
    missing = rknn_missing()
    if missing:
        pytest.skip(missing)
    model, feeds = _outlier_linear(), _feeds(4)
    qdq_layout(model, feeds)
    path = tmp_path / "lin.onnx"
    save_model(model, path)
    res = run_rknn(RknnRequest(onnx=path, platform="rk3588", config={"remove_reshape": True}, inputs=feeds), tmp_path / "w")
    assert res.summary.int8_share == 1.0, res.summary.to_dict()  # RKNN's own op table
    assert res.summary.on_cpu == []  # the per-channel Mul runs on the NPU
    ref = _run(model, feeds)
    a, b = res.outputs[0].ravel().astype(np.float64), ref.ravel().astype(np.float64)
    assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) > 0.999
