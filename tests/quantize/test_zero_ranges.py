"""Zero and tiny ranges: a dead weight channel, a zero-initialised head, a tensor that is 0 on every
calibration sample, a scale too small for float16. Each gets a valid scale or stays float; none
crashes, and every target's rules hold on what is written."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from qcases import target as build
from qgraph import load
from qmodels import export_onnx
from vitexport.calibration import random_samples
from vitexport.api import check
from vitexport.runners.sessions import QDQ_AS_FLOAT, Session
from vitexport.parity.metrics import compute_metrics
from vitexport.quantize import quantize_int8
from vitexport.quantize.precision import FP16_MIN_SCALE, legal_fp16_scales

NO_FALLBACK = "quantization.fallback.enabled=false"


class _Dead(nn.Module):
    """Channels that are all zero (BatchNorm γ = 0 folded into a conv), channels of 1e-9, a branch
    whose ReLU never fires (0 on every sample), and a zero-initialised head."""

    def __init__(self, zero_head: bool):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.dead = nn.Linear(8, 8)
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 5)
        with torch.no_grad():
            self.conv.weight[:3] = 0.0  # dead output channels
            self.conv.weight[3] *= 1e-9  # a channel whose float16 scale would round to 0
            self.dead.bias.fill_(-1e3)  # relu(dead(x)) is 0 everywhere
            if zero_head:
                self.head.weight.zero_()
                self.head.bias.copy_(torch.linspace(-1, 1, 5))

    def forward(self, x):
        t = self.conv(x).flatten(2).transpose(1, 2)
        return self.head(self.fc(t) + self.fc(torch.relu(self.dead(t)))).mean(1)


def _case(tmp_path, zero_head: bool, opset: int = 17):
    torch.manual_seed(0)
    m = _Dead(zero_head).eval()
    ex = {"x": torch.randn(1, 3, 8, 8)}
    path = export_onnx(m, ex, tmp_path / "dead.onnx", opset)
    feeds = list(random_samples(ex, 6, seed=5).batches(1))
    with torch.no_grad():
        ref = np.concatenate([m(torch.from_numpy(f["x"])).numpy() for f in feeds])
    return path, ex, feeds, ref


@pytest.mark.parametrize("target", ["orin", "npu", "cpu"])
@pytest.mark.parametrize("zero_head", [False, True])
def test_dead_channels_and_zero_ranges_quantize_on_every_target(tmp_path, target, zero_head):
    path, ex, feeds, ref = _case(tmp_path, zero_head, 13 if target == "npu" else 17)
    out = tmp_path / "m.int8.onnx"
    rep = quantize_int8(path, out, random_samples(ex, 40, seed=0), build(target, NO_FALLBACK), tmp_path)
    result = check(out, target)
    assert result, result.lines()
    # the dead branch's reader stays float, and the report says why
    zero = {n: why for n, why in rep.skipped_nodes.items() if "was 0 on every calibration sample" in why}
    assert len(zero) == 1, rep.skipped_nodes
    dead = 3 + 5 * zero_head if target != "npu" else int(zero_head)  # npu: per-tensor weights
    assert any(f"{dead} weight channel(s) are all zero" in n for n in rep.notes) or dead == 0, rep.notes
    got = np.concatenate([Session(out, QDQ_AS_FLOAT).run(None, f)[0] for f in feeds])
    assert np.isfinite(got).all()
    assert compute_metrics(ref, got).cosine_min > 0.99


def test_float16_scales_are_exact_normal_or_subnormal_and_never_zero(tmp_path):
    path, ex, feeds, ref = _case(tmp_path, zero_head=False)
    out = tmp_path / "m.int8.onnx"
    rep = quantize_int8(path, out, random_samples(ex, 40, seed=0), build("orin", NO_FALLBACK), tmp_path)
    assert rep.precision["high_precision"] == "fp16"
    m = load(out)
    scales = [n.inputs[1].const_value.numpy() for n in m.graph if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert all((s > 0).all() and np.isfinite(s).all() for s in scales)
    half = [s for s in scales if s.dtype == np.float16]
    assert half and min(float(s.min()) for s in half) >= FP16_MIN_SCALE
    assert any("raised to" in n for n in rep.notes), rep.notes


def test_legal_scales_requantize_the_weights_they_scale():
    """A weight DQ whose scale changes gets integers re-rounded for the new scale: the dequantized
    weight stays within one step of the scale it is stored with (two roundings of half a step)."""
    import onnx_ir as ir
    from onnx import TensorProto, helper, numpy_helper

    w = np.array([[0.0, 0.0], [1e-9, -2e-9], [0.5, -0.25]], np.float32)  # rows: dead, tiny, normal
    scale = np.maximum(np.abs(w).max(1) / 127, 1e-8).astype(np.float32)
    q = np.clip(np.round(w / scale[:, None]), -127, 127).astype(np.int8)
    inits = [numpy_helper.from_array(q, "q"), numpy_helper.from_array(scale, "s"),
             numpy_helper.from_array(np.zeros(3, np.int8), "z")]
    node = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["w"], axis=0)
    g = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 2])], inits)
    m = ir.from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]))
    assert legal_fp16_scales(m) == 2  # the dead and the tiny row
    dq = next(iter(m.graph))
    new_s, new_q = dq.inputs[1].const_value.numpy(), dq.inputs[0].const_value.numpy()
    assert np.array_equal(new_s.astype(np.float16).astype(np.float32), new_s) and (new_s >= FP16_MIN_SCALE).all()
    assert new_s[2] == np.float32(np.float16(scale[2])) or new_s[2] > scale[2]
    deq = new_q.astype(np.float32) * new_s[:, None]
    assert (np.abs(deq - w) <= new_s[:, None] + 1e-12).all()


class _Faint(nn.Module):
    """A Linear fed a tensor that peaks around 1e-9: its scale (1e-11) would be 0 in float16 and
    below the least float32 scale written (1e-8): either way the whole tensor would quantize to 0."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(8, 8), nn.Linear(8, 8, bias=False), nn.Linear(8, 4)

    def forward(self, x):
        h = self.a(x)
        return self.head(h + self.b(h * 1e-9) * 1e9)


@pytest.mark.parametrize("target,least", [("orin", "in float16"), ("cpu", "1e-08)")])
def test_a_range_below_the_least_scale_stays_float(tmp_path, target, least):
    torch.manual_seed(0)
    m = _Faint().eval()
    ex = {"x": torch.randn(1, 6, 8)}
    path = export_onnx(m, ex, tmp_path / "faint.onnx")
    # smoothing would migrate the 1e-9 into b's weights (a cure of its own): off, so the range reaches the rule
    rep = quantize_int8(path, tmp_path / "q.onnx", random_samples(ex, 40, seed=0),
                        build(target, NO_FALLBACK, "quantization.smooth=false"), tmp_path)
    faint = [why for why in rep.skipped_nodes.values() if "its scale would be below the least one written" in why]
    assert len(faint) == 1 and least in faint[0], rep.skipped_nodes
    feeds = list(random_samples(ex, 4, seed=2).batches(1))
    with torch.no_grad():
        ref = np.concatenate([m(torch.from_numpy(f["x"])).numpy() for f in feeds])
    got = np.concatenate([Session(tmp_path / "q.onnx", QDQ_AS_FLOAT).run(None, f)[0] for f in feeds])
    assert compute_metrics(ref, got).cosine_min > 0.99
