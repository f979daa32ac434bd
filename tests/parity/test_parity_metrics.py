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
    assert not res and res.first_failure.metric == "nonfinite"


def test_compare_gates_each_metric():
    ref = _logits(seed=1)
    out = ref + 1e-3
    assert compare(ref, out, Tolerance(max_abs=1e-2))
    res = compare(ref, out, Tolerance(max_abs=1e-6, cosine_min=0.9))
    assert not res and [c.metric for c in res.checks] == ["max_abs/ref_scale", "cosine_min"]
    assert res.first_failure.metric == "max_abs/ref_scale" and res.checks[1].passed
    absolute = compare(ref, out, Tolerance(max_abs=2e-3, relative=False))
    assert absolute and absolute.checks[0].metric == "max_abs"
    d = res.to_dict()
    assert d["passed"] is False and d["checks"][0]["op"] == "<=" and isinstance(d["metrics"]["max_abs"], float)


def test_accuracy_drop_and_exact_unmasked():
    ref = np.eye(4, 6, dtype=np.float32) * 5
    out = ref.copy()
    out[0] = np.eye(1, 6, 5) * 5
    res = compare(ref, out, Tolerance(accuracy_drop=0.1), labels=np.arange(4))
    assert not res and res.first_failure.metric == "accuracy_drop" and res.first_failure.value == pytest.approx(0.25)
    mask = np.zeros_like(ref, dtype=bool)
    mask[1:] = True  # only rows 1.. must match exactly
    res = compare(ref, out, Tolerance(max_abs=1.0, exact_unmasked=True), unmasked=mask)
    assert [c.metric for c in res.checks] == ["max_abs/ref_scale", "max_abs_unmasked"]
    assert res.checks[1].passed and res.checks[1].value == 0.0


def test_metrics_and_checks_round_trip():
    m = compute_metrics(_logits(), _logits() * 1.01, labels=np.arange(6))
    assert Metrics.from_dict(m.to_dict()) == m
    assert all(isinstance(v, float) for v in m.to_dict().values())
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
