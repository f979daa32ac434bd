"""What both renderers share: number formatting, the stage and layer tables, the headline, and the
report's *overview*: the facts of its one-screen summary (verdict, each gate against its threshold,
INT8 share, where the artifact runs, op placement, the quantizer's prediction against the gate's
measurement) and the terms it explains, all read from the ``parity.json`` dict.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["md_text", "md_code", "Overview", "overview", "terms", "prediction_sentence", "data_check_parts",
           "DATA_TITLE", "GATE_COLUMNS", "SNR_PLOT_CAP", "PROFILE_COLUMNS", "PROFILE_TITLE", "profile_rows"]

SNR_PLOT_CAP = 140.0


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
    # top-1: every flip counts; gated: flips on near ties excused (what the gate checks; see
    # vitexport.parity.metrics); near ties: samples whose top-1/top-2 margin the error can explain
    ("top-1", "top1_agreement"), ("gated top-1", "top1_agreement_gated"), ("near ties", "top1_near_ties"),
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


PROFILE_TITLE = "Quantize profile (seconds per step; runs: full-model ONNX Runtime runs, one per batch)"
PROFILE_COLUMNS = ["step", "seconds", "runs", "samples"]


def profile_rows(s: Mapping[str, Any]) -> list[list[str]]:
    """The quantizer's profile of a stage (its details' ``quantize.profile``), one row per step, the
    gate's own check last; [] for a stage without one."""
    prof = ((s.get("details") or {}).get("quantize") or {}).get("profile") or {}
    rows = [[name, f"{c['seconds']:.2f}", str(c["runs"]), str(c["samples"])] for name, c in (prof.get("steps") or {}).items()]
    if rows and s.get("parity_seconds"):
        rows.append(["gate (this stage's check)", f"{s['parity_seconds']:.2f}", "", ""])
    if rows:
        rows.append(["total", f"{prof.get('seconds', 0.0) + (s.get('parity_seconds') or 0.0):.2f}", str(prof.get("runs", "")),
                     str(prof.get("samples", ""))])
    return rows


def _stage_has_details(s: Mapping[str, Any]) -> bool:
    return (not s.get("passed", True)) or bool(s.get("notes")) or bool(s.get("layers")) or bool(s.get("nonfinite_source"))


# --- the overview: the one-screen summary's facts -----------------------------------------------------
@dataclass(frozen=True)
class Overview:
    """The facts of a report's summary, rendered by both renderers.

    Attributes:
        verdict: ``PASS`` / ``FAIL``.
        gates: one row per stage: stage, engine, each check's value against its threshold, result.
        facts: (label, sentence): where it runs, INT8 share, attention, op placement, prediction.
    """

    verdict: str
    gates: list[list[str]] = field(default_factory=list)
    facts: list[tuple[str, str]] = field(default_factory=list)


GATE_COLUMNS = ["stage", "engine", "gate: value vs threshold", "result"]
_GATE_NAMES = {"top1_agreement_gated": "gated top-1", "top1_agreement": "top-1", "cosine_min": "cos min",
               "max_abs/ref_scale": "max abs / ref"}


def _stage(data: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    return next((s for s in data.get("stages", []) if s.get("stage") == name), None)


def _details(data: Mapping[str, Any], key: str) -> tuple[Mapping[str, Any] | None, Mapping[str, Any]]:
    """The last stage whose details hold ``key`` (an engine's runtime comes after the file's), and that entry."""
    for s in reversed(data.get("stages", [])):
        d = (s.get("details") or {}).get(key)
        if d:
            return s, d
    return None, {}


def _gate_rows(data: Mapping[str, Any]) -> list[list[str]]:
    """One row per stage: each check's value against its threshold (``cos min 0.995602 >= 0.98``)."""
    rows = []
    for s in data.get("stages", []):
        checks = []
        for c in s.get("checks", []):
            kind = "cos" if str(c["metric"]).startswith("cosine") else "g"
            mark = "" if c.get("passed", True) else " ✗"
            checks.append(f"{_GATE_NAMES.get(c['metric'], c['metric'])} {_num(c['value'], kind)} {c['op']} "
                          f"{_num(c['limit'])}{mark}")
        rows.append([str(s["stage"]), str(s.get("engine", "")), "; ".join(checks) or "–", _verdict(s.get("passed", True))])
    return rows


def _int8_facts(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """INT8 share (the compiled engine's when it reports one, else the written file's) and attention."""
    facts = []
    _, q = _details(data, "quantize")
    engine_stage, runtime = _details(data, "runtime")
    share = runtime.get("int8_share") if runtime else None
    if share is not None:
        facts.append(("INT8 share", f"{_num(share, 'pct')} of GEMM/Conv multiply-accumulates run in INT8, as the "
                                    f"compiled engine reports (stage {engine_stage['stage']})"))
    elif (q.get("precision") or {}).get("int8_gemm_macs_share") is not None:
        facts.append(("INT8 share", f"{_num(q['precision']['int8_gemm_macs_share'], 'pct')} of GEMM/Conv "
                                    "multiply-accumulates run in INT8, as written in the Q/DQ model"))
    att = q.get("attention") or {}
    if att.get("pv"):
        n_float = len(att.get("pv_float") or [])
        facts.append(("attention", f"Q·Kᵀ INT8 in {att['qk_int8']}/{att['qk']} layer(s); attn·V "
                                   + (f"INT8 in all {att['pv']}" if not n_float else
                                      f"float in {n_float}/{att['pv']} ({_num(att.get('pv_float_macs_share'), 'pct')} "
                                      "of quantized MACs)")))
    return facts


def _placement_facts(runtime: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Where the compiled engine placed its ops (an NPU's op table) or its quantized Linears."""
    facts = []
    if runtime.get("ops") is not None and runtime.get("on_npu") is not None:
        cpu = list(runtime.get("on_cpu") or [])
        facts.append(("op placement", f"{runtime['on_npu']} of {runtime['ops']} ops on the NPU, "
                                      + (f"{len(cpu)} on the CPU: {', '.join(cpu[:6])}{' ...' if len(cpu) > 6 else ''}"
                                         if cpu else "none on the CPU")))
        f16 = list(runtime.get("float16_gemms") or [])
        if f16:
            facts.append(("float GEMM/Conv", f"{len(f16)} in float16: {', '.join(f16[:4])}{' ...' if len(f16) > 4 else ''}"))
    if runtime.get("quantized_linears") is not None:
        missing = list(runtime.get("linears_not_int8") or [])
        facts.append(("INT8 kernels", f"{runtime['quantized_linears'] - len(missing)} of {runtime['quantized_linears']} "
                                      "quantized Linears run an integer kernel"
                                      + (f" (not: {', '.join(missing[:3])})" if missing else "")))
    return facts


def prediction_sentence(data: Mapping[str, Any]) -> str | None:
    """The quantizer's predicted lower bound of the INT8 gate's worst cosine against what the gate
    measured, "above" or "below" as the numbers say; None without both."""
    stage, q = _details(data, "quantize")
    pred = ((q.get("parity") or {}).get("prediction") or {}).get("cosine_min")
    measured = ((stage or {}).get("metrics") or {}).get("cosine_min")
    if pred is None or measured is None:
        return None
    n = len(stage.get("sample_cosines") or []) or (q["parity"]["prediction"].get("gate_samples"))
    held = measured >= pred
    return (f"the {stage['stage']} gate measured a worst cosine of {measured:.6f} on {n} parity sample(s), "
            f"{'at or above' if held else 'below'} the quantizer's predicted lower bound {pred:.6f} "
            f"({'the prediction held' if held else 'the prediction missed'})")


def overview(data: Mapping[str, Any]) -> Overview:
    """The summary's facts, read from the ``parity.json`` dict (no target is consulted: the quantize
    stage recorded where the artifact runs in its details)."""
    facts = []
    _, where = _details(data, "target")
    if where.get("runs_on"):
        facts.append(("runs on", str(where["runs_on"])))
    facts += _int8_facts(data)
    facts += _placement_facts(_details(data, "runtime")[1])
    pred = prediction_sentence(data)
    if pred:
        facts.append(("prediction", pred))
    return Overview(_verdict(data.get("passed", True)), _gate_rows(data), facts)


def _has_metric(data: Mapping[str, Any], key: str) -> bool:
    return any((s.get("metrics") or {}).get(key) is not None for s in data.get("stages", []))


def terms(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The report's terms a reader may not know, each explained once, only those the report uses."""
    z = next((s["tolerance"]["top1_margin_z"] for s in data.get("stages", [])
              if (s.get("tolerance") or {}).get("top1_margin_z")), None)
    notes = " ".join(str(n) for s in data.get("stages", []) for n in s.get("notes", []))
    out = []
    if _has_metric(data, "cosine_min"):
        out.append(("cos min", "the worst sample's cosine similarity of the stage's output with the reference's "
                               "(1: the same direction)"))
    if _has_metric(data, "top1_agreement"):
        out.append(("top-1", "the share of samples whose top class is the reference's"))
    if _has_metric(data, "top1_agreement_gated"):
        out.append(("gated top-1", "top-1 with flips on near ties excused: what the gate checks"))
        out.append(("near ties", "samples whose reference margin (top-1 minus top-2 logit) is at most "
                                 + (f"{_num(z)}·√2·σ" if z else "a few σ") + ", σ the sample's RMS output error: "
                                 "a flip there is within the error the cosine gate allows"))
    if "attn·V" in notes:
        out.append(("attn·V", "attention's second batched MatMul, the Softmax probabilities times V "
                              "(Q·Kᵀ, the scores, is the first)"))
    if any(label == "INT8 share" for label, _ in overview(data).facts) or "INT8 share" in notes:
        out.append(("INT8 share", "the share of the GEMM/Conv multiply-accumulates (nearly all of a ViT's "
                                  "arithmetic) that run in INT8"))
    return out


# --- calibration and parity data (written by vitexport.calibration.sanity) --------------------------
DATA_TITLE = "Calibration and parity data"


def data_check_parts(dc: Mapping[str, Any]) -> tuple[list[str], list[str], list[list[str]]]:
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
