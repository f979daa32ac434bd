"""Choices scored on real activations: each Linear's output error decides.

Three searches share one yardstick — the relative error a Linear's INT8 arithmetic adds to its float
output, ``Σ‖Q(X)·Q(W) − X·W‖² / Σ‖X·W‖²``, on activation rows sampled during calibration
(:class:`~vitexport.calibration.observers.RowSampler`), with exactly the rounding the converter
writes (:func:`~.convert.act_params`, :func:`~.convert.quantize_weight`):

- :func:`search_alpha`: the smoothing strength α of a site (SmoothQuant's migration, searched per
  site rather than one global value; "no smoothing" is a candidate too);
- :func:`search_range`: the clipping range of an activation among its histogram's candidates
  (min/max, percentiles, MSE-optimal) — chosen per tensor rather than one method for all;
- :func:`bias_shift`: the mean output error per channel, which the Linear's float bias absorbs
  (bias correction: the systematic part of the error, e.g. a LayerNorm's mean times the weights'
  rounding, disappears).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .convert import MIN_SCALE, act_params
from .smooth import factors_from

__all__ = ["QuantArith", "search_alpha", "search_range", "bias_shift", "error_split", "correction_and_split",
           "ALPHAS"]

#: smoothing strengths tried per site (None: no smoothing)
ALPHAS: tuple[float | None, ...] = (None, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


@dataclass(frozen=True)
class QuantArith:
    """The rounding a plan's encoding writes: activations symmetric int8 or asymmetric uint8,
    weights per output channel or per tensor, ``qmax`` their largest magnitude."""

    symmetric: bool = True
    per_channel: bool = True
    qmax: int = 127

    def act(self, x: np.ndarray, rng: Mapping[str, float]) -> np.ndarray:
        p = act_params(rng, self.symmetric)
        out = np.divide(x, p.scale, dtype=np.float32)
        np.rint(out, out=out)  # in place: one temporary per call (rint is np.round's half to even)
        if p.signed:
            np.clip(out, -128, 127, out=out)
        else:
            out += p.zero_point
            np.clip(out, 0, 255, out=out)
            out -= p.zero_point
        out *= np.float32(p.scale)
        return out

    def weight(self, w_io: np.ndarray) -> np.ndarray:
        """Fake-quantized (C_in, C_out) weight, per output channel (axis 1) or per tensor: the values
        :func:`~.convert.quantize_weight` writes, rounded in place in float32 (no int8 round trip: the
        searches call this once per candidate on ViT-B's 768×3072 weights)."""
        w = np.asarray(w_io, dtype=np.float32)
        if w.size == 0:
            return w.copy()
        amax = np.abs(w).max(axis=0) if self.per_channel else np.asarray(np.abs(w).max(), np.float32)
        scale = np.maximum(amax / self.qmax, MIN_SCALE).astype(np.float32)
        out = np.divide(w, scale.reshape(1, -1) if self.per_channel else scale)
        np.rint(out, out=out)  # np.round(x) is np.rint: half to even, as quantize_weight rounds
        np.clip(out, -self.qmax, self.qmax, out=out)
        out *= scale.reshape(1, -1) if self.per_channel else scale
        return out


def _range_of(x: np.ndarray, amax: float) -> dict[str, float]:
    return {"amax": float(amax), "lo": float(min(x.min(), 0.0)), "hi": float(max(x.max(), 0.0))}


def _power(refs: Sequence[np.ndarray]) -> float:
    return sum(float(np.square(ref).sum()) for ref in refs)


def _noise(xq: np.ndarray, wq: np.ndarray, ref: np.ndarray) -> float:
    """``‖xq·wq − ref‖²`` with one temporary (the product), squared in place: the searches' inner loop."""
    d = xq @ wq
    d -= ref
    np.square(d, out=d)
    return float(d.sum())


def _error(xq: np.ndarray, wqs: Sequence[np.ndarray], refs: Sequence[np.ndarray], signal: float | None = None) -> float:
    noise = sum(_noise(xq, wq, ref) for wq, ref in zip(wqs, refs))
    return noise / max(_power(refs) if signal is None else signal, 1e-30)


def search_alpha(x: np.ndarray, weights: Sequence[np.ndarray], x_amax: np.ndarray, arith: QuantArith,
                 alphas: Sequence[float | None] = ALPHAS) -> tuple[float | None, np.ndarray, dict[str, float]]:
    """The smoothing strength with the smallest output error for one site.

    Args:
        x: sampled activation rows (N, C).
        weights: the site's Linear weights as (C, C_out) matrices.
        x_amax: per-channel max |X| over the calibration data (sets the activation range exactly).
        arith: the target's rounding.
        alphas: candidates (None: leave the site alone).
    Returns:
        (α, factors s, error of every candidate keyed ``str(α)``).
    """
    refs = [x @ w for w in weights]
    signal = _power(refs)
    w_amax = np.max([np.abs(w).max(axis=1) for w in weights], axis=0).astype(np.float64)
    errors: dict[str, float] = {}
    best: tuple[float, float | None, np.ndarray] | None = None
    for alpha in alphas:
        s = np.ones(x.shape[1], np.float32) if alpha is None else factors_from(np.asarray(x_amax, np.float64), w_amax, alpha)
        xs = x / s
        xq = arith.act(xs, _range_of(xs, float(np.max(np.asarray(x_amax) / s))))
        err = _error(xq, [arith.weight(w * s[:, None]) for w in weights], refs, signal)
        errors[str(alpha)] = err
        if best is None or err < best[0]:
            best = (err, alpha, s)
    assert best is not None
    return best[1], best[2], errors


def search_range(x: np.ndarray, weights: Sequence[np.ndarray], candidates: Mapping[str, Mapping[str, float]],
                 arith: QuantArith) -> tuple[str, dict[str, float]]:
    """The candidate range (``name → {amax, lo, hi}``) with the smallest output error.

    Args:
        x: activation rows (N, C) as the Linears read them (after smoothing).
        weights: the Linears' weights as (C, C_out) matrices (after smoothing).
    Returns:
        (best name, error of every candidate).
    """
    refs = [x @ w for w in weights]
    signal = _power(refs)
    wqs = [arith.weight(w) for w in weights]
    errors, seen = {}, {}  # candidates with the same range (a percentile at the maximum) are scored once
    for name, rng in candidates.items():
        key = (float(rng["amax"]), float(rng["lo"]), float(rng["hi"]))
        if key not in seen:
            seen[key] = _error(arith.act(x, rng), wqs, refs, signal)
        errors[name] = seen[key]
    return min(errors, key=lambda k: (errors[k], k)), errors


def bias_shift(x: np.ndarray, weight: np.ndarray, rng: Mapping[str, float], arith: QuantArith,
               z: float = 3.0, wq: np.ndarray | None = None) -> np.ndarray:
    """Mean INT8 output error per output channel, ``mean(Q(X)·Q(W) − X·W)`` over the rows (C_out,).

    A channel's mean is kept only where it stands ``z`` standard errors clear of zero: a mean that
    sampling noise can explain would move the bias by noise. ``wq``: the fake-quantized weight when
    it is not round-to-nearest (:mod:`.rounding`).
    """
    err = arith.act(x, rng) @ (arith.weight(weight) if wq is None else wq) - x @ weight
    return _shift(err, z)


def correction_and_split(x: np.ndarray, weight: np.ndarray, rng: Mapping[str, float], arith: QuantArith,
                         correct: bool, wq: np.ndarray | None = None) -> tuple[np.ndarray | None, dict[str, float]]:
    """:func:`bias_shift` (when ``correct``) and :func:`error_split` of one Linear from four products
    instead of their six (the float output and the both-quantized one are shared); the same figures."""
    ref = x @ weight
    signal = _power([ref])
    xq, wq = arith.act(x, rng), (arith.weight(weight) if wq is None else wq)
    err = xq @ wq
    err -= ref
    shift = _shift(err) if correct else None
    both = float(np.square(err).sum()) / max(signal, 1e-30)
    return shift, {"weights": _error(x, [wq], [ref], signal), "activations": _error(xq, [weight], [ref], signal),
                   "both": both}


def _shift(err: np.ndarray, z: float = 3.0) -> np.ndarray:
    mean = err.mean(axis=0)
    se = err.std(axis=0, ddof=1) / np.sqrt(len(err)) if len(err) > 1 else np.full_like(mean, np.inf)
    return np.where(np.abs(mean) > z * se, mean, 0.0).astype(np.float32)


def error_split(x: np.ndarray, weight: np.ndarray, rng: Mapping[str, float], arith: QuantArith,
                wq: np.ndarray | None = None) -> dict[str, float]:
    """A Linear's relative INT8 output error from its weights alone, its activations alone, and both:
    where the error comes from (a weight-rounding optimiser can only reduce the first)."""
    ref = x @ weight
    xq, wq = arith.act(x, rng), (arith.weight(weight) if wq is None else wq)
    return {"weights": _error(x, [wq], [ref]), "activations": _error(xq, [weight], [ref]), "both": _error(xq, [wq], [ref])}
