"""The report's plots, drawn with matplotlib's Agg canvas (no pyplot, no global backend) and returned
as base64 PNG for the self-contained HTML: errors per stage, per-layer SNR, error histograms, and
each sample's cosine against the gate's threshold.
"""
from __future__ import annotations

import base64
import io
import math
from typing import Any, Mapping

from .common import SNR_PLOT_CAP, _layer_others, _rel

__all__ = ["plot_stage_errors", "plot_layer_snr", "plot_error_histograms", "plot_sample_cosines"]


def _figure(width: float, height: float):
    """A figure on the Agg canvas, without touching pyplot's global backend."""
    # matplotlib loads when a report draws its first plot (measured 0.5 s on an idle core, 3-5 s on a
    # loaded one), not with the package: ``vitexport check`` and the runners never plot
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def plot_stage_errors(data: Mapping[str, Any]) -> str | None:
    """Bars per stage: relative max error (log) and SNR. Returns base64 PNG, or None without stages."""
    stages = [s for s in data.get("stages", []) if s.get("metrics")]
    if not stages:
        return None
    names = [s["stage"] for s in stages]
    colors = ["#2e7d32" if s.get("passed", True) else "#c62828" for s in stages]
    rel = []
    for s in stages:
        r = _rel(s["metrics"])
        rel.append(1e2 if r is None or not math.isfinite(r) else max(r, 1e-12))
    snr = []
    for s in stages:
        v = float(s["metrics"].get("snr_db", 0.0))
        snr.append(SNR_PLOT_CAP if v > SNR_PLOT_CAP else (0.0 if not math.isfinite(v) else v))
    fig = _figure(max(6.0, 1.1 * len(names) + 3), 3.4)
    ax1, ax2 = fig.subplots(1, 2)
    ax1.bar(range(len(names)), rel, color=colors)
    ax1.set_yscale("log")
    ax1.set_ylim(1e-12, 1e2)
    ax1.set_title("max |error| / max |reference|")
    ax2.bar(range(len(names)), snr, color=colors)
    ax2.set_title(f"SNR dB (capped at {int(SNR_PLOT_CAP)})")
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def _short(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[-2:]) if len(parts) > 2 else name


def _snr_y(v: Any) -> float:
    f = float(v) if v is not None else float("nan")
    if math.isnan(f):
        return float("nan")
    return min(f, SNR_PLOT_CAP) if f > -math.inf else -10.0


def plot_layer_snr(data: Mapping[str, Any]) -> str | None:
    """Per-layer channel-standardized SNR, one line per stage (dashed: the other compared models,
    e.g. FP32 beside INT8); the first divergence marked with a red X, the worst layers annotated."""
    stages = [s for s in data.get("stages", []) if s.get("layers")]
    if not stages:
        return None
    longest = max(len(s["layers"]) for s in stages)
    fig = _figure(max(6.0, 0.45 * longest + 3), 3.8)
    ax = fig.subplots()
    labels: list[str] = []
    for s in stages:
        layers = s["layers"]
        summary = s.get("layer_summary") or {}
        subject = (summary.get("candidates") or [None])[-1]
        ys = [_snr_y(r.get("ch_snr_db", r.get("snr_db"))) for r in layers]
        ax.plot(range(len(ys)), ys, marker="o", label=s["stage"] + (f" ({subject})" if subject and _layer_others(s) else ""))
        for label in _layer_others(s):
            oy = [_snr_y((r.get("others") or {}).get(label, {}).get("ch_snr_db")) for r in layers]
            ax.plot(range(len(oy)), oy, marker=".", linestyle="--", label=f"{s['stage']} ({label})")
        first = summary.get("first_divergence")
        for i, r in enumerate(layers):
            if r["name"] == first:
                ax.plot([i], [ys[i]], marker="X", markersize=12, color="#c62828", linestyle="none")
            if r.get("flagged"):
                ax.annotate("worst", (i, ys[i]), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=7)
        if len(layers) > len(labels):
            labels = [_short(r["name"]) for r in layers]
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(f"SNR dB (capped at {int(SNR_PLOT_CAP)})")
    ax.set_title("Per-layer SNR, channel-standardized (red X: first divergence)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def plot_error_histograms(data: Mapping[str, Any]) -> str | None:
    """Histogram of log10 relative error of the outputs, one step line per stage."""
    stages = [s for s in data.get("stages", []) if s.get("histogram") and sum(s["histogram"].get("counts", [])) > 0]
    if not stages:
        return None
    fig = _figure(7.0, 3.4)
    ax = fig.subplots()
    for s in stages:
        h = s["histogram"]
        edges = h["edges"]
        ax.stairs(h["counts"], edges, label=s["stage"] + ("" if s.get("passed", True) else " (FAIL)"))
    ax.set_yscale("log")
    ax.set_xlabel("log10(|output - reference| / max|reference|)")
    ax.set_ylabel("elements")
    ax.set_title("Output error histograms")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def plot_sample_cosines(data: Mapping[str, Any]) -> str | None:
    """Each parity sample's cosine with the reference, one series per stage that gates a cosine (every
    stage when none does), the gate's threshold as a red dashed line; samples under it in red."""
    stages = [s for s in data.get("stages", []) if s.get("sample_cosines")]
    gated = [s for s in stages if (s.get("tolerance") or {}).get("cosine_min") is not None]
    stages = gated or stages
    if not stages:
        return None
    fig = _figure(7.0, 3.0)
    ax = fig.subplots()
    limits = sorted({float(s["tolerance"]["cosine_min"]) for s in gated})
    low = min([min(s["sample_cosines"]) for s in stages] + limits)
    for s in stages:
        ys = s["sample_cosines"]
        ax.plot(range(len(ys)), ys, marker=".", markersize=3, linestyle="none", label=f"{s['stage']} ({s.get('engine', '')})")
        limit = (s.get("tolerance") or {}).get("cosine_min")
        bad = [(i, y) for i, y in enumerate(ys) if limit is not None and y < limit]
        if bad:
            ax.plot([i for i, _ in bad], [y for _, y in bad], marker="x", color="#c62828", linestyle="none")
    for s in stages:  # the quantizer's predicted lower bound of this stage's worst cosine, where it made one
        pred = ((((s.get("details") or {}).get("quantize") or {}).get("parity") or {}).get("prediction") or {}).get("cosine_min")
        if pred is not None:
            ax.axhline(pred, color="#555", linestyle=":", linewidth=1)
            ax.annotate(f"predicted lower bound {pred:.4f}", (len(s["sample_cosines"]) - 1, pred), textcoords="offset points",
                        xytext=(-2, 3), fontsize=7, color="#555", ha="right")
            low = min(low, pred)
    for limit in limits:
        ax.axhline(limit, color="#c62828", linestyle="--", linewidth=1)
        ax.annotate(f"threshold {limit:g}", (0, limit), textcoords="offset points", xytext=(2, 3), fontsize=7,
                    color="#c62828")
    ax.set_ylim(low - 0.1 * (1.0 - low) - 1e-6, 1.0 + 0.05 * (1.0 - low) + 1e-6)
    ax.set_xlabel("parity sample")
    ax.set_ylabel("cosine with the reference")
    ax.set_title("Cosine per sample (red dashed: the gate's threshold; red x: under it)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return _png(fig)
