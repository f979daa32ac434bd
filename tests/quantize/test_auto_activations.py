"""``quantization.asymmetric_activations: auto``: uint8 with a zero point on a network with conv stages, int8 with
zero point 0 on a transformer (rk3588's default, measured on RKNN's simulator: bench/results-npu.md, docs/bench.md)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from qcases import target
from qgraph import load
from qmodels import export_onnx, tiny_vit
from vitexport.calibration.data import NpzSamples
from vitexport.graph.query import const_array
from vitexport.quantize import quantize_int8


class _ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.SiLU(), nn.Conv2d(16, 16, 1), nn.SiLU())
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean((2, 3)))


def _zero_point_types(path) -> set[str]:
    return {str(const_array(n.inputs[2]).dtype) for n in load(path).graph
            if n.op_type == "QuantizeLinear" and len(n.inputs) > 2 and n.inputs[2] is not None}


@pytest.mark.parametrize("net", ["conv", "vit"])
def test_auto_picks_uint8_on_conv_stages_and_int8_on_a_transformer(tmp_path, net):
    torch.manual_seed(0)
    module = _ConvNet() if net == "conv" else tiny_vit(img=32, patch=8, depth=1, embed=64, heads=2)
    path = export_onnx(module, {"x": torch.randn(1, 3, 32, 32)}, tmp_path / "m.onnx", opset=13)
    calib = NpzSamples({"x": np.random.default_rng(0).standard_normal((48, 3, 32, 32)).astype(np.float32)})
    out = tmp_path / "q.onnx"
    # rk3588's recipe sets auto: no override here, so the recipe's own choice is tested too
    rep = quantize_int8(path, out, calib, target("rk3588", "quantization.fallback.enabled=false"), tmp_path / "w")
    want = "uint8" if net == "conv" else "int8"
    assert _zero_point_types(out) == {want}
    note = next(n for n in rep.notes if n.startswith("activations:"))
    assert ("uint8" in note) == (net == "conv") and "asymmetric_activations=auto" in note
