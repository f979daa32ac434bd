"""One node whose INT8 error dominates the model's goes float whatever the budget, at a small MAC share
(issue 19: the text encoder's layer-0 QKV, fed sink tokens, made 16× the rest's predicted worst error)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from qcases import target
from qgraph import dq_fed, load
from vitexport.calibration.data import NpzSamples
from vitexport.quantize import quantize_int8
from vitexport.quantize.quantizer import DOMINANT_MACS


class _Tokens(nn.Module):
    """A small Linear on the raw tokens (``stem``), then a LayerNorm and a wide MLP with a residual."""

    def __init__(self, dim: int = 64, wide: int = 512):
        super().__init__()
        self.stem = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, wide), nn.Linear(wide, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.stem(x))
        return h + self.fc2(torch.relu(self.fc1(h)))


def _samples(n: int, sink: float, seed: int) -> NpzSamples:
    """Normal tokens; token 0 of every sample ``sink`` times larger in every channel (a per-token outlier no
    per-channel smoothing can move: the stem's per-tensor INT8 range is set by it)."""
    x = np.random.default_rng(seed).standard_normal((n, 16, 64)).astype(np.float32)
    x[:, 0] *= sink
    return NpzSamples({"x": x})


@pytest.mark.parametrize("sink", [1.0, 200.0])
def test_the_node_that_makes_the_error_goes_float_alone(tmp_path, sink):
    from qmodels import export_onnx

    torch.manual_seed(0)
    path = export_onnx(_Tokens(), {"x": torch.randn(1, 16, 64)}, tmp_path / "m.onnx")
    out = tmp_path / "q.onnx"
    rep = quantize_int8(path, out, _samples(160, sink, 0), target("orin"), tmp_path / "w")
    dominant = [f for f in rep.float_fallback if f.get("why") == "dominant"]
    stem = next(n for n in load(out).graph if n.op_type in ("MatMul", "Gemm"))  # the first in graph order
    if sink == 1.0:  # nothing dominates: every node stays INT8
        assert dominant == [] and rep.float_fallback == []
        assert not any(n.startswith("one node dominates") for n in rep.notes)
        assert dq_fed(stem)
    else:
        assert [f["node"] for f in dominant] == [stem.name]
        assert 0 < dominant[0]["macs_share"] <= DOMINANT_MACS
        assert not dq_fed(stem), "the dominant node must run in float"
        note = next(n for n in rep.notes if n.startswith("one node dominates"))
        before, after = (float(v) for v in note.rsplit(" ", 3)[1::2])
        assert (1 - after) * 4 <= 1 - before
        assert rep.budget_met
