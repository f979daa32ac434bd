"""Reports rendered from data: ``parity.json`` (the data), ``parity.md`` and ``parity.html``.

Both renderers take the ``parity.json`` dict, never live objects, so a finished run's report can be
re-rendered from its file (``vitexport parity OUT_DIR``). The HTML is self-contained: inline CSS and
plots drawn with matplotlib's Agg canvas, embedded as base64 PNG.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from pathlib import Path
from typing import Any, Mapping

from ..errors import BadInput
from ..io import atomic_write_json, atomic_write_text
from .stage import ParityRun

__all__ = [
    "PARITY_JSON",
    "PARITY_MD",
    "PARITY_HTML",
    "write_reports",
    "render_reports",
    "load_run",
    "render_markdown",
    "render_html",
    "md_text",
    "md_code",
]

PARITY_JSON, PARITY_MD, PARITY_HTML = "parity.json", "parity.md", "parity.html"
_SNR_PLOT_CAP = 140.0


# --- formatting -------------------------------------------------------------------------------------
# Markdown punctuation; an intraword underscore (freeze_layernorm) emphasises nothing and stays readable
_MD_SPECIAL = re.compile(r"([\\`*\[\]|#~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")


def md_text(text: Any) -> str:
    """A user string (a path, a module name, a note) as literal Markdown text: one line, Markdown
    punctuation backslash-escaped, HTML characters as entities (a ``<script>`` in a path stays text)."""
    s = " ".join(str(text).split())
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", s)


def md_code(text: Any) -> str:
    """A user string as a Markdown code span (literal, HTML included), fenced with more backticks
    than it contains."""
    s = " ".join(str(text).split())
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def _num(v: Any, kind: str = "g") -> str:
    if v is None:
        return "–"
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    if kind == "pct":
        return f"{100 * f:.1f}%"
    if kind == "cos":
        return f"{f:.6f}"
    if kind == "db":
        return f"{f:.1f}"
    if kind == "s":
        return f"{f:.2f}"
    if f == 0:
        return "0"
    if abs(f) < 1e-3 or abs(f) >= 1e5:
        return f"{f:.2e}"
    return f"{f:.4g}"


def _rel(metrics: Mapping[str, Any]) -> float | None:
    if "max_abs" not in metrics:
        return None
    scale = float(metrics.get("ref_scale", 1.0) or 1.0)
    return float(metrics["max_abs"]) / max(scale, 1e-12)


def _verdict(passed: bool) -> str:
    return "PASS" if passed else "FAIL"


def _check_text(c: Mapping[str, Any]) -> str:
    return f"{c['metric']}={_num(c['value'])} (must be {c['op']} {_num(c['limit'])})"


def _failed_check(stage: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next((c for c in stage.get("checks", []) if not c.get("passed", True)), None)


def _budget_text(budget: Mapping[str, Any]) -> str:
    parts = []
    if "max_rel" in budget:
        parts.append(f"rel_err <= {_num(budget['max_rel'])}")
    if "max_abs" in budget:
        parts.append(f"max_abs <= {_num(budget['max_abs'])}")
    if "cosine_min" in budget:
        parts.append(f"cosine_min >= {_num(budget['cosine_min'])}")
    if "snr_db_min" in budget:
        parts.append(f"SNR >= {_num(budget['snr_db_min'], 'db')} dB")
    return ", ".join(parts) or "none"


def _headline(data: Mapping[str, Any], code=md_code, text=md_text) -> str:
    """One sentence: the verdict, and where and why a run failed (``code`` / ``text`` format
    names and free text: Markdown by default, plain for HTML, which escapes it as a whole)."""
    if data.get("passed", True):
        n = len(data.get("stages", []))
        return f"All {n} stage(s) within tolerance."
    stage = next((s for s in data.get("stages", []) if not s.get("passed", True)), None)
    if stage is None:
        return "Failed."
    c = _failed_check(stage)
    s = f"Failed at stage {code(stage['stage'])}"
    if c is not None:
        s += f": {text(_check_text(c))}"
    if stage.get("first_divergence"):
        s += f"; first divergence at {code(stage['first_divergence'])}"
    return s + "."


_STAGE_COLUMNS = [
    ("stage", None), ("engine", None), ("result", None), ("changed", None),
    ("max abs", "max_abs"), ("max abs / ref", "_rel"), ("mean abs", "mean_abs"),
    ("cos min", "cosine_min"), ("cos mean", "cosine_mean"), ("SNR dB", "snr_db"),
    # top-1: every flip counts; gated: flips on near-ties excused (what the gate checks; see
    # vitexport.parity.metrics); near-ties: samples whose top-1/top-2 margin the error can explain
    ("top-1", "top1_agreement"), ("top-1 gated", "top1_agreement_gated"), ("near-ties", "top1_near_ties"),
    ("top-5", "top5_overlap"), ("acc", "accuracy"), ("time s", None),
]


def _stage_row(s: Mapping[str, Any]) -> list[str]:
    m = s.get("metrics") or {}
    kinds = {"cosine_min": "cos", "cosine_mean": "cos", "snr_db": "db", "top1_agreement": "pct",
             "top1_agreement_gated": "pct", "top5_overlap": "pct", "accuracy": "pct"}
    row = [s["stage"], s.get("engine", ""), _verdict(s.get("passed", True)),
           "–" if s.get("changed") is None else str(s["changed"])]
    for _, key in _STAGE_COLUMNS[4:-1]:
        row.append(_num(_rel(m) if key == "_rel" else m.get(key), kinds.get(key or "", "g")))
    row.append(_num(float(s.get("seconds", 0.0)) + float(s.get("parity_seconds", 0.0)), "s"))
    return row


_LAYER_COLUMNS = ["#", "layer", "tensor", "cos min", "SNR dB", "ch cos min", "ch SNR dB", "noise share", "rel err"]


def _layer_others(stage: Mapping[str, Any]) -> list[str]:
    """Labels of the other compared models (``fp32`` beside ``int8``), in first-seen order."""
    labels: dict[str, None] = {}
    for r in stage.get("layers") or []:
        for k in (r.get("others") or {}):
            labels.setdefault(k, None)
    return list(labels)


def _layer_header(stage: Mapping[str, Any]) -> list[str]:
    subject = ((stage.get("layer_summary") or {}).get("candidates") or [None])[-1]
    head = list(_LAYER_COLUMNS)
    if subject and _layer_others(stage):
        head[3:7] = [f"{subject} {c}" for c in head[3:7]]
    for label in _layer_others(stage):
        head += [f"{label} ch cos min", f"{label} ch SNR dB"]
    return head + ["status"]


def _layer_row(i: int, r: Mapping[str, Any], first: str | None, others: list[str]) -> list[str]:
    status = "ok" if r.get("passed", True) else "over budget"
    if r["name"] == first:
        status = "FIRST DIVERGENCE"
    if r.get("flagged"):
        status += " · worst"
    row = [str(i), r["name"], r.get("tensor") or "–", _num(r["cosine_min"], "cos"), _num(r["snr_db"], "db"),
           _num(r.get("ch_cosine_min"), "cos"), _num(r.get("ch_snr_db"), "db"), _num(r.get("noise_share"), "pct"),
           _num(r["rel_err"])]
    for label in others:
        o = (r.get("others") or {}).get(label, {})
        row += [_num(o.get("ch_cosine_min"), "cos"), _num(o.get("ch_snr_db"), "db")]
    return row + [status]


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(md_text(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(md_text(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def _md_note(note: Any) -> str:
    text = str(note)
    if text.startswith("WARNING:"):
        return f"- **WARNING:** {md_text(text[len('WARNING:'):].strip())}"
    return f"- {md_text(text)}"


def _stage_has_details(s: Mapping[str, Any]) -> bool:
    return (not s.get("passed", True)) or bool(s.get("notes")) or bool(s.get("layers")) or bool(s.get("nonfinite_source"))


# --- markdown ---------------------------------------------------------------------------------------
def render_markdown(data: Mapping[str, Any]) -> str:
    """``parity.md``: readable in a terminal or a merge request."""
    lines = [f"# Parity report: {_verdict(data.get('passed', True))}", ""]
    if data.get("vacuous_gate"):
        lines += [f"> **WARNING: the parity gate is vacuous.** {md_text(data['vacuous_gate'])}; every stage "
                  "matches such a reference whatever it computes.", ""]
    meta = [(k, data.get(k)) for k in ("model", "target", "data", "reference") if data.get(k)]
    lines += [f"- **{k}**: {md_code(v)}" for k, v in meta]
    lines += ["", f"**{_headline(data)}**", ""]
    lines += [_md_note(n) for n in data.get("notes", [])]
    if data.get("skipped"):
        lines.append(f"- skipped stages: {', '.join(data['skipped'])}")
    lines += ["", "## Stages", ""]
    lines.append(_md_table([c for c, _ in _STAGE_COLUMNS], [_stage_row(s) for s in data.get("stages", [])]))
    for s in data.get("stages", []):
        if not _stage_has_details(s):
            continue
        lines += ["", f"## Stage {md_code(s['stage'])}: {_verdict(s.get('passed', True))}", ""]
        tol = s.get("tolerance") or {}
        if tol:
            lines.append("Tolerance: " + md_text(", ".join(f"{k}={v}" for k, v in tol.items())))
            lines.append("")
        if s.get("checks"):
            lines.append(_md_table(["metric", "value", "limit", "result"],
                                   [[c["metric"], _num(c["value"]), f"{c['op']} {_num(c['limit'])}", _verdict(c["passed"])]
                                    for c in s["checks"]]))
            lines.append("")
        src = s.get("nonfinite_source")
        if src:
            where = src.get("node")
            lines.append(f"First NaN/Inf produced by {md_code(where)} ({md_text(src.get('op_type'))})"
                         + (f" in module {md_code(src['scope'])}" if src.get("scope") and src.get("op_type") != "module" else "")
                         + (f"; non-finite inputs: {', '.join(md_code(x) for x in src['nonfinite_inputs'])}" if src.get("nonfinite_inputs") else ""))
            lines.append("")
        if s.get("layers"):
            summary = s.get("layer_summary") or {}
            first = summary.get("first_divergence") or (s.get("first_divergence") if s.get("layers") else None)
            lines.append(f"### Layers ({len(s['layers'])}, matched by {md_text(summary.get('method', 'scope'))}; "
                         f"budget: {md_text(_budget_text(summary.get('budget', {})))})")
            lines.append("")
            lines.append(f"First divergence: **{md_code(first) if first else 'none'}**"
                         + (f". Worst layers (most noise added): {', '.join(md_code(w) for w in summary.get('worst', []))}"
                            if summary.get("worst") else ""))
            lines.append("")
            others = _layer_others(s)
            lines.append(_md_table(_layer_header(s), [_layer_row(i, r, first, others) for i, r in enumerate(s["layers"])]))
            lines.append("")
        if s.get("notes"):
            lines += [_md_note(n) for n in s["notes"]]
            lines.append("")
        if s.get("artifacts"):
            lines += [f"- artifact {md_code(k)}: {md_code(v)}" for k, v in s["artifacts"].items()]
            lines.append("")
    lines += _data_check_md(data)
    return "\n".join(lines).rstrip() + "\n"


# --- plots ------------------------------------------------------------------------------------------
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
        snr.append(_SNR_PLOT_CAP if v > _SNR_PLOT_CAP else (0.0 if not math.isfinite(v) else v))
    fig = _figure(max(6.0, 1.1 * len(names) + 3), 3.4)
    ax1, ax2 = fig.subplots(1, 2)
    ax1.bar(range(len(names)), rel, color=colors)
    ax1.set_yscale("log")
    ax1.set_ylim(1e-12, 1e2)
    ax1.set_title("max |error| / max |reference|")
    ax2.bar(range(len(names)), snr, color=colors)
    ax2.set_title(f"SNR dB (capped at {int(_SNR_PLOT_CAP)})")
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
    return min(f, _SNR_PLOT_CAP) if f > -math.inf else -10.0


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
    ax.set_ylabel(f"SNR dB (capped at {int(_SNR_PLOT_CAP)})")
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


# --- html -------------------------------------------------------------------------------------------
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:0.6em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3} td:nth-child(2),td:first-child{text-align:left}
.PASS{color:#2e7d32;font-weight:bold} .FAIL{color:#c62828;font-weight:bold}
tr.bad td{background:#fdecea} tr.first td{background:#f9c9c4} tr.worst td{font-weight:bold}
code{background:#f6f6f6;padding:0 3px} img{max-width:100%;border:1px solid #eee;margin:0.5em 0}
"""


def _html_table(header: list[str], rows: list[list[str]], classes: list[str] | None = None) -> str:
    h = "".join(f"<th>{html.escape(c)}</th>" for c in header)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = []
        for c in row:
            cell = html.escape(str(c))
            if c in ("PASS", "FAIL"):
                cell = f'<span class="{c}">{c}</span>'
            cells.append(f"<td>{cell}</td>")
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{h}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _img(b64: str | None, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">' if b64 else ""


def render_html(data: Mapping[str, Any], *, plots: bool = True) -> str:
    """``parity.html``: self-contained (inline CSS, base64 PNG plots)."""
    e = html.escape
    verdict = _verdict(data.get("passed", True))
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Parity report: {verdict}</title>",
             f"<style>{_CSS}</style></head><body>",
             f"<h1>Parity report: <span class='{verdict}'>{verdict}</span></h1>", "<ul>"]
    for k in ("model", "target", "data", "reference"):
        if data.get(k):
            parts.append(f"<li><b>{k}</b>: <code>{e(str(data[k]))}</code></li>")
    parts.append("</ul>")
    if data.get("vacuous_gate"):
        parts.append(f"<p class='FAIL'>WARNING: the parity gate is vacuous. {e(str(data['vacuous_gate']))}</p>")
    parts.append(f"<p><b>{e(_headline(data, code=str, text=str))}</b></p>")
    extra = list(data.get("notes", [])) + ([f"skipped stages: {', '.join(data['skipped'])}"] if data.get("skipped") else [])
    if extra:
        parts.append("<ul>" + "".join(f"<li>{e(str(n))}</li>" for n in extra) + "</ul>")
    stages = data.get("stages", [])
    parts.append("<h2>Stages</h2>")
    parts.append(_html_table([c for c, _ in _STAGE_COLUMNS], [_stage_row(s) for s in stages],
                             ["" if s.get("passed", True) else "bad" for s in stages]))
    if plots:
        parts.append(_img(plot_stage_errors(data), "error per stage"))
        parts.append(_img(plot_layer_snr(data), "per-layer SNR"))
        parts.append(_img(plot_error_histograms(data), "error histograms"))
    for s in stages:
        if not _stage_has_details(s):
            continue
        v = _verdict(s.get("passed", True))
        parts.append(f"<h2>Stage <code>{e(s['stage'])}</code>: <span class='{v}'>{v}</span></h2>")
        tol = s.get("tolerance") or {}
        if tol:
            parts.append("<p>Tolerance: " + e(", ".join(f"{k}={val}" for k, val in tol.items())) + "</p>")
        if s.get("checks"):
            parts.append(_html_table(["metric", "value", "limit", "result"],
                                     [[c["metric"], _num(c["value"]), f"{c['op']} {_num(c['limit'])}", _verdict(c["passed"])]
                                      for c in s["checks"]]))
        src = s.get("nonfinite_source")
        if src:
            parts.append(f"<p>First NaN/Inf produced by <code>{e(str(src.get('node')))}</code> ({e(str(src.get('op_type')))})"
                         + (f", non-finite inputs: {e(', '.join(src['nonfinite_inputs']))}" if src.get("nonfinite_inputs") else "")
                         + "</p>")
        if s.get("layers"):
            summary = s.get("layer_summary") or {}
            first = summary.get("first_divergence")
            parts.append(f"<h3>Layers (matched by {e(str(summary.get('method', 'scope')))}; budget: "
                         f"{e(_budget_text(summary.get('budget', {})))})</h3>")
            parts.append(f"<p>First divergence: <b>{e(first) if first else 'none'}</b>"
                         + (f"; worst layers: {e(', '.join(summary.get('worst', [])))}" if summary.get("worst") else "")
                         + "</p>")
            classes = []
            for r in s["layers"]:
                c = "first" if r["name"] == first else ("bad" if not r.get("passed", True) else "")
                classes.append((c + (" worst" if r.get("flagged") else "")).strip())
            others = _layer_others(s)
            parts.append(_html_table(_layer_header(s), [_layer_row(i, r, first, others) for i, r in enumerate(s["layers"])],
                                     classes))
        if s.get("notes"):
            parts.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in s["notes"]) + "</ul>")
    parts += _data_check_html(data)
    parts.append("</body></html>\n")
    return "\n".join(p for p in parts if p)


# --- calibration and parity data (written by vitexport.calibration.sanity) --------------------------
_DATA_TITLE = "Calibration and parity data"


def _data_check_parts(dc: Mapping[str, Any]) -> tuple[list[str], list[str], list[list[str]]]:
    """(one line per set, the preprocessing included; warnings; table rows: input, statistic, calibration, parity)."""
    sets = []
    for role in ("calibration", "parity"):
        d = dc.get(role) or {}
        pre = (d.get("preprocess") or {}).get("summary")
        how = f"; preprocessing: {pre}" if pre else "; arrays fed as they are" if d.get("kind") == "arrays" else ""
        sets.append(f"{role}: {d.get('source')} ({d.get('samples')} samples){how}")
    if not dc.get("compared", True):
        sets.append(f"not compared: {dc.get('why_not')}")
    c, p = dc.get("calibration") or {}, dc.get("parity") or {}
    fmt = lambda v: ", ".join(_num(x) for x in v) if isinstance(v, list) else _num(v)  # noqa: E731
    rows = []
    for name, cs in (c.get("inputs") or {}).items():
        ps = (p.get("inputs") or {}).get(name) or {}
        for key, label in (("mean", "mean per channel"), ("std", "std per channel"), ("min", "min"), ("max", "max"),
                           ("gray_share", "grayscale share")):
            if cs.get(key) is not None or ps.get(key) is not None:
                rows.append([name, label, fmt(cs.get(key)), fmt(ps.get(key))])
    if c.get("short_side_px") or p.get("short_side_px"):
        rows.append(["", "images' shorter side (median px)", _num(c.get("short_side_px")), _num(p.get("short_side_px"))])
    return sets, list(dc.get("warnings") or []), rows


def _data_check_md(data: Mapping[str, Any]) -> list[str]:
    """The section of ``parity.md`` saying what data went in and how it was preprocessed."""
    dc = data.get("data_check")
    if not dc:
        return []
    sets, warns, rows = _data_check_parts(dc)
    lines = ["", f"## {_DATA_TITLE}", ""] + [f"- {md_text(s)}" for s in sets]
    lines += [f"- **WARNING:** {md_text(w)}" for w in warns]
    if rows:
        lines += ["", _md_table(["input", "statistic", "calibration", "parity"], rows)]
    return lines


def _data_check_html(data: Mapping[str, Any]) -> list[str]:
    """The same section in ``parity.html``."""
    dc = data.get("data_check")
    if not dc:
        return []
    sets, warns, rows = _data_check_parts(dc)
    e = html.escape
    parts = [f"<h2>{_DATA_TITLE}</h2>", "<ul>" + "".join(f"<li>{e(s)}</li>" for s in sets)
             + "".join(f"<li class='FAIL'>WARNING: {e(w)}</li>" for w in warns) + "</ul>"]
    if rows:
        parts.append(_html_table(["input", "statistic", "calibration", "parity"], rows))
    return parts


# --- files ------------------------------------------------------------------------------------------
def _as_dict(run: ParityRun | Mapping[str, Any]) -> dict[str, Any]:
    return run.to_dict() if isinstance(run, ParityRun) else dict(run)


def write_reports(out_dir: str | Path, run: ParityRun | Mapping[str, Any], *, html_plots: bool = True) -> dict[str, Path]:
    """Write ``parity.json``, ``parity.md`` and ``parity.html`` into ``out_dir`` (each atomically).

    Returns:
        file name → path: ``{"parity.json": ..., "parity.md": ..., "parity.html": ...}``.
    """
    out_dir = Path(out_dir)
    data = _as_dict(run)
    paths = {name: out_dir / name for name in (PARITY_JSON, PARITY_MD, PARITY_HTML)}
    atomic_write_json(paths[PARITY_JSON], data)
    atomic_write_text(paths[PARITY_MD], render_markdown(data))
    atomic_write_text(paths[PARITY_HTML], render_html(data, plots=html_plots))
    return paths


def load_run(out_dir: str | Path) -> ParityRun:
    """Read ``OUT_DIR/parity.json`` (or the file itself) into a :class:`ParityRun`.

    Raises:
        BadInput: no such file, or not a parity report.
    """
    p = Path(out_dir)
    if p.is_dir():
        p = p / PARITY_JSON
    if not p.is_file():
        raise BadInput(f"no parity report at {p} (expected the output folder of a finished run)")
    try:
        data = json.loads(p.read_text())
        if not isinstance(data, dict) or "stages" not in data:
            raise ValueError("no 'stages' key")
        return ParityRun.from_dict(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"{p}: not a parity report ({exc})") from None


def render_reports(out_dir: str | Path) -> dict[str, Path]:
    """Re-render ``parity.md`` and ``parity.html`` of a finished run from its ``parity.json``
    (``vitexport parity OUT_DIR``); ``parity.json`` itself is left as it is.

    Returns:
        file name → path, as :func:`write_reports`.
    Raises:
        BadInput: no readable ``parity.json`` in ``out_dir``.
    """
    p = Path(out_dir)
    folder = p if p.is_dir() else p.parent
    load_run(p)  # validates
    data = json.loads((folder / PARITY_JSON).read_text())
    paths = {name: folder / name for name in (PARITY_JSON, PARITY_MD, PARITY_HTML)}
    atomic_write_text(paths[PARITY_MD], render_markdown(data))
    atomic_write_text(paths[PARITY_HTML], render_html(data))
    return paths
