"""An attention output's smoothing factors fold into the V projection (``P·(V/s) = (P·V)/s``): no Mul
is inserted (rknn-toolkit2 2.5.0 crashed in OpEmit on that Mul after SegFormer's one-head attention),
and the float function is unchanged."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from qcases import target
from qmodels import export_onnx, tiny_vit
from vitexport.graph.files import save_model
from vitexport.quantize.quantizer import prepare_model
from vitexport.quantize.smooth import SiteKind, SmoothPass, find_sites


class _SegAttention(torch.nn.Module):
    """SegFormer's efficient self-attention: separate q/k/v Linears, K and V from a shorter sequence,
    heads split by view/permute, the output permuted back into ``dense``."""

    def __init__(self, dim: int = 32, heads: int = 1):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (torch.nn.Linear(dim, dim) for _ in range(3))
        self.dense = torch.nn.Linear(dim, dim)

    def _split(self, x):
        b, n, c = x.shape
        return x.view(b, n, self.heads, c // self.heads).permute(0, 2, 1, 3)

    def forward(self, x, r):
        q, k, v = self._split(self.q(torch.nn.functional.gelu(x))), self._split(self.k(r)), self._split(self.v(r))
        p = torch.softmax(q @ k.transpose(-1, -2) * 0.3, dim=-1)
        o = (p @ v).permute(0, 2, 1, 3)
        return self.dense(o.reshape(o.shape[0], o.shape[1], -1))


class _PerHead(_SegAttention):
    """Two heads, a Linear over the head dim of ``[B, N, H, D]``: one site channel per d, each fed by
    one V column of every head (the factor of channel d divides column h·D + d for every h)."""

    def __init__(self):
        super().__init__(heads=2)
        self.mix = torch.nn.Linear(16, 16)

    def forward(self, x, r):
        q, k, v = self._split(self.q(torch.nn.functional.gelu(x))), self._split(self.k(r)), self._split(self.v(r))
        p = torch.softmax(q @ k.transpose(-1, -2) * 0.3, dim=-1)
        return self.mix((p @ v).permute(0, 2, 1, 3))


def _cases(tmp_path):
    torch.manual_seed(0)
    seg = export_onnx(_SegAttention().eval(), {"x": torch.randn(1, 64, 32), "r": torch.randn(1, 16, 32)},
                      tmp_path / "seg.onnx", 17)
    vit = export_onnx(tiny_vit(embed=32, heads=1, depth=1), {"x": torch.randn(1, 3, 32, 32)}, tmp_path / "vit.onnx", 13)
    per_head = export_onnx(_PerHead().eval(), {"x": torch.randn(1, 64, 32), "r": torch.randn(1, 16, 32)},
                           tmp_path / "per_head.onnx", 17)
    return {"segformer": seg, "timm_fused_qkv": vit, "per_head": per_head}


def _run(model, feeds, path):
    save_model(model, path)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("case", ["segformer", "timm_fused_qkv", "per_head"])
def test_attention_output_factors_fold_into_v_exactly(tmp_path, case):
    path = _cases(tmp_path)[case]
    t = target("orin")
    m = prepare_model(path, t)
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(tuple(v.shape)).astype(np.float32) for v in m.graph.inputs}
    before = _run(m, feeds, tmp_path / "before.onnx")
    muls = sum(n.op_type == "Mul" for n in m.graph)
    sites, _ = find_sites(m, t.annotate(m))
    value = [s for s in sites if s.kind is SiteKind.value]
    assert len(value) == 1, [(s.tensor, s.kind) for s in sites]
    assert not [s for s in sites if s.kind is SiteKind.insert and s.tensor == value[0].tensor]
    factors = {s.tensor: np.exp(rng.uniform(-2, 2, s.channels)).astype(np.float32) for s in sites}
    report = SmoothPass(sites, factors)(m).report
    assert report.changed == len(sites)
    assert sum(n.op_type == "Mul" for n in m.graph) == muls + sum(s.kind is SiteKind.insert for s in sites)
    assert not any(n.name == f"{value[0].tensor}_smooth_Mul" for n in m.graph)
    after = _run(m, feeds, tmp_path / "after.onnx")
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)


def test_many_heads_keep_their_sites_as_before(tmp_path):
    """With several heads the permuted output's last dim is the head dim, not what ``dense`` reads:
    no site there (unchanged), and no value fold either."""
    torch.manual_seed(0)
    path = export_onnx(_SegAttention(heads=2).eval(), {"x": torch.randn(1, 64, 32), "r": torch.randn(1, 16, 32)},
                       tmp_path / "seg2.onnx", 17)
    t = target("orin")
    m = prepare_model(path, t)
    sites, _ = find_sites(m, t.annotate(m))
    assert not [s for s in sites if s.kind is SiteKind.value]


class _ActV(_SegAttention):
    """V through a ReLU after its projection: no Linear output to fold the factors into."""

    def forward(self, x, r):
        q, k = self._split(self.q(torch.nn.functional.gelu(x))), self._split(self.k(r))
        v = self._split(torch.relu(self.v(r)))
        p = torch.softmax(q @ k.transpose(-1, -2) * 0.3, dim=-1)
        o = (p @ v).permute(0, 2, 1, 3)
        return self.dense(o.reshape(o.shape[0], o.shape[1], -1))


def test_an_unfoldable_attention_output_is_skipped_where_the_target_takes_no_mul_there(tmp_path):
    torch.manual_seed(0)
    path = export_onnx(_ActV().eval(), {"x": torch.randn(1, 64, 32), "r": torch.randn(1, 16, 32)}, tmp_path / "actv.onnx", 17)
    found = {}
    for name in ("orin", "rk3588"):
        t = target(name)
        m = prepare_model(path, t)
        found[name] = find_sites(m, t.annotate(m), max_insert_rank=t.max_insert_rank,
                                 attention_insert=t.insert_after_attention)
    att = [s for s in found["orin"][0] if s.kind is SiteKind.insert and "Transpose" in s.tensor]
    assert len(att) == 1, "on orin the attention output keeps its inserted Mul"
    rk_sites, rk_skipped = found["rk3588"]
    assert att[0].tensor not in {s.tensor for s in rk_sites}
    assert "cannot fold into the V projection" in rk_skipped[att[0].tensor]
    assert {s.tensor for s in rk_sites} == {s.tensor for s in found["orin"][0]} - {att[0].tensor}
