"""``parity.md``: the report as Markdown, readable in a terminal or a merge request, rendered from the
``parity.json`` dict: the verdict and the summary (each gate against its threshold, where the
artifact runs, INT8 share, op placement, the prediction against the measurement) first, the terms
it uses explained once, then the stage table and each stage's details.
"""
from __future__ import annotations

from typing import Any, Mapping

from .common import (GATE_COLUMNS, _STAGE_COLUMNS, _budget_text, _headline, _layer_header, _layer_others, _layer_row,
                     DATA_TITLE, PROFILE_COLUMNS, PROFILE_TITLE, _num, _stage_has_details, _stage_row, _verdict, data_check_parts,
                     md_code, md_text, overview, profile_rows, terms)
from .task import task_section

__all__ = ["render_markdown"]


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(md_text(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(md_text(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def _md_note(note: Any) -> str:
    text = str(note)
    if text.startswith("WARNING:"):
        return f"- **WARNING:** {md_text(text[len('WARNING:'):].strip())}"
    return f"- {md_text(text)}"


def _summary(data: Mapping[str, Any]) -> list[str]:
    """The gates against their thresholds, the run's facts and notes, then the terms they use."""
    ov = overview(data)
    lines = ["## Summary", ""]
    if ov.gates:
        lines += [_md_table(GATE_COLUMNS, ov.gates), ""]
    lines += [f"- **{md_text(label)}**: {md_text(text)}" for label, text in ov.facts]
    lines += [_md_note(n) for n in data.get("notes", [])]
    if data.get("skipped"):
        lines.append(f"- skipped stages: {', '.join(data['skipped'])}")
    words = terms(data)
    if words:
        lines += ["", "Terms: " + "; ".join(f"**{md_text(t)}**: {md_text(d)}" for t, d in words) + "."]
    return lines + [""]


def _data_check(data: Mapping[str, Any]) -> list[str]:
    """The section of ``parity.md`` saying what data went in and how it was preprocessed."""
    dc = data.get("data_check")
    if not dc:
        return []
    sets, warns, rows = data_check_parts(dc)
    lines = ["", f"## {DATA_TITLE}", ""] + [f"- {md_text(s)}" for s in sets]
    lines += [f"- **WARNING:** {md_text(w)}" for w in warns]
    if rows:
        lines += ["", _md_table(["input", "statistic", "calibration", "parity"], rows)]
    return lines


def _task(data: Mapping[str, Any]) -> list[str]:
    """The task's metrics per stage (a detector's mAP...); nothing for a classifier."""
    sec = task_section(data)
    if sec is None:
        return []
    return [f"## {md_text(sec.title)}", ""] + [f"- {md_text(line)}" for line in sec.lines] + [
        "", _md_table(sec.header, sec.rows), ""]


def render_markdown(data: Mapping[str, Any]) -> str:
    """``parity.md``: readable in a terminal or a merge request."""
    lines = [f"# Parity report: {_verdict(data.get('passed', True))}", ""]
    if data.get("vacuous_gate"):
        lines += [f"> **WARNING: the parity gate is vacuous.** {md_text(data['vacuous_gate'])}; every stage "
                  "matches such a reference whatever it computes.", ""]
    meta = [(k, data.get(k)) for k in ("model", "target", "data", "reference") if data.get(k)]
    lines += [f"- **{k}**: {md_code(v)}" for k, v in meta]
    lines += ["", f"**{_headline(data)}**", ""]
    lines += _summary(data)
    lines += _task(data)
    lines += ["## Stages", ""]
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
        prof = profile_rows(s)
        if prof:
            lines += [f"### {PROFILE_TITLE}", "", _md_table(PROFILE_COLUMNS, prof), ""]
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
    lines += _data_check(data)
    return "\n".join(lines).rstrip() + "\n"
