"""Smoothing a post-LN block: a LayerNorm output read by the next Linears *and* the residual Add.

The factors cannot fold into such a LayerNorm (the residual would change), so a Mul is inserted on
the Linears' branch only; the residual Add keeps reading the LayerNorm's own output."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from qcases import Case, target
from qgraph import load
from qmodels import export_onnx
from vitexport.runners.sessions import QDQ_AS_FLOAT, Session
from vitexport.parity.metrics import compute_metrics
from vitexport.quantize import quantize_int8
from vitexport.quantize.quantizer import prepare_model
from vitexport.quantize.smooth import SiteKind, SmoothPass, compute_factors, find_sites

NO_FALLBACK = "quantization.fallback.enabled=false"


class _PostLN(torch.nn.Module):
    """One post-LN block and a head: ``h = LN1(x)`` feeds both the FFN and the residual Add (the
    residual scaled down so that the FFN's output, and its INT8 error, is what the head sees)."""

    def __init__(self, dim: int = 64):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.fc1, self.fc2 = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)
        self.head = torch.nn.Linear(dim, 10)

    def forward(self, x):
        h = self.ln1(x)
        return self.head(self.ln2(h + self.fc2(torch.nn.functional.gelu(self.fc1(h))) * 50.0))


@pytest.fixture(scope="module")
def post_ln(tmp_path_factory):
    torch.manual_seed(0)
    module = _PostLN().eval()
    with torch.no_grad():  # massive LayerNorm channels, as trained encoders grow them, compensated in fc1
        module.ln1.weight[[5, 40, 77 % 64]] *= 60.0
        module.fc1.weight[:, [5, 40, 77 % 64]] /= 60.0
    ex = {"x": torch.randn(1, 16, 64)}
    path = export_onnx(module, ex, tmp_path_factory.mktemp("postln") / "post_ln.onnx", 17)
    from vitexport.calibration import random_samples

    return Case(path, module, random_samples(ex, 64, seed=0), random_samples(ex, 16, seed=1))


def test_inserted_mul_feeds_only_the_linears(post_ln):
    orin = target("orin")
    m = prepare_model(post_ln.path, orin)
    sites, _ = find_sites(m, orin.annotate(m))
    shared = [s for s in sites if s.kind is SiteKind.insert and "ln1" in s.tensor]
    assert shared, "post-LN outputs feeding qkv / the FFN must be insert sites"
    values = {v.name: v for n in m.graph for v in n.outputs}
    readers = {s.tensor: {u.node.op_type for u in values[s.tensor].uses()} for s in shared}
    assert any("Add" in ops for ops in readers.values())  # the residual reads it too
    rng = np.random.default_rng(0)
    factors = {s.tensor: compute_factors(m, s, rng.uniform(0.5, 50, s.channels), 0.5) for s in sites}
    ref = np.concatenate([Session(post_ln.path).run(None, f)[0] for f in post_ln.feeds[:4]])
    SmoothPass(sites, factors)(m)
    for s in shared:
        ops = {u.node.op_type for u in values[s.tensor].uses()}
        assert "Mul" in ops and ops & {"Add"} == readers[s.tensor] & {"Add"}  # the Add still reads the LN itself
    out = np.concatenate([Session(m).run(None, f)[0] for f in post_ln.feeds[:4]])
    assert np.abs(out - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


def test_branch_smoothing_rescues_the_block(post_ln, tmp_path):
    def cosine(*overrides):
        out = tmp_path / f"{len(overrides)}.onnx"
        quantize_int8(post_ln.path, out, post_ln.calib, target("orin", NO_FALLBACK, *overrides), tmp_path / out.stem)
        s = Session(out, QDQ_AS_FLOAT)
        return compute_metrics(post_ln.reference, np.concatenate([s.run(None, f)[0] for f in post_ln.feeds])).cosine_min

    smoothed, plain = cosine(), cosine("quantization.smooth=false")
    assert smoothed >= 0.99 and smoothed > plain + 0.01, (smoothed, plain)
