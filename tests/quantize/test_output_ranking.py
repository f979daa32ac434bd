"""The fallback's order by what the model's outputs see (issue 28: on trained MobileViT-XXS and EfficientViT-B0 the
layer whose INT8 error costs the logits most adds only an ordinary error to its own output)."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
import torch
from torch import nn

from qcases import target
from qmodels import export_onnx, tiny_vit
from vitexport.calibration.data import NpzSamples
from vitexport.quantize import quantize_int8
from vitexport.quantize.fallback import OUTPUT_RANK_MACS, output_ranked
from vitexport.quantize.spec import ActSpec, Encoding, NodeKind, NodeSpec, QuantPlan


class _TwoPaths(nn.Module):
    """``loud``: a 1x1 conv whose output makes most of the model's; ``edge``: a 3x3 high-pass conv whose small output
    carries a large share of its input's INT8 noise, and reaches the output 40 times quieter."""

    def __init__(self):
        super().__init__()
        self.loud = nn.Conv2d(8, 8, 1)
        self.edge = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        with torch.no_grad():
            k = torch.full((3, 3), -1.0 / 8)
            k[1, 1] = 1.0
            self.edge.weight.copy_(k.expand(8, 8, 3, 3) / 8 + 1e-3 * torch.randn(8, 8, 3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.loud(x) + self.edge(x) / 40


def _smooth(n: int, seed: int) -> NpzSamples:
    """Smooth images (a high-pass filter leaves little of them) with an offset per channel."""
    g = np.random.default_rng(seed)
    base = g.standard_normal((n, 8, 1, 1)) * 2 + np.linspace(0, 1, 12)[None, None, :, None] * g.standard_normal((n, 8, 1, 1))
    return NpzSamples({"x": (base + 0.02 * g.standard_normal((n, 8, 12, 12))).astype(np.float32)})


@pytest.mark.parametrize("ranking", ["node", "output"])
def test_the_fallback_takes_the_layer_the_outputs_feel_first_when_ranked_by_them(tmp_path, ranking):
    torch.manual_seed(0)
    path = export_onnx(_TwoPaths(), {"x": torch.randn(1, 8, 12, 12)}, tmp_path / "m.onnx")
    # a gate INT8 cannot meet, one float layer at most: the search keeps the first-ranked layer if it helps
    r = target("orin", "quantization.smooth=false", f"quantization.fallback.ranking={ranking}",
               "quantization.fallback.max_float_layers=1", "parity.quantize_int8.cosine_min=0.9999999",
               "parity.quantize_int8.int8_share_min=0")
    rep = quantize_int8(path, tmp_path / "q.onnx", _smooth(160, 0), r, tmp_path / "w")
    kept = [f["node"] for f in rep.float_fallback]
    loud = next(n.name for n in ir.load(str(path)).graph if n.op_type == "Conv" and list(n.attributes["kernel_shape"].as_ints()) == [1, 1])
    order = [n for n in rep.notes if n.startswith("fallback order")]
    if ranking == "output":
        assert kept == [loud]
        assert order and loud in order[0] and "(#2 by its own output)" in order[0]
    else:
        assert loud not in kept and not order


def _plan(*names: str, macs: int = 0) -> QuantPlan:
    return QuantPlan("orin", tuple(NodeSpec(n, "Conv", NodeKind.conv, (ActSpec("x", 0),), macs=macs) for n in names),
                     Encoding())


def test_auto_ranks_by_the_outputs_on_conv_stages_and_by_each_node_on_a_vit(tmp_path):
    torch.manual_seed(0)
    vit = ir.load(str(export_onnx(tiny_vit(img=32, patch=8, depth=1, embed=64, heads=2), {"x": torch.randn(1, 3, 32, 32)},
                                  tmp_path / "vit.onnx")))
    patch = [n.name for n in vit.graph if n.op_type == "Conv"]
    assert len(patch) == 1
    assert not output_ranked("auto", _plan(*patch), vit)
    assert output_ranked("output", _plan(*patch), vit)
    net = ir.load(str(export_onnx(_TwoPaths(), {"x": torch.randn(1, 8, 12, 12)}, tmp_path / "net.onnx")))
    convs = [n.name for n in net.graph if n.op_type == "Conv"]
    assert output_ranked("auto", _plan(*convs), net)
    assert not output_ranked("node", _plan(*convs), net)
    # past the bound, auto keeps the per-node order (a ViT-B-sized hybrid); an explicit output does not
    big = OUTPUT_RANK_MACS // (2 * 4) + 1
    assert output_ranked("auto", _plan(*convs, macs=big // 2), net, samples=4)
    assert not output_ranked("auto", _plan(*convs, macs=big), net, samples=4)
    assert output_ranked("output", _plan(*convs, macs=big), net, samples=4)
