"""reparameterize: training branches fold into one conv at parity; nothing to fold changes nothing;
what is not a fold method is never called; the export's report has the stage's own parity line."""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
import timm
import torch
from torch import nn

from rep_models import RepBlock, build
from vitexport import api
from vitexport.passes import reparameterize
from vitexport.recipe import StageToggle

HERE = Path(__file__).parent


def _rel_err(a: nn.Module, b: nn.Module, x: torch.Tensor) -> float:
    with torch.no_grad():
        ra, rb = a(x), b(x)
    return float((ra - rb).abs().max() / ra.abs().max())


def test_a_repvgg_block_folds_into_one_conv_at_parity():
    model = build()
    folded, report = reparameterize(model, {})
    assert (report.found, report.changed) == (2, 2)
    assert [c.site for c in report.changes] == ["1", "2"]
    assert all(isinstance(b.reparam, nn.Conv2d) for b in (folded[1], folded[2]))
    assert not any(isinstance(m, nn.BatchNorm2d) for m in folded.modules())
    # 3 BN (2*8 each) + the 1x1 conv (64) per block go; one bias (8) per block comes
    s = report.stats
    assert (s["params_before"] - s["params_after"], s["batchnorms_before"], s["batchnorms_after"]) == (2 * (48 + 64 - 8), 6, 0)
    assert "RepBlock.reparameterize() x2" in report.notes[0] and "BatchNorm 6 -> 0" in report.notes[0]
    x = torch.randn(4, 3, 32, 32)
    assert _rel_err(model, folded, x) < 1e-5
    assert isinstance(model[1].bn3, nn.BatchNorm2d)  # the caller's model is untouched (a copy was folded)


@pytest.mark.parametrize("name", ["mobileone_s0", "fastvit_t8", "repvit_m0_9"])
def test_timm_reparameterizable_families_fold_at_parity(name):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10).eval()
    folded, report = reparameterize(model, {})
    assert report.changed == report.found > 0 and not report.skipped
    assert report.stats["params_after"] < report.stats["params_before"]
    assert report.stats["modules_after"] < report.stats["modules_before"]
    assert _rel_err(model, folded, torch.randn(2, 3, 64, 64)) < 1e-5


def test_nothing_to_fold_changes_nothing():
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10).eval()
    folded, report = reparameterize(model, {})
    assert (report.found, report.changed, report.notes) == (0, 0, ["nothing to fold"])
    assert report.summary() == "reparameterize: no sites found (nothing to fold)"
    assert report.stats["params_before"] == report.stats["params_after"]
    before, after = model.state_dict(), folded.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert _rel_err(model, folded, torch.randn(2, 3, 32, 32)) == 0.0


class _Named(nn.Module):
    """A submodule called ``fuse`` and a ``reparameterize(x)`` helper: neither is a fold."""

    def __init__(self) -> None:
        super().__init__()
        self.fuse = nn.Conv2d(3, 3, 1)

    def reparameterize(self, x):  # a helper with an argument, as in a VAE
        return x

    def forward(self, x):
        return self.fuse(x)


def test_attributes_named_like_fold_methods_are_not_called():
    model = nn.Sequential(_Named(), RepBlock(3, 5)).eval()
    folded, report = reparameterize(model, {})
    assert report.changed == 1 and [c.site for c in report.changes] == ["1"]
    assert [s.site for s in report.skipped] == ["0"] and "needs arguments" in report.skipped[0].reason
    assert isinstance(folded[0].fuse, nn.Conv2d)  # a submodule named fuse is a submodule, not a call


def test_the_recipe_switch_turns_it_off():
    model = build()
    same, report = reparameterize(model, {}, StageToggle(enabled=False))
    assert same is model and report.changed == 0 and report.notes == ["disabled by the recipe"]


def test_the_export_report_has_the_stages_parity_line(tmp_path):
    lines: list[str] = []
    arts = api.export(f"python:{HERE / 'rep_models.py'}:build", "cpu", input_shape="1,3,32,32", out=tmp_path / "out",
                      log=lines.append, overrides=["calibration.num_samples=8", "parity_data.synthetic_samples=8",
                                                   "stages.quantize_int8.enabled=false"])
    assert arts.passed
    doc = json.loads((arts.out_dir / "parity.json").read_text())
    stages = [s["stage"] for s in doc["stages"]]
    assert stages[:2] == ["reparameterize", "freeze_layernorm"]  # the first torch pass: see PASS_STAGES
    rep = doc["stages"][0]
    assert rep["passed"] and rep["changed"] == 2 and rep["engine"] == "torch"
    assert rep["metrics"]["cosine_min"] > 0.99999 and rep["tolerance"]["max_abs"] == 1e-4
    assert any(ln.startswith("[pass] reparameterize") and "changed=2" in ln for ln in lines)
    assert "RepBlock.reparameterize() x2" in (arts.out_dir / "parity.md").read_text()
    # the export saw the folded graph: 3 convs (stem + one per block), no BatchNorm, no Add
    ops = [n.op_type for n in onnx.load(arts.out_dir / "model.fp32.onnx").graph.node]
    assert ops.count("Conv") == 3 and "BatchNormalization" not in ops and "Add" not in ops
