"""Streaming observers: each sees a tensor batch by batch and keeps a fixed-size summary.

Memory does not grow with the number of samples: a :class:`HistogramObserver` holds one signed
histogram of ``2 * num_bins`` counts whose range doubles when a larger value arrives (merging bins
pairwise, which is exact), plus the exact min and max. Every method is computed from that summary:

- ``minmax``: the exact range.
- ``percentile``: the value below which ``percentile`` % of ``|x|`` (or, asymmetric, of ``x`` on each
  side) lies.
- ``entropy``: TensorRT's KL-divergence threshold search (``EntropyCalibration2``) on ``|x|``.
- ``mse``: the threshold that minimises the expected int8 rounding + clipping error on ``|x|``.

A :class:`ChannelAbsMaxObserver` keeps ``max |x|`` per last-axis channel (equalisation statistics), a
:class:`GramObserver` the sum ``XᵀX`` of a tensor's rows, spread over the stream (GPTQ's Hessian: C² numbers,
whatever the rows).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..recipe import CalibrationMethod

__all__ = ["Range", "HistogramObserver", "MinMaxObserver", "ChannelAbsMaxObserver", "GramObserver", "RowSampler", "make_observer"]


@dataclass(frozen=True)
class Range:
    """What an observer concluded: ``amax`` for symmetric quantization, ``lo``/``hi`` for asymmetric."""

    amax: float
    lo: float
    hi: float
    min: float
    max: float


class HistogramObserver:
    """A fixed-size, range-doubling histogram of a tensor's values.

    Args:
        num_bins: bins per sign (the ``|x|`` histogram has this many bins).
    """

    def __init__(self, num_bins: int = 2048):
        if num_bins % 2:
            num_bins += 1
        self.num_bins = num_bins
        self.counts: np.ndarray | None = None  # 2*num_bins bins over [-R, R]
        self.R = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.count = 0

    def _grow(self, amax: float) -> None:
        n2 = 2 * self.num_bins
        assert self.counts is not None
        while amax > self.R:
            merged = self.counts.reshape(-1, 2).sum(1)  # n2/2 bins covering [-R, R]
            new = np.zeros(n2, dtype=np.int64)
            new[n2 // 4 : n2 // 4 + merged.size] = merged
            self.counts = new
            self.R *= 2.0

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x)
        if x.size == 0:
            return
        x = x.reshape(-1)
        if x.dtype != np.float32:
            x = x.astype(np.float32)
        lo, hi = float(x.min()), float(x.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):
            x = x[np.isfinite(x)]
            if x.size == 0:
                return
            lo, hi = float(x.min()), float(x.max())
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        self.count += int(x.size)
        amax = max(abs(lo), abs(hi))
        n2 = 2 * self.num_bins
        if self.counts is None:
            self.counts = np.zeros(n2, dtype=np.int64)
            self.R = amax if amax > 0 else 1e-8
        elif amax > self.R:
            self._grow(amax)
        # bin index ⌊(x + R)·n2 / 2R⌋, in one float32 buffer computed in place (a quarter of this
        # observer's time on ViT-B went to temporaries); x = R lands in an extra bin, folded into the last
        pos = np.add(x, self.R)
        pos *= n2 / (2.0 * self.R)
        counts = np.bincount(pos.astype(np.int32), minlength=n2 + 1)
        counts[n2 - 1] += counts[n2:].sum()
        self.counts += counts[:n2]

    # --- summaries ------------------------------------------------------------------------------
    def abs_hist(self) -> tuple[np.ndarray, float]:
        """Counts of ``|x|`` in ``num_bins`` bins over ``[0, R]`` and the bin width."""
        assert self.counts is not None
        n = self.num_bins
        pos = self.counts[n:]
        neg = self.counts[:n][::-1]
        return (pos + neg).astype(np.float64), self.R / n

    def _percentile_abs(self, pct: float) -> float:
        h, w = self.abs_hist()
        cdf = np.cumsum(h)
        if cdf[-1] <= 0:
            return 0.0
        i = int(np.searchsorted(cdf, cdf[-1] * pct / 100.0))
        return min((i + 1) * w, max(abs(self.min), abs(self.max)))

    def _percentile_signed(self, pct: float) -> tuple[float, float]:
        assert self.counts is not None
        n2 = 2 * self.num_bins
        w = 2 * self.R / n2
        cdf = np.cumsum(self.counts.astype(np.float64))
        total = cdf[-1]
        i_hi = int(np.searchsorted(cdf, total * pct / 100.0))
        i_lo = int(np.searchsorted(cdf, total * (100.0 - pct) / 100.0))
        hi = min(-self.R + (i_hi + 1) * w, self.max)
        lo = max(-self.R + i_lo * w, self.min)
        return lo, hi

    def _entropy_abs(self, num_quant_bins: int = 128, stride: int = 0) -> float:
        """TensorRT's EntropyCalibration2 threshold search on the ``|x|`` histogram."""
        h, w = self.abs_hist()
        n = h.size
        if h.sum() <= 0:
            return 0.0
        stride = stride or max(1, n // 256)
        best_kl, best_i = math.inf, n
        for i in range(num_quant_bins, n + 1, stride):
            ref = h[:i].copy()
            ref[i - 1] += h[i:].sum()  # clip the tail into the last bin
            # quantize the first i bins into num_quant_bins groups, expand back over non-zero bins
            edges = np.linspace(0, i, num_quant_bins + 1).astype(np.int64)
            src = h[:i]
            nz = src > 0
            sums = np.add.reduceat(src, edges[:-1])
            nzc = np.add.reduceat(nz.astype(np.float64), edges[:-1])
            group = np.repeat(np.arange(num_quant_bins), np.diff(edges))
            q = np.where(nz, (sums / np.maximum(nzc, 1))[group], 0.0)
            p = ref / ref.sum()
            qs = q.sum()
            if qs <= 0:
                continue
            q = q / qs
            mask = p > 0
            # a bin that p has and q lost is an infinite divergence; smooth it like TensorRT does
            qm = np.where(q[mask] > 0, q[mask], 1e-12)
            kl = float(np.sum(p[mask] * np.log(p[mask] / qm)))
            if kl < best_kl:
                best_kl, best_i = kl, i
        return min(best_i * w, max(abs(self.min), abs(self.max)))

    def _mse_abs(self, levels: int = 127, num_candidates: int = 256) -> float:
        h, w = self.abs_hist()
        n = h.size
        if h.sum() <= 0:
            return 0.0
        centers = (np.arange(n) + 0.5) * w
        keep = h > 0
        c, cnt = centers[keep], h[keep]
        cands = np.unique(np.linspace(n / num_candidates, n, num_candidates).astype(np.int64)) * w
        best, best_t = math.inf, cands[-1]
        for chunk in np.array_split(cands, max(1, len(cands) // 32)):
            s = chunk[:, None] / levels
            q = np.clip(np.round(c[None, :] / s), -levels, levels) * s
            err = ((c[None, :] - q) ** 2 * cnt[None, :]).sum(1)
            j = int(np.argmin(err))
            if err[j] < best:
                best, best_t = float(err[j]), float(chunk[j])
        return min(best_t, max(abs(self.min), abs(self.max)))

    def compute(self, method: CalibrationMethod, percentile: float = 99.99) -> Range:
        """The range this observer recommends for ``method``."""
        if self.counts is None:
            return Range(0.0, 0.0, 0.0, 0.0, 0.0)
        absmax = max(abs(self.min), abs(self.max))
        if method is CalibrationMethod.minmax:
            amax, lo, hi = absmax, self.min, self.max
        elif method is CalibrationMethod.percentile:
            amax = self._percentile_abs(percentile)
            lo, hi = self._percentile_signed(percentile)
        elif method is CalibrationMethod.entropy:
            amax = self._entropy_abs()
            lo, hi = max(self.min, -amax), min(self.max, amax)
        else:
            amax = self._mse_abs()
            lo, hi = max(self.min, -amax), min(self.max, amax)
        return Range(float(amax), float(min(lo, 0.0)), float(max(hi, 0.0)), float(self.min), float(self.max))


class MinMaxObserver:
    """Exact running min / max (the cheapest observer; ``minmax`` needs nothing else)."""

    def __init__(self) -> None:
        self.min = math.inf
        self.max = -math.inf
        self.count = 0

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x)
        if x.size == 0:
            return
        finite = x if np.isfinite(x).all() else x[np.isfinite(x)]
        if finite.size == 0:
            return
        self.min, self.max = min(self.min, float(finite.min())), max(self.max, float(finite.max()))
        self.count += int(x.size)

    def compute(self, method: CalibrationMethod = CalibrationMethod.minmax, percentile: float = 100.0) -> Range:
        if self.count == 0:
            return Range(0.0, 0.0, 0.0, 0.0, 0.0)
        amax = max(abs(self.min), abs(self.max))
        return Range(amax, min(self.min, 0.0), max(self.max, 0.0), self.min, self.max)


class ChannelAbsMaxObserver:
    """``max |x|`` per channel of the last axis."""

    def __init__(self) -> None:
        self.amax: np.ndarray | None = None

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float32)
        a = np.abs(x.reshape(-1, x.shape[-1])).max(0)
        self.amax = a if self.amax is None else np.maximum(self.amax, a)


class GramObserver:
    """``XᵀX`` of ``max_rows`` rows (last-axis vectors) of a tensor, in float32: what GPTQ needs of a Linear's
    input, in C² numbers instead of the rows themselves (ViT-B/16's 36 Linear inputs of 768 channels: 85 MB,
    where 4096 rows each would hold 450 MB). Given the stream's length ``total_rows``, the rows are spread
    evenly over it (row i is kept when ⌊(i+1)·m/T⌋ > ⌊i·m/T⌋: m of T, every image contributing), else they
    are the first ``max_rows``."""

    def __init__(self, max_rows: int, total_rows: int = 0):
        self.max_rows, self.total = max_rows, max(total_rows, max_rows)
        self.gram: np.ndarray | None = None
        self.rows = 0  # rows summed
        self.seen = 0  # rows offered

    def update(self, x: np.ndarray) -> None:
        rows = np.asarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
        i = self.seen + np.arange(len(rows))
        self.seen += len(rows)
        m, t = self.max_rows, self.total
        rows = rows[((i + 1) * m // t > i * m // t) & (i < t)][: m - self.rows]
        if not len(rows):
            return
        if self.gram is None:
            self.gram = rows.T @ rows
        else:
            self.gram += rows.T @ rows
        self.rows += len(rows)

    def hessian(self) -> np.ndarray | None:
        """The mean ``XᵀX / N`` in float64 (None before any row)."""
        return None if self.gram is None else self.gram.astype(np.float64) / self.rows


class RowSampler:
    """A uniform random sample of at most ``max_rows`` rows (last-axis vectors, one per token) of a
    tensor, kept across batches: the search for smoothing factors and clipping ranges scores
    candidates on real activations. Priority sampling (keep the rows with the smallest random keys)
    gives every row the same chance whatever the batch sizes, and the same rows for the same seed.
    """

    def __init__(self, max_rows: int = 512, seed: int = 0):
        self.max_rows = max_rows
        self.rng = np.random.default_rng(seed)
        self.rows: np.ndarray | None = None
        self.keys: np.ndarray | None = None
        self.seen = 0  # rows offered, kept or not

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float32)
        rows = x.reshape(-1, x.shape[-1])
        self.seen += len(rows)
        keys = self.rng.random(len(rows))
        if self.rows is not None:
            if len(self.rows) >= self.max_rows:  # full: only a row whose key beats the largest kept one can enter
                new = keys < self.keys.max()
                if not new.any():
                    return
                rows, keys = rows[new], keys[new]
            rows, keys = np.concatenate([self.rows, rows]), np.concatenate([self.keys, keys])
        if len(rows) > self.max_rows:
            keep = np.argpartition(keys, self.max_rows)[: self.max_rows]
            keep.sort()
            rows, keys = rows[keep], keys[keep]
        self.rows, self.keys = np.ascontiguousarray(rows), keys


def make_observer(method: CalibrationMethod, num_bins: int = 2048) -> HistogramObserver | MinMaxObserver:
    """The smallest observer that can answer ``method``."""
    if method is CalibrationMethod.minmax:
        return MinMaxObserver()
    return HistogramObserver(num_bins)
