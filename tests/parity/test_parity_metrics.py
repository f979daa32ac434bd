"""Output metrics and the tolerance gate."""
from __future__ import annotations

import math

import numpy as np
import pytest

from vitexport.parity import Check, Metrics, compare, compute_metrics, error_histogram
from vitexport.recipe import Tolerance


def _logits(n=6, c=10, seed=0):
    return np.random.default_rng(seed).standard_normal((n, c)).astype(np.float32)


def test_identical_outputs():
    ref = _logits()
    m = compute_metrics(ref, ref.copy(), labels=ref.argmax(1))
    assert m.max_abs == 0 and m.mean_abs == 0 and m.max_rel == 0
    assert m.cosine_min == pytest.approx(1.0) and m.snr_db == math.inf
    assert m.top1_agreement == 1.0 and m.top5_overlap == 1.0 and m.accuracy == 1.0 == m.reference_accuracy


def test_top1_top5_accuracy():
    ref = np.eye(4, 6, dtype=np.float32) * 5  # sample i predicts class i
    out = ref.copy()
    out[0] = np.eye(1, 6, 5) * 5  # sample 0 now predicts class 5
    m = compute_metrics(ref, out, labels=np.array([0, 1, 2, 0]))
    assert m.top1_agreement == 0.75
    assert m.accuracy == 0.5 and m.reference_accuracy == 0.75
    assert 0.0 <= m.top5_overlap <= 1.0


def test_nonfinite_is_infinite_never_nan():
    ref = _logits()
    out = ref.copy()
    out[1, 2] = np.nan
    m = compute_metrics(ref, out)
    assert m.nonfinite == 1 and m.max_abs == math.inf and m.snr_db == -math.inf and m.cosine_min == -1.0
    res = compare(ref, out, Tolerance(max_abs=1e-3))
    assert not res and res.failed_check.metric == "nonfinite"


def test_compare_gates_each_metric():
    ref = _logits(seed=1)
    out = ref + 1e-3
    assert compare(ref, out, Tolerance(max_abs=1e-2))
    res = compare(ref, out, Tolerance(max_abs=1e-6, cosine_min=0.9))
    assert not res and [c.metric for c in res.checks] == ["max_abs/ref_scale", "cosine_min"]
    assert res.failed_check.metric == "max_abs/ref_scale" and res.checks[1].passed
    absolute = compare(ref, out, Tolerance(max_abs=2e-3, relative=False))
    assert absolute and absolute.checks[0].metric == "max_abs"
    d = res.to_dict()
    assert d["passed"] is False and d["checks"][0]["op"] == "<=" and isinstance(d["metrics"]["max_abs"], float)


def test_accuracy_drop_and_exact_unmasked():
    ref = np.eye(4, 6, dtype=np.float32) * 5
    out = ref.copy()
    out[0] = np.eye(1, 6, 5) * 5
    res = compare(ref, out, Tolerance(accuracy_drop=0.1), labels=np.arange(4))
    assert not res and res.failed_check.metric == "accuracy_drop" and res.failed_check.value == pytest.approx(0.25)
    mask = np.zeros_like(ref, dtype=bool)
    mask[1:] = True  # only rows 1.. must match exactly
    res = compare(ref, out, Tolerance(max_abs=1.0, exact_unmasked=True), unmasked=mask)
    assert [c.metric for c in res.checks] == ["max_abs/ref_scale", "max_abs_unmasked"]
    assert res.checks[1].passed and res.checks[1].value == 0.0


def test_metrics_and_checks_round_trip():
    m = compute_metrics(_logits(), _logits() * 1.01, labels=np.arange(6))
    assert Metrics.from_dict(m.to_dict()) == m
    d = m.to_dict()
    counts = [d.pop("nonfinite"), d.pop("top1_near_ties")]
    assert all(isinstance(v, int) for v in counts) and all(isinstance(v, float) for v in d.values())
    c = Check("cosine_min", 0.5, 0.9, ">=", False)
    assert Check.from_dict(c.to_dict()) == c
    assert str(c) == "cosine_min=0.5 (must be >= 0.9)"


def test_error_histogram():
    ref = np.ones((2, 50), np.float32)
    out = ref.copy()
    out[0, :10] += 1e-4
    out[1, 0] = np.inf
    h = error_histogram(ref, out)
    assert h["zeros"] == 89 and h["nonfinite"] == 1
    assert sum(h["counts"]) + h["below"] + h["above"] == 10
    assert len(h["counts"]) == len(h["edges"]) - 1
    k = int(np.searchsorted(h["edges"], -4.0, side="right")) - 1  # 1e-4 lands in the bin at -4
    assert h["counts"][k] == 10


def _near_tie_logits(n=64, c=1000, seed=0):
    """A random-weight model's logits: every sample near one shared vector, the top two classes
    of each a hair apart (margins of ~1e-3 against an output scale of ~1)."""
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal((n, c)) + 1e-3 * rng.standard_normal((n, c))
    top = ref.argmax(1)
    second = np.argsort(ref, axis=1)[:, -2]
    ref[np.arange(n), top] = ref[np.arange(n), second] + rng.uniform(0, 0.05, n)
    return ref


def test_top1_near_ties_do_not_fail_a_close_export():
    """Random-weight-like logits, cosine 0.999: raw top-1 is a coin toss, the gated one passes."""
    ref = _near_tie_logits()
    rng = np.random.default_rng(1)
    out = ref + 0.045 * rng.standard_normal(ref.shape)  # relative noise ~4.5 %: cosine ~0.999
    tol = Tolerance(cosine_min=0.998, top1_agreement=0.9)
    res = compare(ref, out, tol)
    m = res.metrics
    assert m.cosine_min > 0.998
    assert m.top1_agreement < 0.9  # the old gate failed this export
    assert res and m.top1_agreement_gated == 1.0 and m.top1_near_ties == len(ref)
    assert [c.metric for c in res.checks] == ["cosine_min", "top1_agreement_gated"]
    # z = 0 is the raw gate
    raw = compare(ref, out, Tolerance(cosine_min=0.998, top1_agreement=0.9, top1_margin_z=0.0))
    assert not raw and raw.failed_check.metric == "top1_agreement_gated" and raw.metrics.top1_near_ties == 0


def test_confident_predictions_that_flip_fail_the_top1_gate():
    """Trained-like logits (the top class far ahead); the error swaps the top two of a third of the
    samples: every flip is far beyond what the error's size explains, so each one counts."""
    rng = np.random.default_rng(2)
    n, c = 60, 1000
    ref = rng.standard_normal((n, c))
    ref[np.arange(n), rng.integers(0, c, n)] += 12.0  # margins of ~9 and more
    out = ref + 0.01 * rng.standard_normal(ref.shape)
    flip = np.arange(n) % 3 == 0
    top = ref.argmax(1)
    out[flip, top[flip]] -= 14.0  # an error aimed at the deciding output
    res = compare(ref, out, Tolerance(top1_agreement=0.9))
    m = res.metrics
    assert m.top1_near_ties == 0 and m.top1_agreement_gated == m.top1_agreement == pytest.approx(1 - flip.mean())
    assert not res and res.failed_check.metric == "top1_agreement_gated"


def test_nonfinite_rows_always_count_as_top1_disagreements():
    ref = _near_tie_logits(n=8, c=10)
    out = ref.copy()
    out[3, 0] = np.inf
    m = compute_metrics(ref, out)
    assert m.top1_agreement_gated == m.top1_agreement == 7 / 8 and m.top1_near_ties == 0
