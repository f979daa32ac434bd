"""The fallback's worst case is a prediction of the gate's, not the selection samples' minimum
(:mod:`vitexport.quantize.tail`, :mod:`vitexport.quantize.judge`)."""
from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest
import torch

from qcases import target
from qmodels import export_onnx
from vitexport.calibration import NpzSamples
from vitexport.calibration.feeds import FeedSet
from vitexport.runners.sessions import LOW_MEMORY, QDQ_AS_FLOAT, Session
from vitexport.parity.metrics import compare
from vitexport.quantize import GateInfo, quantize_int8
from vitexport.quantize.tail import flip_rate, margin_shift, predict, sample_errors

DIM, HIDDEN, OUT = 32, 64, 16


class _Switch(torch.nn.Module):
    """An MLP whose hidden unit 0 fires only for rare inputs and then cancels the large output bias:
    common samples' outputs are the bias (INT8 noise is nothing beside it), rare samples' outputs are
    what is left after the cancellation (the same noise is large beside it)."""

    def __init__(self, rare: torch.Tensor):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.fc1, self.fc2 = torch.nn.Linear(DIM, HIDDEN), torch.nn.Linear(HIDDEN, OUT)
        with torch.no_grad():
            self.fc1.weight.normal_(0, 0.3, generator=g)
            self.fc1.bias.zero_()
            unit = rare / rare.norm()
            self.fc1.weight -= torch.outer(self.fc1.weight @ unit, unit)  # the other units do not see rare inputs
            self.fc1.weight[0] = unit * 5.5  # 5.5·|x| = 110 on a rare input of norm 20
            self.fc1.bias[0] = -100.0
            big = torch.randn(OUT, generator=g)
            big = 50.0 * big / big.norm()
            self.fc2.weight.normal_(0, 0.3, generator=g)
            self.fc2.weight[:, 0] = -big / 10.0  # h0 = 10 on a rare input: cancels the bias exactly
            self.fc2.bias.copy_(big)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _data(n: int, rare_at: list[int], direction: torch.Tensor, seed: int) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    x[rare_at] = (20.0 * direction / direction.norm()).numpy() + 0.05 * x[rare_at]
    return {"x": x}


@pytest.fixture(scope="module")
def switch(tmp_path_factory):
    direction = torch.randn(DIM, generator=torch.Generator().manual_seed(3))
    path = export_onnx(_Switch(direction), {"x": torch.zeros(1, DIM)}, tmp_path_factory.mktemp("tail") / "switch.onnx")
    # 128 calibration samples: rare ones only among the first 64 (calibrated and screened), none among
    # the last 32 (the held-out selection): invisible there. The gate's 200 samples: 4 % rare.
    calib = _data(128, [5, 17, 30, 41, 58], direction, seed=1)
    parity = _data(200, list(range(3, 200, 25)), direction, seed=2)
    return path, NpzSamples(calib), NpzSamples(parity)


def _gate(path, int8, parity, r):
    feeds = FeedSet(parity, 1)
    ref = np.concatenate([Session(path, LOW_MEMORY).run(None, f)[0] for f in feeds])
    out = np.concatenate([Session(int8, QDQ_AS_FLOAT).run(None, f)[0] for f in feeds])
    return compare(ref, out, r.recipe.tolerance("quantize_int8"))


# the INT8-share gate off: one of this two-Linear model's nodes in float is half its MACs (the room that gate
# leaves the fallback is tested in test_fallback_uncapped)
TIGHT = ("parity.quantize_int8.cosine_min=0.995", "parity.quantize_int8.top1_agreement=null",
         "quantization.fallback.max_float_layers=2", "quantization.high_precision=fp32",
         "parity.quantize_int8.int8_share_min=0")


def test_a_tail_invisible_in_the_selection_samples_still_meets_the_gate(switch, tmp_path):
    path, calib, parity = switch
    r = target("orin", *TIGHT)
    rep = quantize_int8(path, tmp_path / "m.onnx", calib, r, tmp_path, GateInfo(len(parity)))
    before = rep.parity_before_fallback
    assert before["selection"]["passed"], "the held-out samples alone see no problem: the tail is invisible there"
    assert not before["passed"] and before["prediction"]["cosine_min"] < 0.995, "the screen shows the tail"
    assert rep.float_fallback and rep.budget_met
    gate = _gate(path, tmp_path / "m.onnx", parity, r)
    assert gate, f"the gate fails: cosine_min {gate.metrics.cosine_min}"
    # the prediction was a lower bound (with both layers in float, what is left is float rounding: 1e-12, not predicted)
    assert rep.parity["prediction"]["cosine_min"] <= gate.metrics.cosine_min + 1e-9


def test_without_the_screen_the_selection_minimum_would_have_passed_a_failing_gate(switch, tmp_path):
    path, calib, parity = switch
    r = target("orin", *TIGHT, "quantization.fallback.screen_samples=0")
    rep = quantize_int8(path, tmp_path / "m.onnx", calib, r, tmp_path, GateInfo(len(parity)))
    assert rep.budget_met and not rep.float_fallback  # 32 common samples: nothing to see
    assert not _gate(path, tmp_path / "m.onnx", parity, r), "the planted tail must fail the gate when nobody looks"


def test_the_predicted_worst_case_extrapolates_to_the_gates_sample_count():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((32, 10)).astype(np.float32)
    noise = (0.05 * np.exp(0.5 * rng.standard_normal((32, 1))) * rng.standard_normal((32, 10))).astype(np.float32)
    out = ref + noise
    e, _ = sample_errors(ref, out)
    few, many = predict((ref, out), None, 32), predict((ref, out), None, 2000)
    assert many.cosine_min < few.cosine_min <= 1.0 - e.max()  # more samples scored: a worse worst case
    assert few.pooled == 32 and many.gate_samples == 2000
    # calibrated-on samples that fare better than held-out ones are scaled up to the held-out level
    both = predict((ref, out), (ref, ref + 0.1 * noise), 200)
    assert both.held_out_ratio > 10 and both.pooled == 64


def test_the_screen_is_capped_by_compute():
    from vitexport.quantize.quantizer import screen_size

    assert screen_size(64, int(1.1e9)) == 64  # a ViT-S at 128 px: the whole screen
    assert screen_size(64, int(17.5e9)) == 16  # ViT-B/16 at 224: the floor, its quantize stage must stay quick
    assert screen_size(0, int(1e9)) == 0


def test_a_loss_that_no_label_can_count_is_not_predicted():
    """The fallback checks the expected flips against ``accuracy_drop`` only as far as accuracy can
    drop: labels that do not index the output (the bench's text encoder: topic labels 0–7 beside a
    192-wide embedding, 0 % accuracy) made it keep 47 % of the MACs float for flips no label counts."""
    rng = np.random.default_rng(0)
    out = rng.standard_normal((50, 192)).astype(np.float32)
    out[:, 8] += 10.0  # top-1 is channel 8 on every sample
    topics = rng.integers(0, 8, 50)
    embedding = GateInfo.from_reference(out, topics)
    assert embedding == GateInfo(50, True, 0.0) and embedding.accuracy_drop(0.01) == 0.0
    labels = np.where(np.arange(50) < 40, 8, topics)  # the untouched model right on 40 of 50
    classifier = GateInfo.from_reference(out, labels)
    assert classifier.reference_accuracy == 0.8
    assert classifier.accuracy_drop(0.01) == 0.01 and classifier.accuracy_drop(0.9) == 0.8
    assert GateInfo.from_reference(out, None) == GateInfo(50) and GateInfo(50).accuracy_drop(0.01) == 0.01
    assert GateInfo.from_reference(out.reshape(50, 12, 16), labels).reference_accuracy is None  # not logits


def _logits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A 10-class population whose top-1 margins have a density at zero, and an INT8-like perturbation."""
    rng = np.random.default_rng(seed)
    ref = 3.0 * rng.standard_normal((n, 10))
    ref[np.arange(n), rng.integers(0, 10, n)] += 6.0
    return ref, ref + 0.03 * rng.standard_normal(ref.shape)


def test_near_ties_absent_from_the_selection_samples_are_still_predicted():
    """128 selection samples whose smallest margin is far beyond the INT8 noise flip nothing, and the
    old count of their own near-ties (mean Φ(−m/σ)) predicted nothing; the gate's 256 samples hold
    near-ties that do flip. The margin density near zero predicts them."""
    ref, out = _logits(200_000, 0)
    m, d = margin_shift(ref, out)
    truth = float(np.mean(m + d < 0))  # the population's flip rate: 0.48 %, 1.2 of 256 gate samples
    pick = np.flatnonzero(m > 0.15)[:128]  # the selection: no margin within 5 σ of zero
    sel_ref, sel_out = ref[pick], out[pick]
    sm, sd = margin_shift(sel_ref, sel_out)
    assert not np.any(sm + sd < 0) and np.mean([NormalDist().cdf(-x / np.sqrt(np.mean(sd**2))) for x in sm]) < 1e-6
    p = predict((sel_ref, sel_out), None, 256)
    assert truth / 3 <= p.flip_rate <= 3 * truth and p.flip_rate_upper >= p.flip_rate
    gate = GateInfo(256, True, 0.9)
    assert gate.allowed_lost(0.003) == 0 and gate.lost_quantile(p.flip_rate_upper) >= 1, "the check must warn"
    assert GateInfo(256, True, 0.0).lost_quantile(p.flip_rate_upper) == 0  # no label to lose


def test_the_flip_forecast_matches_the_gates_count_and_shrinks_with_the_noise():
    ref, out = _logits(200_000, 1)
    m, d = margin_shift(ref, out)
    truth = float(np.mean(m + d < 0))
    rng = np.random.default_rng(2)
    rates = [flip_rate(*margin_shift(ref[i], out[i])) for i in (rng.choice(len(ref), 128, replace=False) for _ in range(20))]
    assert truth / 1.5 <= float(np.median(rates)) <= 1.5 * truth  # unbiased enough over selections of 128
    half = ref + 0.5 * (out - ref)
    assert flip_rate(m, margin_shift(ref, half)[1]) < 0.6 * flip_rate(m, d)  # less noise, fewer flips (one exact tie no floor)
    tie = np.concatenate([[0.0], m[:127]])
    assert flip_rate(tie, np.full(128, 1e-4)) < 1e-3  # an exact tie alone does not predict a rate float cannot cut


def _with_errors(err: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(reference, output) rows whose per-sample ``1 − cos`` is ``err`` exactly (a rotation in two channels)."""
    ref = np.zeros((len(err), 10))
    ref[:, 0] = 1.0
    out = np.zeros_like(ref)
    out[:, 0], out[:, 1] = 1.0 - err, np.sqrt(1.0 - (1.0 - err) ** 2)
    return ref, out


@pytest.mark.parametrize("spread", [0.3, 1.5])
def test_the_worst_case_grows_no_faster_than_the_sample_count(spread):
    """A trained hybrid's 10-class logits spread ``log(1 − cos)`` over orders of magnitude (1.3–1.5): the
    lognormal's extreme quantile then lies 5–20× past the pooled worst, where the gate measured at most 2.3×.
    The extrapolation stops at the pooled worst times 2·N / n; a narrow spread is predicted as before."""
    from vitexport.quantize import tail

    rng = np.random.default_rng(1)
    err = np.exp(-8.0 + spread * rng.standard_normal(96))
    got = 1.0 - predict(_with_errors(err), None, 256, margins=False).cosine_min
    lognormal, cap = tail._tail_error(err, 256), tail.TAIL_GROWTH * err.max() * 256 / 96
    assert got == pytest.approx(tail.TAIL_MARGIN * min(lognormal, cap), rel=1e-6)
    if spread > 1:
        assert lognormal > 1.2 * cap  # the lognormal alone: a worst case far past what the gate measures
    else:
        assert lognormal < cap  # a ViT's narrow spread: the lognormal decides
