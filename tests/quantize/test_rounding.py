"""Weight rounding (vitexport/quantize/rounding.py, issue 30): GPTQ chooses integer weights by the Linear's
output error on its rows, and ``weight_rounding: auto`` takes it where its arithmetic fits the budget and a
Linear has rows enough to fit it, rounding to nearest elsewhere."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from qcases import target as build
from qmodels import export_onnx
from vitexport.calibration import random_samples
from vitexport.quantize import quantize_int8
from vitexport.quantize.calibrate import calibrate, weight_rounding
from vitexport.quantize.quantizer import prepare_model
from vitexport.quantize.rounding import GPTQ_BUDGET_MACS, _inverse_cholesky, gptq_cost, gptq_round


def _rows(n: int, c: int, seed: int = 0) -> np.ndarray:
    """Correlated rows with a few loud channels, as a Linear's input is."""
    mix = np.random.default_rng(0).standard_normal((c, c)) / np.sqrt(c)  # one covariance for every draw
    return (np.random.default_rng(seed).standard_normal((n, c)) @ mix * np.linspace(0.2, 3.0, c)).astype(np.float32)


def test_the_inverse_factor_is_the_cholesky_factor_of_the_inverse():
    x = _rows(512, 96).astype(np.float64)
    h = x.T @ x / len(x) + 0.05 * np.eye(96)
    u = _inverse_cholesky(h)
    np.testing.assert_allclose(u.T @ u, np.linalg.inv(h), atol=1e-10)
    np.testing.assert_allclose(u, np.linalg.cholesky(np.linalg.inv(h)).T, atol=1e-10)


def test_gptq_cuts_the_output_error_on_rows_like_its_own():
    w = np.random.default_rng(1).standard_normal((64, 48)).astype(np.float32) * 0.05
    scale = np.abs(w).max(0) / 127
    fit, held = _rows(1024, 64, seed=2), _rows(1024, 64, seed=3)
    nearest = np.clip(np.round(w / scale), -127, 127) * scale
    gptq = gptq_round(fit, w, scale, 127, damp=0.1).astype(np.float32) * scale
    assert np.abs(np.round(gptq / scale) - np.round(w / scale)).max() <= 3  # the same grid, other integers
    err = {k: np.linalg.norm(held @ v - held @ w) for k, v in {"nearest": nearest, "gptq": gptq}.items()}
    assert err["gptq"] < 0.8 * err["nearest"], err


def test_the_cost_counts_hessians_and_their_factorisation():
    assert gptq_cost([384, 1536], 4096) == 4096 * (384**2 + 1536**2) + 384**3 + 1536**3
    # a MiniLM-L6 (4 Linears a layer: QKV, out, fc1 at 384 wide, fc2 at 1536) fits; a ViT-B / BERT-base does not
    assert gptq_cost([384, 384, 384, 1536] * 6, 4096) < GPTQ_BUDGET_MACS < gptq_cost([768, 768, 768, 3072] * 12, 4096)


class _Mlp(nn.Module):
    """A narrow Linear (16 inputs: many rows each) and a wide one (256 inputs: few rows each)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 256), nn.Linear(256, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))).mean(1)


def _calibrated(tmp_path, *sets: str):
    torch.manual_seed(0)
    ex = {"x": torch.randn(1, 8, 16)}  # 8 rows a sample: 64 smoothing samples give 512 rows
    path = export_onnx(_Mlp().eval(), ex, tmp_path / "mlp.onnx")
    tgt = build("orin", "quantization.fallback.enabled=false", *sets)
    model = prepare_model(path, tgt)
    plan = tgt.annotate(model)
    return weight_rounding(model, plan, tgt.recipe), calibrate(model, tgt, plan, random_samples(ex, 80, seed=1), tgt.recipe)


def _widths(res) -> list[int]:
    return sorted(q.shape[0] for q, _ in res.rounded.values())


def test_auto_rounds_with_gptq_only_the_linears_with_rows_enough(tmp_path):
    (mode, why), res = _calibrated(tmp_path)
    assert mode == "gptq" and "budget 250 G" in why
    assert _widths(res) == [16]  # fc1: 512 rows for 16 inputs; fc2's 256 inputs would need 640
    (mode, _), res = _calibrated(tmp_path, "quantization.weight_rounding=gptq")
    assert mode == "gptq" and _widths(res) == [16, 256]  # asked for: every Linear


@pytest.mark.parametrize("sets", [("quantization.weight_rounding=nearest",), ("quantization.gptq_rows=10000000000",)])
def test_nearest_when_asked_or_over_the_budget(tmp_path, sets):
    (mode, why), res = _calibrated(tmp_path, *sets)
    assert mode == "nearest" and res.rounded == {}
    assert ("budget" in why) == ("gptq_rows" in sets[0])


def test_the_report_says_how_many_linears_gptq_rounded(tmp_path):
    torch.manual_seed(0)
    ex = {"x": torch.randn(1, 8, 16)}
    path = export_onnx(_Mlp().eval(), ex, tmp_path / "mlp.onnx")
    rep = quantize_int8(path, tmp_path / "m.onnx", random_samples(ex, 80, seed=1),
                        build("orin", "quantization.fallback.enabled=false"), tmp_path / "w")
    note = next(n for n in rep.notes if n.startswith("weight_rounding auto: gptq"))
    assert "1 Linear(s) rounded with GPTQ, the others to nearest" in note
