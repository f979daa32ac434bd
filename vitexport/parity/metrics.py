"""Numbers that say how far one set of outputs is from the reference, and whether that is allowed.

A :class:`CompareResult` is data (Polygraphy's comparator habit): statistics plus ``__bool__``;
reports are rendered from it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..recipe import Tolerance

__all__ = ["Metrics", "Check", "CompareResult", "compute_metrics", "compare", "error_histogram", "HISTOGRAM_EDGES"]


def _rows(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a.reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(1, -1)


@dataclass
class Metrics:
    max_abs: float
    mean_abs: float
    max_rel: float
    cosine_min: float
    cosine_mean: float
    snr_db: float
    top1_agreement: float | None = None
    top5_overlap: float | None = None
    accuracy: float | None = None
    reference_accuracy: float | None = None
    ref_scale: float = 1.0
    nonfinite: int = 0

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.__dict__.items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Metrics":
        """Inverse of :meth:`to_dict` (unknown keys are ignored, so older/newer reports load)."""
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: (float(v) if v is not None else None) for k, v in data.items() if k in known}
        if "nonfinite" in kw:
            kw["nonfinite"] = int(kw["nonfinite"])
        for k in ("max_abs", "mean_abs", "max_rel", "cosine_min", "cosine_mean", "snr_db"):
            kw.setdefault(k, math.nan)
        return cls(**kw)

    @property
    def rel_max_abs(self) -> float:
        """``max_abs`` divided by the reference's largest magnitude."""
        return self.max_abs / max(self.ref_scale, 1e-12)


def compute_metrics(ref: np.ndarray, out: np.ndarray, labels: np.ndarray | None = None) -> Metrics:
    """Compare ``out`` with ``ref`` (same shape, samples along axis 0).

    Top-1 / top-5 are computed when the output is 2-D (a classifier's logits); accuracy when
    ``labels`` are given. Non-finite outputs make every distance infinite, never NaN.
    """
    ref = np.asarray(ref, dtype=np.float64)
    out = np.asarray(out, dtype=np.float64)
    if ref.shape != out.shape:
        raise ValueError(f"output shape {out.shape} differs from the reference's {ref.shape}")
    nonfinite = int((~np.isfinite(out)).sum())
    diff = np.abs(out - ref)
    ref_scale = float(np.abs(ref).max()) if ref.size else 1.0
    if nonfinite:
        max_abs = mean_abs = max_rel = math.inf
        cos = np.full(ref.shape[0] if ref.ndim else 1, -1.0)
        snr = -math.inf
    else:
        max_abs = float(diff.max()) if diff.size else 0.0
        mean_abs = float(diff.mean()) if diff.size else 0.0
        max_rel = float((diff / (np.abs(ref) + 1e-6 * max(ref_scale, 1e-12))).max()) if diff.size else 0.0
        r, o = _rows(ref), _rows(out)
        num = (r * o).sum(1)
        den = np.linalg.norm(r, axis=1) * np.linalg.norm(o, axis=1)
        cos = np.where(den > 0, num / np.maximum(den, 1e-300), np.where(np.abs(r - o).sum(1) == 0, 1.0, 0.0))
        noise = float(((o - r) ** 2).sum())
        signal = float((r**2).sum())
        snr = math.inf if noise == 0 else 10 * math.log10(max(signal, 1e-300) / noise)
    m = Metrics(
        max_abs=max_abs,
        mean_abs=mean_abs,
        max_rel=max_rel,
        cosine_min=float(np.min(cos)),
        cosine_mean=float(np.mean(cos)),
        snr_db=snr,
        ref_scale=ref_scale,
        nonfinite=nonfinite,
    )
    if ref.ndim == 2 and ref.shape[1] > 1:
        ref_top1 = ref.argmax(1)
        out_top1 = np.where(np.isfinite(out).all(1), np.nan_to_num(out).argmax(1), -1)
        m.top1_agreement = float((ref_top1 == out_top1).mean())
        k = min(5, ref.shape[1])
        rt = np.argsort(-ref, axis=1)[:, :k]
        ot = np.argsort(-np.nan_to_num(out, nan=-np.inf), axis=1)[:, :k]
        m.top5_overlap = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(rt, ot)]))
        if labels is not None:
            labels = np.asarray(labels).reshape(-1)
            m.accuracy = float((out_top1 == labels).mean())
            m.reference_accuracy = float((ref_top1 == labels).mean())
    return m


@dataclass
class Check:
    metric: str
    value: float
    limit: float
    op: str  # "<=" or ">="
    passed: bool

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "value": float(self.value), "limit": float(self.limit), "op": self.op,
                "passed": bool(self.passed)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Check":
        return cls(str(data["metric"]), float(data["value"]), float(data["limit"]), str(data["op"]), bool(data["passed"]))

    def __str__(self) -> str:
        return f"{self.metric}={self.value:.6g} (must be {self.op} {self.limit:.6g})"


@dataclass
class CompareResult:
    """Metrics plus the checks a tolerance made of them. ``bool(result)`` is whether all held."""

    metrics: Metrics
    tolerance: Tolerance
    checks: list[Check] = field(default_factory=list)

    def __bool__(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def first_failure(self) -> Check | None:
        return next((c for c in self.checks if not c.passed), None)

    def tolerance_dict(self) -> dict[str, Any]:
        return self.tolerance.model_dump(exclude_none=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": bool(self),
            "metrics": self.metrics.to_dict(),
            "tolerance": self.tolerance_dict(),
            "checks": [c.to_dict() for c in self.checks],
        }


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
    """
    if unmasked is not None:
        keep = np.broadcast_to(np.asarray(unmasked, bool), np.shape(ref))
        ref = np.where(keep, ref, 0.0)
        out = np.where(keep, out, 0.0)
    m = compute_metrics(ref, out, labels)
    checks: list[Check] = []
    if m.nonfinite:
        checks.append(Check("nonfinite", float(m.nonfinite), 0.0, "<=", False))
    if tolerance.max_abs is not None:
        value = m.max_abs / max(m.ref_scale, 1e-12) if tolerance.relative else m.max_abs
        name = "max_abs/ref_scale" if tolerance.relative else "max_abs"
        checks.append(Check(name, value, tolerance.max_abs, "<=", value <= tolerance.max_abs))
    if tolerance.cosine_min is not None:
        checks.append(Check("cosine_min", m.cosine_min, tolerance.cosine_min, ">=", m.cosine_min >= tolerance.cosine_min))
    if tolerance.top1_agreement is not None and m.top1_agreement is not None:
        checks.append(
            Check("top1_agreement", m.top1_agreement, tolerance.top1_agreement, ">=", m.top1_agreement >= tolerance.top1_agreement)
        )
    if tolerance.accuracy_drop is not None and m.accuracy is not None and m.reference_accuracy is not None:
        drop = m.reference_accuracy - m.accuracy
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
