"""vitexport.export.interface: the exported file takes the model's inputs, even one it ignores."""
from __future__ import annotations

import onnx
import torch
from onnx_census import census
from torch import nn

from vitexport.export import export_onnx
from vitexport.runners import OnnxRuntimeRunner
from vitexport.sources.base import OutputAdapter
from vitexport.targets import load_recipe


class _IgnoresMask(nn.Module):
    """A classifier that takes an attention mask and never reads it (the case of a user's model
    whose forward accepts the argument for API compatibility)."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Conv2d(3, 8, 4, 4), nn.Linear(8, 5)

    def forward(self, image, mask):
        return self.head(self.embed(image).flatten(2).mean(2))


def test_an_input_the_model_ignores_stays_in_the_graph(tmp_path):
    torch.manual_seed(0)
    module = OutputAdapter(_IgnoresMask(), ["image", "mask"]).eval()
    example = {"image": torch.randn(2, 3, 16, 16), "mask": torch.ones(2, 16, dtype=torch.int64)}
    out = tmp_path / "model.raw.onnx"
    rep = export_onnx(module, example, out, load_recipe("cpu").export)
    assert rep.exporter == "torchscript"  # the exporter that drops an unused input
    g = onnx.load(str(out)).graph
    assert [(i.name, i.type.tensor_type.elem_type) for i in g.input] == [("image", onnx.TensorProto.FLOAT),
                                                                         ("mask", onnx.TensorProto.INT64)]
    assert [d.dim_value for d in g.input[1].type.tensor_type.shape.dim] == [2, 16]
    assert any("input 'mask' is never read by the model" in n for n in rep.notes)
    assert census(out)["unused_inputs"] == ["mask"]
    with OnnxRuntimeRunner(out) as runner:  # fed what the torch model is fed
        got = runner.infer({k: v.numpy() for k, v in example.items()})
    expected = module(**example).detach().numpy()
    assert abs(next(iter(got.values())) - expected).max() < 1e-5

