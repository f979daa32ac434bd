"""Align-corners upsampling by 2 written as an asymmetric Resize and an exact per-axis correction."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vitexport.export import export_onnx, simplify_onnx
from vitexport.export.resize import align_corners_as_asymmetric
from vitexport.graph.files import load_model
from vitexport.graph.query import attr
from vitexport.runners.sessions import Session
from vitexport.targets import build_target, load_recipe


class Up(torch.nn.Module):
    """A conv, then ``F.interpolate`` as asked, then a conv (the upsampling sits between two layers as in DPT)."""

    def __init__(self, **interpolate):
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.Conv2d(6, 4, 1)
        self.interpolate = interpolate

    def forward(self, x):
        return self.b(F.interpolate(torch.relu(self.a(x)), **self.interpolate))


def _export(tmp_path, net: torch.nn.Module, hw: tuple[int, int], target: str = "rk3588", sets=()):
    recipe = load_recipe(target, list(sets))
    x = torch.randn(1, 3, *hw)
    export_onnx(net, {"x": x}, tmp_path / "raw.onnx", recipe.export, contract=recipe.contract)
    rep = simplify_onnx(tmp_path / "raw.onnx", tmp_path / "fp32.onnx", build_target(recipe))
    return rep, x


def _resizes(path) -> list[str]:
    return [attr(n, "coordinate_transformation_mode") for n in load_model(path).graph if n.op_type == "Resize"]


CASES = {
    "scale 2, square": (dict(scale_factor=2, mode="bilinear", align_corners=True), (5, 5)),
    "scale 2, 1x1 input": (dict(scale_factor=2, mode="bilinear", align_corners=True), (1, 1)),
    "size, not square": (dict(size=(8, 14), mode="bilinear", align_corners=True), (4, 7)),
    "height only": (dict(scale_factor=(2, 1), mode="bilinear", align_corners=True), (6, 3)),
    "width only": (dict(scale_factor=(1, 2), mode="bilinear", align_corners=True), (3, 6)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_rewrite_is_exact_and_leaves_no_align_corners_resize(tmp_path, case):
    kwargs, hw = CASES[case]
    torch.manual_seed(0)
    net = Up(**kwargs).eval()
    rep, x = _export(tmp_path, net, hw)
    assert _resizes(tmp_path / "raw.onnx") == ["align_corners"]
    assert _resizes(tmp_path / "fp32.onnx") == ["asymmetric"]
    assert any("1 align-corners Resize(s) by 2 written as an asymmetric Resize" in n for n in rep.notes), rep.notes
    with torch.no_grad():
        want = net(x).numpy()
    got = Session(tmp_path / "fp32.onnx").run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("kwargs", [dict(scale_factor=3, mode="bilinear", align_corners=True),
                                    dict(scale_factor=2, mode="bilinear", align_corners=False),
                                    dict(scale_factor=2, mode="nearest")], ids=["factor 3", "half pixel", "nearest"])
def test_other_resizes_are_left_as_they_are(tmp_path, kwargs):
    _export(tmp_path, Up(**kwargs).eval(), (4, 4))
    assert _resizes(tmp_path / "fp32.onnx") == _resizes(tmp_path / "raw.onnx")


def test_only_a_recipe_that_asks_rewrites(tmp_path):
    net = Up(scale_factor=2, mode="bilinear", align_corners=True).eval()
    rep, _ = _export(tmp_path, net, (4, 4), target="orin")
    assert _resizes(tmp_path / "fp32.onnx") == ["align_corners"]
    assert not any("align-corners" in n for n in rep.notes)
    rep, _ = _export(tmp_path, net, (4, 4), sets=["export.align_corners_resize=keep"])
    assert _resizes(tmp_path / "fp32.onnx") == ["align_corners"]


def test_a_dynamic_or_unknown_shape_is_not_rewritten(tmp_path):
    net = Up(scale_factor=2, mode="bilinear", align_corners=True).eval()
    recipe = load_recipe("orin")
    export_onnx(net, {"x": torch.randn(1, 3, 4, 4)}, tmp_path / "raw.onnx", recipe.export, contract=recipe.contract)
    model = load_model(tmp_path / "raw.onnx")
    resize = next(n for n in model.graph if n.op_type == "Resize")
    resize.inputs[0].shape = None
    assert align_corners_as_asymmetric(model) == 0
