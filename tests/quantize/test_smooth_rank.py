"""A target may cap the rank of the tensors a smoothing Mul is inserted on (rk3588: RKNN 2.5.0 crashes
on a Mul over Swin's rank-6 window partition): such a site is skipped with the reason, another target
still smooths it."""
from __future__ import annotations

import torch

from qcases import target
from qmodels import export_onnx
from vitexport.quantize.quantizer import prepare_model
from vitexport.quantize.smooth import SiteKind, find_sites


class _Windows(torch.nn.Module):
    """GELU, then Swin's window partition (rank 6, a Transpose) into a Linear."""

    def __init__(self, dim: int = 32):
        super().__init__()
        self.fc = torch.nn.Linear(dim, dim)

    def forward(self, x):
        h = torch.nn.functional.gelu(x).view(1, 2, 4, 2, 4, 32).permute(0, 1, 3, 2, 4, 5)
        return self.fc(h.reshape(4, 16, 32))


def test_a_rank_6_insert_site_is_skipped_where_the_target_caps_the_rank(tmp_path):
    torch.manual_seed(0)
    path = export_onnx(_Windows().eval(), {"x": torch.randn(1, 64, 32)}, tmp_path / "windows.onnx", 13)
    found = {}
    for name in ("orin", "rk3588"):
        t = target(name)
        m = prepare_model(path, t)
        found[name] = find_sites(m, t.annotate(m), max_insert_rank=t.max_insert_rank)
    orin_sites, _ = found["orin"]
    deep = [s for s in orin_sites if s.kind is SiteKind.insert and "Transpose" in s.tensor]
    assert deep, "without a cap the window partition is an insert site"
    rk_sites, rk_skipped = found["rk3588"]
    assert deep[0].tensor not in {s.tensor for s in rk_sites}
    assert "rank-6" in rk_skipped[deep[0].tensor] and "rank <= 4" in rk_skipped[deep[0].tensor]
