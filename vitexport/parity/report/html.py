"""``parity.html``: the report as one self-contained page (inline CSS, plots as base64 PNG).

The first screen is the summary: the verdict, each gate's value against its threshold, where the
artifact runs, INT8 share and op placement, the prediction against the measurement, and each
sample's cosine against the gate's threshold; then the terms, the stage table, the other plots and
each stage's details.
"""
from __future__ import annotations

import html
from typing import Any, Mapping

from .common import (GATE_COLUMNS, _STAGE_COLUMNS, _budget_text, _headline, _layer_header, _layer_others, _layer_row,
                     DATA_TITLE, PROFILE_COLUMNS, PROFILE_TITLE, _num, _stage_has_details, _stage_row, _verdict, data_check_parts,
                     overview, profile_rows, terms)
from .plots import plot_error_histograms, plot_layer_snr, plot_sample_cosines, plot_stage_errors
from .task import plot_task, task_section

__all__ = ["render_html"]

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:0.6em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3} td:nth-child(2),td:first-child{text-align:left}
.PASS{color:#2e7d32;font-weight:bold} .FAIL{color:#c62828;font-weight:bold}
tr.bad td{background:#fdecea} tr.first td{background:#f9c9c4} tr.worst td{font-weight:bold}
code{background:#f6f6f6;padding:0 3px} img{max-width:100%;border:1px solid #eee;margin:0.5em 0}
h1{margin:0 0 0.2em} .meta{color:#555;margin:0 0 0.4em;font-size:14px}
.summary{border:1px solid #ddd;border-radius:6px;padding:0.2em 1em;background:#fafafa}
.summary td:nth-child(3){text-align:left} .row{display:flex;flex-wrap:wrap;gap:0 1.5em;align-items:flex-start}
.row ul{flex:1 1 380px;margin:0.4em 0;padding-left:1.1em;font-size:14px} .row li{margin:0.15em 0}
.row img{flex:0 1 620px;max-width:620px} .terms{font-size:13px;color:#444}
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


def _summary(data: Mapping[str, Any], plots: bool) -> list[str]:
    """The first screen: each gate against its threshold; the run's facts and notes beside the cosine
    plot; then the terms."""
    e = html.escape
    ov = overview(data)
    parts = ["<div class='summary'>"]
    if ov.gates:
        parts.append(_html_table(GATE_COLUMNS, ov.gates, ["" if r[-1] == "PASS" else "bad" for r in ov.gates]))
    notes = list(data.get("notes", [])) + ([f"skipped stages: {', '.join(data['skipped'])}"] if data.get("skipped") else [])
    parts.append("<div class='row'><ul>" + "".join(f"<li><b>{e(label)}</b>: {e(text)}</li>" for label, text in ov.facts)
                 + "".join(f"<li>{e(str(n))}</li>" for n in notes) + "</ul>")
    if plots:
        parts.append(_img(plot_sample_cosines(data), "cosine per sample against the gate's threshold"))
    parts.append("</div></div>")
    words = terms(data)
    if words:
        parts.append("<p class='terms'><b>Terms.</b> " + " ".join(f"<b>{e(t)}</b>: {e(d)}." for t, d in words) + "</p>")
    return parts


def _stage_details(s: Mapping[str, Any]) -> list[str]:
    """One stage's section: tolerance, checks, NaN source, layers, notes."""
    e = html.escape
    v = _verdict(s.get("passed", True))
    parts = [f"<h2>Stage <code>{e(s['stage'])}</code>: <span class='{v}'>{v}</span></h2>"]
    tol = s.get("tolerance") or {}
    if tol:
        parts.append("<p>Tolerance: " + e(", ".join(f"{k}={val}" for k, val in tol.items())) + "</p>")
    if s.get("checks"):
        parts.append(_html_table(["metric", "value", "limit", "result"],
                                 [[c["metric"], _num(c["value"]), f"{c['op']} {_num(c['limit'])}", _verdict(c["passed"])]
                                  for c in s["checks"]]))
    prof = profile_rows(s)
    if prof:
        parts += [f"<h3>{e(PROFILE_TITLE)}</h3>", _html_table(PROFILE_COLUMNS, prof)]
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
    return parts


def _data_check(data: Mapping[str, Any]) -> list[str]:
    """The section of ``parity.html`` saying what data went in and how it was preprocessed."""
    dc = data.get("data_check")
    if not dc:
        return []
    sets, warns, rows = data_check_parts(dc)
    e = html.escape
    parts = [f"<h2>{DATA_TITLE}</h2>", "<ul>" + "".join(f"<li>{e(s)}</li>" for s in sets)
             + "".join(f"<li class='FAIL'>WARNING: {e(w)}</li>" for w in warns) + "</ul>"]
    if rows:
        parts.append(_html_table(["input", "statistic", "calibration", "parity"], rows))
    return parts


def _task(data: Mapping[str, Any], plots: bool) -> list[str]:
    """The task's metrics per stage and its picture (boxes, maps, depth error); nothing for a classifier."""
    sec = task_section(data)
    if sec is None:
        return []
    e = html.escape
    parts = [f"<h2>{e(sec.title)}</h2>", "<ul>" + "".join(f"<li>{e(line)}</li>" for line in sec.lines) + "</ul>",
             _html_table(sec.header, sec.rows, ["" if r[-1] == "PASS" else "bad" for r in sec.rows])]
    if plots:
        parts.append(_img(plot_task(data), f"{sec.title}: FP32 against the gated stage"))
    return parts


def render_html(data: Mapping[str, Any], *, plots: bool = True) -> str:
    """``parity.html``: self-contained (inline CSS, base64 PNG plots), the summary on the first screen."""
    e = html.escape
    verdict = _verdict(data.get("passed", True))
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Parity report: {verdict}</title>",
             f"<style>{_CSS}</style></head><body>",
             f"<h1>Parity report: <span class='{verdict}'>{verdict}</span></h1>"]
    meta = [f"<b>{k}</b> <code>{e(str(data[k]))}</code>" for k in ("model", "target", "data", "reference") if data.get(k)]
    parts.append("<p class='meta'>" + " · ".join(meta) + "</p>")
    if data.get("vacuous_gate"):
        parts.append(f"<p class='FAIL'>WARNING: the parity gate is vacuous. {e(str(data['vacuous_gate']))}</p>")
    parts.append(f"<p><b>{e(_headline(data, code=str, text=str))}</b></p>")
    parts += _summary(data, plots)
    parts += _task(data, plots)
    stages = data.get("stages", [])
    parts.append("<h2>Stages</h2>")
    parts.append(_html_table([c for c, _ in _STAGE_COLUMNS], [_stage_row(s) for s in stages],
                             ["" if s.get("passed", True) else "bad" for s in stages]))
    if plots:
        parts.append(_img(plot_stage_errors(data), "error per stage"))
        parts.append(_img(plot_layer_snr(data), "per-layer SNR"))
        parts.append(_img(plot_error_histograms(data), "error histograms"))
    for s in stages:
        if _stage_has_details(s):
            parts += _stage_details(s)
    parts += _data_check(data)
    parts.append("</body></html>\n")
    return "\n".join(p for p in parts if p)
