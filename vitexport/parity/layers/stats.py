"""Per-layer statistics: cosine, SNR and error of one layer's activations, the budget a layer may use,
and the first divergence and worst layers of a network (:func:`compare_layers`).
"""
from __future__ import annotations

import math
from dataclasses import field
from typing import Any, Mapping, Sequence

import numpy as np
from pydantic import model_validator

from ...recipe import Tolerance
from ..data import Data, Sparse, result

__all__ = ['LayerBudget', 'LayerResult', 'LayerReport', 'compare_layers']


# --- budget and results ---------------------------------------------------------------------------
@result(frozen=True)
class LayerBudget(Sparse):
    """The error a single layer may show before it counts as divergent. ``None`` means not checked.

    ``max_rel`` is the largest ``max|cand - ref| / max|ref|`` of the layer's activations.
    """

    max_rel: float | None = None
    max_abs: float | None = None
    cosine_min: float | None = None
    snr_db_min: float | None = None

    @classmethod
    def from_tolerance(cls, tolerance: Tolerance | None) -> "LayerBudget":
        """The stage tolerance applied to every layer: a relative ``max_abs`` becomes ``max_rel``, an
        absolute one ``max_abs``; ``cosine_min`` carries over. A tolerance that gates neither (an
        accuracy-only stage) gets ``cosine_min=0.99``, so a divergence is still named."""
        if tolerance is None:
            return cls(max_rel=1e-4)
        max_rel = tolerance.max_abs if tolerance.max_abs is not None and tolerance.relative else None
        max_abs = tolerance.max_abs if tolerance.max_abs is not None and not tolerance.relative else None
        cos = tolerance.cosine_min
        if max_rel is None and max_abs is None and cos is None:
            cos = 0.99
        return cls(max_rel=max_rel, max_abs=max_abs, cosine_min=cos)

    def violations(self, r: "LayerResult") -> list[str]:
        """The checks a layer fails, as ``'metric=value (must be op limit)'`` strings."""
        out = []
        if r.nonfinite:
            out.append(f"nonfinite={r.nonfinite}")
        if self.max_rel is not None and not r.rel_err <= self.max_rel:
            out.append(f"rel_err={r.rel_err:.3g} (must be <= {self.max_rel:.3g})")
        if self.max_abs is not None and not r.max_abs <= self.max_abs:
            out.append(f"max_abs={r.max_abs:.3g} (must be <= {self.max_abs:.3g})")
        if self.cosine_min is not None and not r.ch_cosine_min >= self.cosine_min:
            out.append(f"ch_cosine_min={r.ch_cosine_min:.6g} (must be >= {self.cosine_min:.6g})")
        if self.snr_db_min is not None and not r.ch_snr_db >= self.snr_db_min:
            out.append(f"ch_snr_db={r.ch_snr_db:.3g} (must be >= {self.snr_db_min:.3g})")
        return out

    def noise_budget(self) -> float:
        """The budget as a relative noise power (noise / signal): what one layer may add before it
        counts as a material contributor. ``1 - cos ≈ n / 2`` for small noise ``n``."""
        limits = []
        if self.cosine_min is not None:
            limits.append(2.0 * max(1.0 - self.cosine_min, 1e-12))
        if self.snr_db_min is not None:
            limits.append(10 ** (-self.snr_db_min / 10))
        if self.max_rel is not None:
            limits.append(self.max_rel**2)
        return min(limits) if limits else 0.02


@result
class LayerResult(Data):
    """One layer's error against the reference.

    ``cosine_*`` / ``snr_db`` are plain (per sample, flattened). ``ch_*`` are the same on
    channel-standardized activations (each last-axis channel divided by the reference's std of
    that channel): a ViT's residual stream has outlier channels (|x|≈1400 in ViT-B) that dominate
    the plain norm and hide an error in every other channel. The budget's cosine/SNR limits apply
    to the ``ch_*`` values. ``noise_added`` is the channel-standardized relative noise power this
    layer adds over the previous one; ``noise_share`` its share of the total.
    """

    name: str
    tensor: str | None
    max_abs: float
    rel_err: float
    cosine_min: float
    cosine_mean: float
    snr_db: float
    nonfinite: int = 0
    ch_cosine_min: float = 1.0
    ch_snr_db: float = math.inf
    noise_added: float = 0.0
    noise_share: float = 0.0
    passed: bool = True
    flagged: bool = False
    reason: str = ""
    others: dict[str, dict[str, float]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.passed

    @model_validator(mode="before")
    @classmethod
    def _older_reports(cls, data: Any) -> Any:
        # reports written before the channel-standardized figures existed: the plain ones stand in
        if isinstance(data, Mapping) and "cosine_min" in data:
            data = {"ch_cosine_min": data["cosine_min"], "ch_snr_db": data.get("snr_db", math.inf), **data}
        return data


@result
class LayerReport(Data):
    """Per-layer comparison. ``bool(report)`` is true when no layer left the budget.

    Attributes:
        layers: results in network order.
        budget: the per-layer budget applied.
        first_divergence: the first layer outside the budget, or None.
        worst: the layers that add the most noise, worst first: at most three, each adding at
            least a tenth of the budget's noise by itself (or failing the budget).
        method: how layers were matched: ``'scope'`` (ONNX node scopes), ``'value'`` (by value
            against the torch reference), ``'name'`` (same tensor names), ``'module'`` (torch vs torch).
        notes: anything a reader should know (skipped layers, fallbacks).
        candidates: labels of the compared models when several were (the last is ``layers``'
            subject, the others are in ``LayerResult.others``).
    """

    layers: list[LayerResult]
    budget: LayerBudget = field(default_factory=LayerBudget)
    first_divergence: str | None = None
    worst: list[str] = field(default_factory=list)
    method: str = "scope"
    notes: list[str] = field(default_factory=list)
    candidates: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.first_divergence is None

    def get(self, name: str) -> LayerResult | None:
        return next((r for r in self.layers if r.name == name), None)


def _cos_snr(r: np.ndarray, o: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Per-row cosine, SNR dB and relative noise power of rows ``o`` against rows ``r``."""
    diff = o - r
    num = (r * o).sum(1)
    den = np.linalg.norm(r, axis=1) * np.linalg.norm(o, axis=1)
    cos = np.where(den > 0, num / np.maximum(den, 1e-300), np.where(np.abs(diff).sum(1) == 0, 1.0, 0.0))
    noise = float((diff**2).sum())
    signal = float((r**2).sum())
    snr = math.inf if noise == 0 else 10 * math.log10(max(signal, 1e-300) / noise)
    rel_noise = 0.0 if noise == 0 else noise / max(signal, 1e-300)
    return cos, snr, rel_noise


def _layer_stats(name: str, tensor: str | None, ref: np.ndarray, out: np.ndarray) -> tuple[LayerResult, float]:
    """A layer's result and its channel-standardized relative noise power."""
    ref = np.asarray(ref, dtype=np.float64)
    out = np.asarray(out, dtype=np.float64)
    nonfinite = int((~np.isfinite(out)).sum())
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    if nonfinite:
        return LayerResult(name, tensor, math.inf, math.inf, -1.0, -1.0, -math.inf, nonfinite, -1.0, -math.inf), math.inf
    r = ref.reshape(ref.shape[0], -1) if ref.ndim > 1 else ref.reshape(1, -1)
    o = out.reshape(r.shape)
    max_abs = float(np.abs(o - r).max()) if r.size else 0.0
    cos, snr, _ = _cos_snr(r, o)
    # channel-standardized: the last axis is the channel of a token tensor (B, N, D) or (B, D)
    if ref.ndim >= 2:
        std = ref.reshape(-1, ref.shape[-1]).std(0)
        mean_std = float(std.mean())
        w = 1.0 / (std + 1e-3 * mean_std) if mean_std > 0 else np.ones_like(std)
        rz, oz = (ref * w).reshape(r.shape), (out * w).reshape(r.shape)
    else:
        rz, oz = r, o
    ch_cos, ch_snr, rel_noise = _cos_snr(rz, oz)
    rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    res = LayerResult(name, tensor, max_abs, rel, float(cos.min()), float(cos.mean()), snr, 0,
                      float(ch_cos.min()), ch_snr)
    return res, rel_noise


def compare_layers(
    reference: Mapping[str, np.ndarray],
    candidate: Mapping[str, np.ndarray],
    order: Sequence[str],
    budget: LayerBudget,
    *,
    tensors: Mapping[str, str] | None = None,
    method: str = "scope",
    notes: Sequence[str] = (),
) -> LayerReport:
    """Compare per-layer activations and find the first divergence and the worst layers.

    Args:
        reference, candidate: layer name → activations (same batches, samples along axis 0).
        order: layer names in network order; names missing on either side are skipped with a note.
        budget: what one layer may show.
        tensors: layer name → the candidate tensor it was read from (for the report).
    """
    notes = list(notes)
    results: list[LayerResult] = []
    noise: list[float] = []
    for name in order:
        if name not in reference or name not in candidate:
            notes.append(f"layer '{name}' not found in the {'reference' if name not in reference else 'candidate'}; skipped")
            continue
        ref, out = reference[name], candidate[name]
        if np.shape(ref) != np.shape(out):
            notes.append(f"layer '{name}': shape {np.shape(out)} differs from the reference's {np.shape(ref)}; skipped")
            continue
        r, n = _layer_stats(name, (tensors or {}).get(name), ref, out)
        v = budget.violations(r)
        r.passed, r.reason = not v, "; ".join(v)
        results.append(r)
        noise.append(n)
    # noise each layer adds over the previous one (the first non-finite layer takes it all)
    prev = 0.0
    for r, n in zip(results, noise):
        if math.isinf(n):
            r.noise_added = math.inf if not math.isinf(prev) else 0.0
        else:
            r.noise_added = max(n - prev, 0.0)
        prev = n
    if any(math.isinf(r.noise_added) for r in results):
        for r in results:
            r.noise_share = 1.0 if math.isinf(r.noise_added) else 0.0
    else:
        total = sum(r.noise_added for r in results)
        for r in results:
            r.noise_share = r.noise_added / total if total > 0 else 0.0
    first = next((r.name for r in results if not r.passed), None)
    material = 0.1 * budget.noise_budget()
    ranked = sorted((r for r in results if r.noise_added >= material or (not r.passed and r.noise_added > 0)),
                    key=lambda r: -r.noise_added)
    worst = [r.name for r in ranked[:3]]
    for r in results:
        r.flagged = r.name in worst
    return LayerReport(results, budget, first, worst, method, notes)
