"""Streaming observers: fixed memory, results close to the exact statistic over all data."""
from __future__ import annotations

import numpy as np
import pytest

from vitexport.recipe import CalibrationMethod as M
from vitexport.calibration import ChannelAbsMaxObserver, HistogramObserver, MinMaxObserver, make_observer
from vitexport.calibration.observers import GramObserver, RowSampler


def _batches(seed=0, n=6):
    rng = np.random.default_rng(seed)
    # growing spread: the range must double several times while streaming
    return [rng.standard_normal((4, 64, 32)).astype(np.float32) * (1 + 3 * i) for i in range(n)]


def test_minmax_is_exact():
    xs = _batches()
    ob = MinMaxObserver()
    for x in xs:
        ob.update(x)
    allx = np.concatenate([x.ravel() for x in xs])
    r = ob.compute(M.minmax)
    assert r.min == allx.min() and r.max == allx.max() and r.amax == np.abs(allx).max()


def test_histogram_memory_is_fixed_and_counts_everything():
    ob = HistogramObserver(512)
    for x in _batches(n=10):
        ob.update(x)
        assert ob.counts.size == 1024
    assert ob.counts.sum() == ob.count == 10 * 4 * 64 * 32


@pytest.mark.parametrize("pct", [99.0, 99.9, 99.99])
def test_percentile_matches_numpy_within_a_bin(pct):
    xs = _batches()
    ob = HistogramObserver(2048)
    for x in xs:
        ob.update(x)
    allx = np.concatenate([x.ravel() for x in xs])
    r = ob.compute(M.percentile, pct)
    _, w = ob.abs_hist()
    a = np.abs(allx)
    # between the neighbouring order statistics (numpy interpolates, the histogram gives a bin edge)
    assert np.percentile(a, pct, method="lower") - 2 * w <= r.amax <= np.percentile(a, pct, method="higher") + 2 * w
    assert np.percentile(allx, 100 - pct, method="lower") - 2 * w <= r.lo <= np.percentile(allx, 100 - pct, method="higher") + 2 * w
    assert np.percentile(allx, pct, method="lower") - 2 * w <= r.hi <= np.percentile(allx, pct, method="higher") + 2 * w


def test_streaming_equals_one_shot_when_range_is_known():
    xs = _batches()
    big = np.concatenate([x.ravel() for x in xs])
    a, b = HistogramObserver(1024), HistogramObserver(1024)
    a.update(big)
    # feed the largest batch first so no doubling happens: identical histograms
    for x in sorted(xs, key=lambda v: -np.abs(v).max()):
        b.update(x)
    np.testing.assert_array_equal(a.counts, b.counts)


def test_entropy_clips_a_long_tail():
    rng = np.random.default_rng(0)
    ob = make_observer(M.entropy)
    x = rng.standard_normal(200_000).astype(np.float32)
    x[:5] = 60.0  # a few huge outliers
    ob.update(x)
    r = ob.compute(M.entropy)
    assert 2.0 < r.amax < 30.0, r
    assert r.max == 60.0


def _int8_mse(x: np.ndarray, amax: float) -> float:
    s = amax / 127
    return float(((np.clip(np.round(x / s), -127, 127) * s - x) ** 2).mean())


def test_mse_threshold_is_near_the_best():
    rng = np.random.default_rng(0)
    x = rng.laplace(size=200_000).astype(np.float32)  # heavy-ish tail: clipping pays
    ob = make_observer(M.mse)
    ob.update(x)
    r = ob.compute(M.mse)
    grid = np.linspace(0.05, 1.0, 60) * np.abs(x).max()
    best = min(_int8_mse(x, t) for t in grid)
    assert r.amax < np.abs(x).max()
    assert _int8_mse(x, r.amax) <= 1.05 * best


def test_asymmetric_range_of_a_positive_tensor():
    ob = HistogramObserver()
    ob.update(np.random.default_rng(0).uniform(0, 1, 100_000).astype(np.float32))
    r = ob.compute(M.percentile, 99.99)
    assert r.lo == 0.0 and 0.99 < r.hi <= 1.0


def test_nonfinite_values_are_ignored():
    ob = HistogramObserver()
    ob.update(np.array([1.0, -2.0, np.inf, np.nan], np.float32))
    assert ob.compute(M.minmax).amax == 2.0


def test_channel_absmax():
    ob = ChannelAbsMaxObserver()
    ob.update(np.array([[[1.0, -5.0, 2.0]]], np.float32))
    ob.update(np.array([[[-3.0, 1.0, 0.5]]], np.float32))
    np.testing.assert_array_equal(ob.amax, [3.0, 5.0, 2.0])


@pytest.mark.parametrize("total", [0, 1257, 5000])
def test_gram_sums_rows_spread_over_the_stream_whatever_the_batches(total):
    """``XᵀX`` of 400 rows: the first 400 when the stream's length is not given; given it, 400 spread evenly
    over it (of a 1257-row stream every third or so, the last rows included), however the batches cut them."""
    rng = np.random.default_rng(3)
    batches = [rng.standard_normal(shape).astype(np.float32) for shape in [(2, 20, 8), (1, 300, 8), (17, 8), (900, 8)]]
    gram = GramObserver(400, total)
    for b in batches:
        gram.update(b)
    rows = np.concatenate([b.reshape(-1, 8) for b in batches]).astype(np.float64)
    t = max(total, 400)
    picked = [i for i in range(min(len(rows), t)) if (i + 1) * 400 // t > i * 400 // t]
    assert len(picked) == min(len(rows), t) * 400 // t
    assert gram.rows == len(picked) and (total != len(rows) or picked[-1] == len(rows) - 1)
    np.testing.assert_allclose(gram.hessian(), rows[picked].T @ rows[picked] / len(picked), rtol=1e-5, atol=1e-6)
    assert GramObserver(10).hessian() is None


def test_row_sample_is_the_rows_with_the_smallest_keys_of_the_whole_stream():
    """Priority sampling, checked against its definition: the kept rows are, in stream order, those whose
    keys (the sampler's own seeded draw, one per row) are the ``max_rows`` smallest of every row offered;
    a full sampler passing over a batch whose keys cannot enter changes nothing."""
    rng = np.random.default_rng(5)
    batches = [rng.standard_normal((n, 6)).astype(np.float32) for n in (300, 1, 77, 512, 3, 260)]
    sampler = RowSampler(128, seed=11)
    for b in batches:
        sampler.update(b)
    rows = np.concatenate(batches)
    keys = np.random.default_rng(11).random(len(rows))  # the sampler's stream: one key per row, in order
    keep = np.sort(np.argsort(keys)[:128])
    np.testing.assert_array_equal(sampler.rows, rows[keep])
    np.testing.assert_array_equal(sampler.keys, keys[keep])
    assert sampler.seen == len(rows)


def test_histogram_bins_every_value_where_its_definition_puts_it():
    """Each value x of a range-R histogram lands in bin ⌊(x + R)·n₂ / 2R⌋, the maximum in the last bin."""
    rng = np.random.default_rng(6)
    x = (rng.standard_normal(10_000) * 3).astype(np.float32)
    ob = HistogramObserver(num_bins=64)
    ob.update(x)
    n2, r = 128, float(np.abs(x).max())
    want = np.bincount(np.minimum(((x + np.float32(r)) * np.float32(n2 / (2 * r))).astype(np.int64), n2 - 1),
                       minlength=n2)
    np.testing.assert_array_equal(ob.counts, want)
    assert ob.counts.sum() == x.size
