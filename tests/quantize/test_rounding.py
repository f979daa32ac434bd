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
from vitexport.quantize.calibrate import calibrate, gptq_fit_rows, weight_rounding
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
    gptq = gptq_round(fit.T.astype(np.float64) @ fit / len(fit), w, scale, 127, damp=0.1).astype(np.float32) * scale
    assert np.abs(np.round(gptq / scale) - np.round(w / scale)).max() <= 3  # the same grid, other integers
    err = {k: np.linalg.norm(held @ v - held @ w) for k, v in {"nearest": nearest, "gptq": gptq}.items()}
    assert err["gptq"] < 0.8 * err["nearest"], err


def test_gptq_zeroes_a_dead_input_channel_and_matches_its_float64_definition():
    """A channel never non-zero on the rows gets zero weights; elsewhere the float32 rounding gives the integers
    of the same algorithm in float64 (one row at a time, the error spread by the inverse Hessian's factor)
    but for a rare ±1 where float32 rounds a half the other way."""
    fit = _rows(512, 48, seed=5)
    fit[:, 7] = 0.0
    h = fit.T.astype(np.float64) @ fit / len(fit)
    w = np.random.default_rng(6).standard_normal((48, 32)).astype(np.float32) * 0.1
    scale = np.abs(w).max(0) / 127
    q = gptq_round(h, w, scale, 127, damp=0.1).astype(np.int64)
    assert not q[7].any() and np.abs(q).max() <= 127
    hd = h.copy()
    hd[7, 7] = 1.0
    hd += 0.1 * np.mean(np.diag(hd)) * np.eye(48)
    order = np.argsort(-np.diag(hd), kind="stable")
    u = _inverse_cholesky(hd[np.ix_(order, order)])
    wd = w.astype(np.float64)[order]
    wd[np.argsort(order)[7]] = 0.0
    ref = np.zeros_like(wd)
    for i in range(48):  # GPTQ without lazy batches: each row's error reaches every later row at once
        ref[i] = np.clip(np.round(wd[i] / scale), -127, 127)
        wd[i + 1:] -= np.outer(u[i, i + 1:], (wd[i] - ref[i] * scale) / u[i, i])
    expected = np.empty_like(ref)
    expected[order] = ref
    assert np.abs(q - expected).max() <= 1 and (q != expected).mean() < 0.01


def test_the_cost_counts_hessians_and_their_factorisation():
    assert gptq_cost([(384, 4096), (1536, 2048)]) == 4096 * 384**2 + 2048 * 1536**2 + 384**3 + 1536**3
    # a MiniLM-L6 (4 Linears a layer: QKV, out, fc1 at 384 wide, fc2 at 1536) fits, and so do a ViT-B's / BERT-base's
    # 768-wide Linears; their 3072-wide fc2s would not, which 4096 rows are too few for (fewer than 2.5 per input)
    minilm, base = [(384, 4096)] * 18 + [(1536, 4096)] * 6, [(768, 4096)] * 36
    assert gptq_cost(minilm) < GPTQ_BUDGET_MACS and gptq_cost(base) < GPTQ_BUDGET_MACS < gptq_cost(base + [(3072, 4096)] * 12)


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
    return weight_rounding(model, plan, tgt.recipe, 80), calibrate(model, tgt, plan, random_samples(ex, 80, seed=1), tgt.recipe)


def _widths(res) -> list[int]:
    return sorted(q.shape[0] for q, _ in res.rounded.values())


def test_auto_rounds_with_gptq_only_the_linears_with_rows_enough(tmp_path):
    (mode, why), res = _calibrated(tmp_path)
    assert mode == "gptq" and "budget 250 G" in why
    assert _widths(res) == [16]  # fc1: 512 rows for 16 inputs; fc2's 256 inputs would need 640
    (mode, _), res = _calibrated(tmp_path, "quantization.weight_rounding=gptq")
    assert mode == "gptq" and _widths(res) == [16, 256]  # asked for: every Linear


@pytest.mark.parametrize("budget", [None, 1e4])
def test_nearest_when_asked_or_over_the_budget(tmp_path, monkeypatch, budget):
    if budget is None:
        (mode, why), res = _calibrated(tmp_path, "quantization.weight_rounding=nearest")
    else:  # fc1's 512 rows × 16² + 16³ multiply-accumulates are over a budget of 10⁴
        monkeypatch.setattr("vitexport.quantize.calibrate.GPTQ_BUDGET_MACS", budget)
        (mode, why), res = _calibrated(tmp_path)
        assert "GPTQ on 1 Linear(s) costs 0.000135 G" in why
    assert mode == "nearest" and res.rounded == {}
    assert ("budget" in why) == (budget is not None)


def test_the_hessian_is_summed_on_the_rows_the_statistics_pass_sees(tmp_path):
    """GPTQ's Hessian of fc1's input sums ``gptq_rows`` of the statistics pass's rows (64 samples of 8 rows: 512);
    a Linear is rounded with GPTQ when those are at least 2.5 per input channel (40 for fc1's 16)."""
    torch.manual_seed(0)
    ex = {"x": torch.randn(1, 8, 16)}
    path = export_onnx(_Mlp().eval(), ex, tmp_path / "mlp.onnx")
    for rows, expected in [(4096, [(512, 512, [16])]), (40, [(40, 512, [16])]), (39, [])]:
        tgt = build("orin", "quantization.fallback.enabled=false", f"quantization.gptq_rows={rows}")
        model = prepare_model(path, tgt)
        fits = gptq_fit_rows(model, tgt.annotate(model), tgt.recipe, 80)
        assert list(fits.values()) == expected
        assert weight_rounding(model, tgt.annotate(model), tgt.recipe, 80)[0] == ("gptq" if expected else "nearest")
    # fewer calibration samples, fewer rows: 32 samples give fc1 256
    assert list(gptq_fit_rows(model, tgt.annotate(model), build("orin").recipe, 32).values()) == [(256, 256, [16])]


def test_the_report_says_how_many_linears_gptq_rounded(tmp_path):
    torch.manual_seed(0)
    ex = {"x": torch.randn(1, 8, 16)}
    path = export_onnx(_Mlp().eval(), ex, tmp_path / "mlp.onnx")
    rep = quantize_int8(path, tmp_path / "m.onnx", random_samples(ex, 80, seed=1),
                        build("orin", "quantization.fallback.enabled=false"), tmp_path / "w")
    note = next(n for n in rep.notes if n.startswith("weight_rounding auto: gptq"))
    assert "1 Linear(s) rounded with GPTQ, the other 1 to nearest" in note
