"""Float64 arithmetic a model traces between float32 inputs and outputs, written in float32 at export."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
import torch
import torch.nn.functional as F

from vitexport.export import export_onnx
from vitexport.export.float64 import float64_as_float32
from vitexport.graph.files import load_model
from vitexport.runners.sessions import Session
from vitexport.targets import load_recipe


class Sampler(torch.nn.Module):
    """Deformable-attention style: reference points from ``linspace`` over the traced size, offsets from a conv,
    the features sampled in float64 (as a numerically careful model might) and the result back in float32."""

    def __init__(self):
        super().__init__()
        self.feat, self.offset = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Conv2d(3, 2, 3, padding=1)

    def forward(self, x):
        h, w = x.shape[-2:]
        ys, xs = torch.meshgrid(torch.linspace(0.5, h - 0.5, h, dtype=torch.float64),
                                torch.linspace(0.5, w - 0.5, w, dtype=torch.float64), indexing="ij")
        ref = torch.stack([xs / w, ys / h], -1)[None] * 2 - 1
        grid = ref + 0.1 * torch.tanh(self.offset(x)).permute(0, 2, 3, 1).double()
        return F.grid_sample(self.feat(x).double(), grid, align_corners=False).float()


class Double(torch.nn.Module):
    def forward(self, x):
        return (x.double() * 3).sum(-1)


def _double_values(path) -> list[str]:
    graph = load_model(path).graph
    return [o.name for n in ir.traversal.RecursiveGraphIterator(graph) for o in n.outputs if o.dtype == ir.DataType.DOUBLE]


def test_a_float64_sampler_exports_in_float32_and_runs_in_onnx_runtime(tmp_path):
    torch.manual_seed(0)
    net, x = Sampler().eval(), torch.randn(1, 3, 8, 8)
    spec = load_recipe("orin").export.model_copy(update={"opset": 17})
    rep = export_onnx(net, {"x": x}, tmp_path / "raw.onnx", spec)
    assert _double_values(tmp_path / "raw.onnx") == []
    assert any("float64 arithmetic the model traced written in float32" in n for n in rep.notes), rep.notes
    with torch.no_grad():
        want = net(x).numpy()
    got = Session(tmp_path / "raw.onnx").run(None, {"x": x.numpy()})[0]  # GridSample on float64 has no CPU kernel
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_float64_output_is_the_models_own_interface_and_stays(tmp_path):
    rep = export_onnx(Double().eval(), {"x": torch.randn(2, 5)}, tmp_path / "raw.onnx", load_recipe("orin").export)
    model = load_model(tmp_path / "raw.onnx")
    assert model.graph.outputs[0].dtype == ir.DataType.DOUBLE and float64_as_float32(model) == 0
    assert not any("float64" in n for n in rep.notes)


def test_a_float32_model_is_left_as_it_is(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU()).eval()
    export_onnx(net, {"x": torch.randn(1, 4)}, tmp_path / "raw.onnx", load_recipe("orin").export)
    assert float64_as_float32(load_model(tmp_path / "raw.onnx")) == 0
