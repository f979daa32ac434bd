"""FP16 islands: float parts of a Q/DQ graph in float16, FP32 where calibrated ranges demand it."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
import torch
from torch import nn

from qcases import target
from qgraph import load
from qmodels import export_onnx
from vitexport.calibration import random_samples
from vitexport.runners.sessions import QDQ_AS_FLOAT, Session
from vitexport.graph.query import opset_version
from vitexport.parity.metrics import compute_metrics
from vitexport.quantize import quantize_int8
from vitexport.quantize.precision import Float16Islands, precision_summary, to_opset

NO_FALLBACK = "quantization.fallback.enabled=false"


class _Hot(nn.Module):
    """A block whose middle channel runs hot: ``fc1`` writes values around 1e5 (beyond float16's
    65504), LayerNorm then reads them, ``fc2`` is fed the normalised result."""

    def __init__(self, hot: float):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 4)
        with torch.no_grad():
            self.fc1.weight[3] *= hot
            self.fc1.bias[3] = hot

    def forward(self, x):
        return self.fc2(self.norm(torch.relu(self.fc1(x)) + x.mean(-1, keepdim=True)))


def _case(tmp_path, hot):
    torch.manual_seed(0)
    m = _Hot(hot).eval()
    ex = {"x": torch.randn(1, 8, 16)}
    path = export_onnx(m, ex, tmp_path / f"hot{hot}.onnx", 17)
    feeds = list(random_samples(ex, 8, seed=3).batches(1))
    with torch.no_grad():
        ref = np.concatenate([m(torch.from_numpy(f["x"])).numpy() for f in feeds])
    return path, ex, feeds, ref


def _run(path, feeds):
    s = Session(path, QDQ_AS_FLOAT)
    return np.concatenate([s.run(None, f)[0] for f in feeds])


@pytest.mark.slow
def test_orin_int8_is_fp16_with_types_kept_at_the_boundary(vit17, tmp_path):
    out = tmp_path / "m.onnx"
    rep = quantize_int8(vit17.path, out, vit17.calib, target("orin", NO_FALLBACK), tmp_path)
    m = load(out)
    assert opset_version(m) >= 19 and rep.precision["high_precision"] == "fp16"
    assert [v.dtype for v in m.graph.inputs] == [ir.DataType.FLOAT] and [v.dtype for v in m.graph.outputs] == [ir.DataType.FLOAT]
    ln = [n for n in m.graph if n.op_type == "LayerNormalization"]
    assert ln and all(n.outputs[0].dtype == ir.DataType.FLOAT16 for n in ln)
    casts = [n for n in m.graph if n.op_type == "Cast"]
    assert len(casts) <= 3  # the input into FP16, the output back: minimal casts
    assert rep.precision["int8_gemm_macs_share"] == 1.0 and rep.precision["fp16_bytes"] > rep.precision["fp32_bytes"]
    c = compute_metrics(vit17.reference, _run(out, vit17.feeds)).cosine_min
    assert c >= 0.99, c
    # the float parts computed in float16 really differ from the FP32 file's (the gate sees FP16 arithmetic)
    fp32 = quantize_int8(vit17.path, tmp_path / "f.onnx", vit17.calib,
                         target("orin", NO_FALLBACK, "quantization.high_precision=fp32"), tmp_path / "f")
    assert fp32.precision["fp16_bytes"] == 0
    assert not np.array_equal(_run(out, vit17.feeds[:2]), _run(tmp_path / "f.onnx", vit17.feeds[:2]))


def test_planted_overflow_keeps_its_island_in_fp32(tmp_path):
    path, ex, feeds, ref = _case(tmp_path, hot=1e5)
    calib = random_samples(ex, 40, seed=0)
    out = tmp_path / "hot.int8.onnx"
    rep = quantize_int8(path, out, calib, target("orin", NO_FALLBACK), tmp_path)
    islands = rep.precision["fp32_islands"]
    assert islands, "the 1e5 activations must keep their producer and readers in FP32"
    assert any("LayerNorm" in why for why in islands.values())
    m = load(out)
    ln = next(n for n in m.graph if n.op_type == "LayerNormalization")
    assert ln.outputs[0].dtype == ir.DataType.FLOAT and ln.name in islands
    good = compute_metrics(ref, _run(out, feeds))
    assert np.isfinite(_run(out, feeds)).all() and good.cosine_min > 0.99
    # the same model with no range evidence (everything FP16) overflows: the island is what saves it
    fp32 = load(path)
    blind = to_opset(fp32, 19)
    Float16Islands({})(blind)
    s = Session(blind, QDQ_AS_FLOAT)
    out_blind = np.concatenate([s.run(None, f)[0] for f in feeds])
    assert not np.isfinite(out_blind).all() or compute_metrics(ref, out_blind).cosine_min < 0.9


def test_mask_fill_becomes_float16s_minimum_and_softmax_stays_fp16():
    from onnx import TensorProto, helper, numpy_helper

    fill = numpy_helper.from_array(np.asarray(np.finfo(np.float32).min, np.float32), "fill")
    nodes = [helper.make_node("Where", ["keep", "x", "fill"], ["masked"], name="where"),
             helper.make_node("Softmax", ["masked"], ["y"], name="softmax", axis=-1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("keep", TensorProto.BOOL, [2, 4]),
                                       helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [fill])
    m = ir.from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]))
    rep = Float16Islands({"x": 5.0, "masked": 3.4e38, "y": 1.0})(m).report
    assert rep.skipped == {}  # the fill's range is not the logits' range
    where = next(n for n in m.graph if n.op_type == "Where")
    assert float(where.inputs[2].const_value.numpy()) == float(np.finfo(np.float16).min)
    keep = np.array([[1, 1, 0, 0], [0, 0, 0, 0]], bool)  # the second row fully masked: uniform, never NaN
    y = Session(m).run(None, {"keep": keep, "x": np.ones((2, 4), np.float32)})[0]
    np.testing.assert_allclose(y, [[0.5, 0.5, 0, 0], [0.25] * 4], atol=1e-3)


@pytest.mark.slow
def test_precision_summary_counts_int8_macs_and_fp16_bytes(vit17, tmp_path):
    rep = quantize_int8(vit17.path, tmp_path / "m.onnx", vit17.calib,
                        target("orin", NO_FALLBACK, "quantization.quantize_attention_matmuls=false"), tmp_path)
    s = precision_summary(load(tmp_path / "m.onnx"))
    assert 0 < s["int8_gemm_macs_share"] < 1 and s["float_gemm_macs"] > 0  # attention's MatMuls stay float
    assert s == {k: v for k, v in rep.precision.items() if k in s}


def test_npu_refuses_fp16_float_parts():
    from vitexport.errors import BadInput

    with pytest.raises(BadInput, match="high_precision"):
        target("npu", "quantization.high_precision=fp16")
