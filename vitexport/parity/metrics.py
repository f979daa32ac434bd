"""Numbers that say how far one set of outputs is from the reference, and whether that is allowed.

A :class:`CompareResult` is data (Polygraphy's comparator habit): statistics plus ``__bool__``;
reports are rendered from it. The classes serialise through :mod:`.data` (pydantic).

The top-1 gate is not a coin toss. Where the reference barely prefers its top class (a random-weight
model's logits are nearly flat; an ambiguous image has two close classes), any error at all may
flip the top-1, and counting those flips gates on noise. Sample ``i``'s flip counts as a
disagreement only when the reference's top-1/top-2 margin ``m_i`` is larger than the measured
error can explain: ``m_i > z * sqrt(2) * sigma_i``, where ``sigma_i`` is that sample's RMS output
error (over all of its outputs). Why this bound: the margin moves by the difference of two errors,
``e_top2 - e_top1``; errors of RMS size ``sigma`` on two outputs move it by about ``sqrt(2) * sigma``
(the spread of a difference of two independent errors), so a margin above ``z`` of those spreads
(``Tolerance.top1_margin_z``, default 3: a one-sided 3-sigma event, ~0.1 % of samples) does not flip
by chance. The bound cannot be bought by concentrating the error on the deciding outputs: ``sigma_i``
averages over every output, so an error aimed at two logits of a thousand barely raises it and the
flip counts. Nor by a large error everywhere: that lowers the cosine, which the stage gates too
(``1 - cos ~ sigma^2 / (2 * mean(ref^2))``), so the excuse is bounded by the cosine budget. A non-finite
output row always counts. Reported: ``top1_agreement`` (raw), ``top1_agreement_gated`` (what
``Tolerance.top1_agreement`` gates) and ``top1_near_ties`` (samples whose margin is within the bound).
"""
from __future__ import annotations

import math
from dataclasses import field
from typing import Any

import numpy as np
from pydantic import model_serializer

from ..recipe import Tolerance
from .data import Data, Sparse, TolerancePlain, result

__all__ = ["Metrics", "Check", "CompareResult", "compute_metrics", "compare", "error_histogram", "sample_cosines", "HISTOGRAM_EDGES",
           "DEFAULT_TOP1_MARGIN_Z"]

#: the schema's default ``Tolerance.top1_margin_z`` (used when metrics are computed without a tolerance)
DEFAULT_TOP1_MARGIN_Z: float = Tolerance.model_fields["top1_margin_z"].default


def _rows(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a.reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(1, -1)


@result
class Metrics(Sparse):
    """Distances of one output from the reference; ``None``: not measured (no classes, no labels).

    ``top1_agreement`` counts every top-1 flip; ``top1_agreement_gated`` only flips the measured
    error cannot explain, and ``top1_near_ties`` is how many samples had a margin that small (see
    the module's docstring).
    """

    max_abs: float
    mean_abs: float
    max_rel: float
    cosine_min: float
    cosine_mean: float
    snr_db: float
    top1_agreement: float | None = None
    top1_agreement_gated: float | None = None
    top1_near_ties: int | None = None
    top5_overlap: float | None = None
    accuracy: float | None = None
    reference_accuracy: float | None = None
    ref_scale: float = 1.0
    nonfinite: int = 0

    @property
    def rel_max_abs(self) -> float:
        """``max_abs`` divided by the reference's largest magnitude."""
        return self.max_abs / max(self.ref_scale, 1e-12)


def _cosines(r: np.ndarray, o: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row (an all-zero row: 1 when both are equal, else 0)."""
    num = (r * o).sum(1)
    den = np.linalg.norm(r, axis=1) * np.linalg.norm(o, axis=1)
    return np.where(den > 0, num / np.maximum(den, 1e-300), np.where(np.abs(r - o).sum(1) == 0, 1.0, 0.0))


def sample_cosines(ref: np.ndarray, out: np.ndarray) -> list[float] | None:
    """Each sample's cosine with the reference, in sample order (the report plots them against the
    gate's threshold); None when the output holds NaN/Inf (no cosine is defined there)."""
    if not np.isfinite(out).all():
        return None
    return [round(float(c), 7) for c in _cosines(_rows(ref), _rows(out))]


def _distances(ref: np.ndarray, out: np.ndarray) -> Metrics:
    """Element and per-sample distances (non-finite outputs make them infinite, never NaN)."""
    nonfinite = int((~np.isfinite(out)).sum())
    diff = np.abs(out - ref)
    ref_scale = float(np.abs(ref).max()) if ref.size else 1.0
    if nonfinite:
        return Metrics(math.inf, math.inf, math.inf, -1.0, -1.0, -math.inf, ref_scale=ref_scale, nonfinite=nonfinite)
    r, o = _rows(ref), _rows(out)
    cos = _cosines(r, o)
    noise = float(((o - r) ** 2).sum())
    signal = float((r**2).sum())
    return Metrics(
        max_abs=float(diff.max()) if diff.size else 0.0,
        mean_abs=float(diff.mean()) if diff.size else 0.0,
        max_rel=float((diff / (np.abs(ref) + 1e-6 * max(ref_scale, 1e-12))).max()) if diff.size else 0.0,
        cosine_min=float(np.min(cos)),
        cosine_mean=float(np.mean(cos)),
        snr_db=math.inf if noise == 0 else 10 * math.log10(max(signal, 1e-300) / noise),
        ref_scale=ref_scale,
    )


def _classes(m: Metrics, ref: np.ndarray, out: np.ndarray, labels: np.ndarray | None, z: float) -> None:
    """Top-1 (raw and margin-gated), top-5 and accuracy of 2-D logits, into ``m``."""
    finite = np.isfinite(out).all(1)
    ref_top1 = ref.argmax(1)
    out_top1 = np.where(finite, np.nan_to_num(out).argmax(1), -1)
    agree = ref_top1 == out_top1
    top2 = np.partition(ref, -2, axis=1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    sigma = np.sqrt(np.mean((np.where(finite[:, None], out, ref) - ref) ** 2, axis=1))
    near = finite & (margin <= z * math.sqrt(2.0) * sigma)
    m.top1_agreement = float(agree.mean())
    m.top1_agreement_gated = float((agree | near).mean())
    m.top1_near_ties = int(near.sum())
    k = min(5, ref.shape[1])
    rt = np.argsort(-ref, axis=1)[:, :k]
    ot = np.argsort(-np.nan_to_num(out, nan=-np.inf), axis=1)[:, :k]
    m.top5_overlap = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(rt, ot)]))
    if labels is not None:
        labels = np.asarray(labels).reshape(-1)
        m.accuracy = float((out_top1 == labels).mean())
        m.reference_accuracy = float((ref_top1 == labels).mean())


def compute_metrics(ref: np.ndarray, out: np.ndarray, labels: np.ndarray | None = None, *,
                    top1_margin_z: float = DEFAULT_TOP1_MARGIN_Z) -> Metrics:
    """Compare ``out`` with ``ref`` (same shape, samples along axis 0).

    Args:
        ref, out: reference and candidate outputs.
        labels: optional integer labels (accuracy).
        top1_margin_z: the near-tie bound of the gated top-1 agreement (module docstring).
    Returns:
        :class:`Metrics`. Top-1 / top-5 are computed when the output is 2-D (a classifier's
        logits); accuracy when ``labels`` are given. Non-finite outputs make every distance
        infinite, never NaN.
    Raises:
        ValueError: the shapes differ.
    """
    ref = np.asarray(ref, dtype=np.float64)
    out = np.asarray(out, dtype=np.float64)
    if ref.shape != out.shape:
        raise ValueError(f"output shape {out.shape} differs from the reference's {ref.shape}")
    m = _distances(ref, out)
    if ref.ndim == 2 and ref.shape[1] > 1:
        _classes(m, ref, out, labels, top1_margin_z)
    return m


@result
class Check(Sparse):
    """One gated metric: ``value op limit`` held (``passed``) or not; a failed check may say what
    failed by name (``why``: the float layers of an INT8-share check) and what to try (``hints``)."""

    metric: str
    value: float
    limit: float
    op: str  # "<=" or ">="
    passed: bool
    why: str | None = None
    hints: list[str] | None = None

    def __str__(self) -> str:
        return f"{self.metric}={self.value:.6g} (must be {self.op} {self.limit:.6g})"


@result
class CompareResult(Data):
    """Metrics plus the checks a tolerance made of them. ``bool(result)`` is whether all held."""

    metrics: Metrics
    tolerance: TolerancePlain
    checks: list[Check] = field(default_factory=list)

    def __bool__(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failed_check(self) -> Check | None:
        """The first check that did not hold, or None."""
        return next((c for c in self.checks if not c.passed), None)

    def tolerance_dict(self) -> dict[str, Any]:
        return self.tolerance.model_dump(exclude_none=True)

    @model_serializer(mode="wrap")
    def _with_verdict(self, handler) -> dict[str, Any]:
        return {"passed": bool(self), **handler(self)}


def compare(
    ref: np.ndarray,
    out: np.ndarray,
    tolerance: Tolerance,
    labels: np.ndarray | None = None,
    unmasked: np.ndarray | None = None,
) -> CompareResult:
    """Compute metrics and gate them with ``tolerance``.

    Args:
        ref, out: reference and candidate outputs, samples along axis 0.
        tolerance: the stage's contract from the recipe.
        labels: optional integer labels (accuracy, accuracy drop).
        unmasked: optional boolean array of ``ref``'s shape marking the positions of real tokens
            (a text encoder's ``attention_mask == 1``). Padded positions carry no meaning: a fully
            masked row legitimately changes when a mask becomes ``where`` (uniform instead of NaN
            or zeros), so every metric is computed on real positions only, and with
            ``tolerance.exact_unmasked`` they must match within ``max_abs``.
    Returns:
        The :class:`CompareResult`. ``tolerance.top1_agreement`` gates the margin-gated top-1
        agreement (check ``top1_agreement_gated``; see the module docstring).
    """
    if unmasked is not None:
        keep = np.broadcast_to(np.asarray(unmasked, bool), np.shape(ref))
        ref = np.where(keep, ref, 0.0)
        out = np.where(keep, out, 0.0)
    m = compute_metrics(ref, out, labels, top1_margin_z=tolerance.top1_margin_z)
    checks: list[Check] = []
    if m.nonfinite:
        checks.append(Check("nonfinite", float(m.nonfinite), 0.0, "<=", False))
    if tolerance.max_abs is not None:
        value = m.max_abs / max(m.ref_scale, 1e-12) if tolerance.relative else m.max_abs
        name = "max_abs/ref_scale" if tolerance.relative else "max_abs"
        checks.append(Check(name, value, tolerance.max_abs, "<=", value <= tolerance.max_abs))
    if tolerance.cosine_min is not None:
        checks.append(Check("cosine_min", m.cosine_min, tolerance.cosine_min, ">=", m.cosine_min >= tolerance.cosine_min))
    if tolerance.top1_agreement is not None and m.top1_agreement_gated is not None:
        gated = m.top1_agreement_gated  # flips on near-ties excused (module docstring)
        checks.append(Check("top1_agreement_gated", gated, tolerance.top1_agreement, ">=", gated >= tolerance.top1_agreement))
    if tolerance.accuracy_drop is not None and m.accuracy is not None and m.reference_accuracy is not None:
        # from sample counts: 1.0 − 0.995 is 0.0050000000000000044 in floats, which would fail the
        # accuracy_drop=0.005 a run that lost 2 of 400 is told it may accept
        n = int(np.asarray(labels).size)
        drop = (round(m.reference_accuracy * n) - round(m.accuracy * n)) / n
        checks.append(Check("accuracy_drop", drop, tolerance.accuracy_drop, "<=", drop <= tolerance.accuracy_drop))
    if tolerance.exact_unmasked and unmasked is not None:
        d = np.abs(np.asarray(out, np.float64) - np.asarray(ref, np.float64))[np.asarray(unmasked, bool)]
        worst = float(d.max()) if d.size else 0.0
        limit = (tolerance.max_abs or 0.0) * (max(m.ref_scale, 1e-12) if tolerance.relative else 1.0)
        checks.append(Check("max_abs_unmasked", worst, limit, "<=", worst <= limit))
    return CompareResult(m, tolerance, checks)


# log10 of |out - ref| / ref_scale: from 1e-12 (float32 noise is ~1e-7) to 100x the reference scale
HISTOGRAM_EDGES: tuple[float, ...] = tuple(float(x) for x in np.arange(-12.0, 2.01, 0.5))


def error_histogram(ref: np.ndarray, out: np.ndarray, ref_scale: float | None = None) -> dict[str, Any]:
    """Histogram of the relative error ``|out - ref| / ref_scale`` on a log10 scale.

    Returns plain data (it is stored in ``parity.json`` so reports re-render without the arrays):
    ``edges`` (log10 bin edges), ``counts``, ``zeros`` (exactly equal elements), ``nonfinite`` and
    ``below``/``above`` (outside the edges).
    """
    ref = np.asarray(ref, dtype=np.float64)
    out = np.asarray(out, dtype=np.float64)
    scale = float(np.abs(ref).max()) if ref_scale is None and ref.size else float(ref_scale or 1.0)
    finite = np.isfinite(out)
    d = np.abs(out[finite] - ref[finite]) / max(scale, 1e-12)
    zeros = int((d == 0).sum())
    d = d[d > 0]
    logs = np.log10(d)
    edges = np.asarray(HISTOGRAM_EDGES)
    counts, _ = np.histogram(logs, bins=edges)
    return {
        "edges": [float(e) for e in edges],
        "counts": [int(c) for c in counts],
        "zeros": zeros,
        "nonfinite": int((~finite).sum()),
        "below": int((logs < edges[0]).sum()),
        "above": int((logs > edges[-1]).sum()),
        "scale": scale,
    }
