"""Render the peers plan's records (:mod:`bench.casebench`) into ``bench/results.md``.

One table per case, one row per tool: quality on the held-out split (cosine mean / min, top-1
agreement, accuracy), quantize time, peak memory, INT8 ÷ FP32 speed, and vitexport's gate verdict;
then issue 11's done-when, each with its measured figures and a verdict. A cell of a tool that failed
says why (``error: …``, ``exceeded N GB``, ``not run: …``).
"""
from __future__ import annotations

from pathlib import Path

from .cases import CASES
from .plan import CasePlan
from .proc import GB, REPO
from .report import _f4, _fail, _gb, _pct, _s, _short, _x
from .report_dist import render_distribution

__all__ = ["render_cases", "TOOL_TITLES", "tool_row", "speed_lines"]

TOOL_TITLES = {
    "vx": "vitexport (orin defaults)",
    "nncf": "NNCF (TRANSFORMER, PERFORMANCE)",
    "mo_fp16": "ModelOpt int8 (default: FP16 rest)",
    "mo_fp32": "ModelOpt int8 (--high_precision_dtype fp32)",
    "plain": "plain quantize_static (MinMax)",
}
HARD = ("text_encoder", "vit_base_outlier")


class _R:
    """Record access by the peers plan's ids."""

    def __init__(self, records: dict):
        self.r = records

    def rec(self, path: str, case: str, n: int) -> dict | None:
        return self.r.get(f"{path}|{case}|{n}")

    def q(self, path: str, case: str, n: int) -> dict:
        rec = self.r.get(f"q|{path}|{case}|{n}")
        return rec.get("data", {}) if rec and rec.get("ok") else {}

    def quantize_s(self, path: str, case: str, n: int) -> float | None:
        rec = self.rec(path, case, n)
        if not rec or not rec.get("ok"):
            return None
        d = rec.get("data") or {}
        return d.get("stage_seconds", {}).get("quantize_int8") if path == "vx" else d.get("quantize_s")

    def speed(self, path: str, case: str) -> tuple[float | None, str | None]:
        lat = ((self.r.get(f"lat|{case}") or {}).get("data") or {}).get("latency", {})
        f, i = lat.get("fp32", {}), lat.get(path, {})
        if "error" in i:
            return None, "ORT: " + _short(i["error"], 50)
        if f.get("median_ms") and i.get("median_ms"):
            return f["median_ms"] / i["median_ms"], None
        return None, None


def _gate(rec: dict | None) -> str:
    if rec is None:
        return "–"
    if rec.get("ok"):
        g = (rec.get("data") or {}).get("gate_failure")
        return "exit 0" if not g else "**exit 1**: " + _short(g.split(":", 1)[-1], 80)
    return _fail(rec) or "–"


def tool_row(r: _R, path: str, case: str, n: int, speed_of_file: bool = True) -> str:
    """One table row: the tool's figures on one case, or why there are none.

    ``speed_of_file``: the latency run timed this cell's file (the headline's; an extra cell's is not timed).
    """
    rec = r.rec(path, case, n)
    f = _fail(rec)
    title = TOOL_TITLES[path]
    if f:
        return f"| {title} | {f} | | | | | | |"
    q = r.q(path, case, n)
    cos = f"{_f4(q.get('cosine_mean'))} / {_f4(q.get('cosine_min'))}" if q else "not scored"
    top1 = _pct(q.get("top1_agreement")) if "top1_agreement" in q else "–"
    acc = f"{_pct(q.get('accuracy'))}" if "accuracy" in q else "–"
    mem = _gb(rec.get("peak_bytes"))
    if path == "vx":
        st = (rec.get("data") or {}).get("stage_peak_bytes", {}).get("quantize_int8")
        mem += f" (quantize stage {_gb(st)})" if st else ""
    sp, why = r.speed(path, case) if speed_of_file else (None, "not timed")
    speed = why or _x(sp)
    gate = _gate(rec) if path == "vx" else "–"
    load = rec.get("load_before") or [None]
    qt = _s(r.quantize_s(path, case, n)) + (f" (load {load[0]:.1f})" if load[0] is not None else "")
    return f"| {title} | {cos} | {top1} | {acc} | {qt} | {mem} | {speed} | {gate} |"


def _dense_row(r: _R, path: str, case: str, n: int) -> str:
    """A detection / segmentation case's row: task figures vs FP32 and vs the labels (:mod:`bench.dense_case`)."""
    rec = r.rec(path, case, n)
    f = _fail(rec)
    if f:
        return f"| {TOOL_TITLES[path]} | {f} | | | |"
    q = r.q(path, case, n)
    if not q:
        return f"| {TOOL_TITLES[path]} | not scored | | | |"
    gate = _gate(rec) if path == "vx" else "–"
    if CASES[case].kind == "detection":
        return (f"| {TOOL_TITLES[path]} | mAP {_f4(q.get('map_vs_fp32'))} (AP50 {_f4(q.get('ap50_vs_fp32'))}), box IoU "
                f"{_f4(q.get('box_iou_mean'))}, class agreement {_pct(q.get('class_agreement'))} | mAP "
                f"{_f4(q.get('map_labels'))} vs FP32 {_f4(q.get('fp32_map_labels'))} (AP50 {_f4(q.get('ap50_labels'))}) | "
                f"{_f4(q.get('cosine_mean'))} / {_f4(q.get('cosine_min'))} | {gate} |")
    return (f"| {TOOL_TITLES[path]} | mIoU {_f4(q.get('miou_vs_fp32'))}, pixel agreement {_pct(q.get('pixel_agreement'))} | "
            f"mIoU {_f4(q.get('miou_labels'))} vs FP32 {_f4(q.get('fp32_miou_labels'))} | "
            f"{_f4(q.get('cosine_mean'))} / {_f4(q.get('cosine_min'))} | {gate} |")


def _dense_check(r: _R, case: str, n: int) -> str:
    """Issue 29's done-when for a trained dense case: ≤ 0.5 point of mAP / mIoU lost against the labels, ≥ NNCF's."""
    key = "map_labels" if CASES[case].kind == "detection" else "miou_labels"
    v, nn = r.q("vx", case, n), r.q("nncf", case, n)
    if key not in v:
        return f"| {case}: ≤ 0.5 point {key} lost vs FP32, ≥ NNCF's | not scored | – |"
    drop = 100 * (v[f"fp32_{key}"] - v[key])
    ok = drop <= 0.5 + 1e-9 and (key not in nn or v[key] >= nn[key] - 1e-9)
    return (f"| {case}: ≤ 0.5 point {key.split('_')[0]} lost against the labels, ≥ NNCF's | vitexport {_f4(v[key])} vs FP32 "
            f"{_f4(v[f'fp32_{key}'])} ({drop:+.2f} points lost); NNCF {_f4(nn.get(key))} | {_verdict(ok)} |")


def _case_table(r: _R, plan: CasePlan, case: str) -> list[str]:
    n = plan.num_samples
    prep = (r.r.get(f"prep|{case}") or {})
    d = prep.get("data") or {}
    fp32_acc = d.get("fp32_accuracy")
    fq = ((r.r.get(f"q|fp32|{case}") or {}).get("data") or {})
    head = [f"### {CASES[case].title}", ""]
    if not prep.get("ok"):
        return head + [f"preparation failed: {_fail(prep)}", ""]
    head.append(f"{d.get('n_calib')} calibration samples made, {n} given to every tool; vitexport's gate on "
                f"{d.get('n_parity')} parity samples; scored on {d.get('n_score')} held-out samples"
                + (f"; FP32 accuracy {_pct(fp32_acc)}" if fp32_acc is not None else "")
                + (f"; the FP32 ONNX itself scores cosine min {_f4(fq.get('cosine_min'))} vs torch" if fq else "")
                + _margin(d) + ".")
    if CASES[case].kind in ("detection", "segmentation"):
        return head + ["", "| tool | vs FP32 (the gate's figures) | vs the labels | cosine mean / min (logits) | `vitexport export` |",
                       "|---|---|---|---|---|", *[_dense_row(r, p, case, n) for p in plan.paths_of(case)], ""]
    head += ["", "| tool | cosine mean / min | top-1 agreement | accuracy | quantize time | peak memory (whole process) | INT8 ÷ FP32 speed | `vitexport export` |",
             "|---|---|---|---|---|---|---|---|"]
    return head + [tool_row(r, p, case, n) for p in plan.paths] + [""]


def _margin(prep: dict) -> str:
    """How decisive the FP32 top-1 is: a random-weight model's tiny margins make top-1 agreement harsh."""
    import numpy as np

    ref = Path(prep.get("reference", ""))
    if not ref.is_file():
        return ""
    with np.load(ref) as z:
        if "out" not in z.files:  # a dense case: no top-1
            return ""
        logits = z["out"] if "head_w" not in z.files else z["out"] @ z["head_w"].T + z["head_b"]
    if logits.ndim != 2 or logits.shape[1] < 2:
        return ""
    top2 = np.sort(logits, axis=1)[:, -2:]
    margin = np.median((top2[:, 1] - top2[:, 0]) / (logits.std(axis=1) + 1e-12))
    return f"; median FP32 top-1 margin {margin:.2f} logit standard deviations (small: top-1 agreement is a harsh test)" \
        if margin < 1.0 else f"; median FP32 top-1 margin {margin:.1f} logit standard deviations"


def _verdict(ok: bool | None) -> str:
    return "–" if ok is None else ("**met**" if ok else "**not met**")


def _checks(r: _R, plan: CasePlan) -> list[str]:
    """Issue 11's done-when, measured."""
    n = plan.num_samples
    out = ["| requirement | measured | verdict |", "|---|---|---|"]
    for case in (c for c in HARD if c in plan.cases):
        v, nn = r.q("vx", case, n), r.q("nncf", case, n)
        vmin, nmin, vmean = v.get("cosine_min"), nn.get("cosine_min"), v.get("cosine_mean")
        ok = None if vmin is None else (vmin >= 0.99 and (nmin is None or vmin >= nmin) and vmean >= 0.998)
        out.append(f"| {case}: cosine min ≥ 0.99 and ≥ NNCF's, mean ≥ 0.998 | vitexport {_f4(vmin)} / mean {_f4(vmean)}; "
                   f"NNCF min {_f4(nmin)} | {_verdict(ok)} |")
        rec = r.rec("vx", case, n)
        ok = None if rec is None or not rec.get("ok") else not (rec.get("data") or {}).get("gate_failure")
        out.append(f"| {case}: `vitexport export --target orin` exits 0 with defaults | {_gate(rec)} | {_verdict(ok)} |")
    for case in (c for c in plan.cases if CASES[c].trained):
        if CASES[case].kind in ("detection", "segmentation"):
            out.append(_dense_check(r, case, n))
            continue
        q = r.q("vx", case, n)
        if "accuracy" not in q:
            out.append(f"| {case}: top-1 agreement ≥ 99.5 %, accuracy drop ≤ 0.3 points | not scored | – |")
            continue
        drop = 100 * (q["fp32_accuracy"] - q["accuracy"])
        ok = q["top1_agreement"] >= 0.995 and drop <= 0.3 + 1e-9
        change = (f"{drop:.2f} points lost" if drop > 1e-9 else f"{-drop:.2f} points gained" if drop < -1e-9
                  else "no accuracy change")
        out.append(f"| {case}: top-1 agreement ≥ 99.5 %, accuracy drop ≤ 0.3 points | {_pct(q['top1_agreement'])}, "
                   f"{_pct(q['accuracy'])} vs FP32 {_pct(q['fp32_accuracy'])} ({change}) | {_verdict(ok)} |")
    for case, cells in plan.extra.items():
        if case not in plan.cases:
            continue
        for m in sorted({k for _, k in cells}):
            rv = r.rec("vx", case, m)
            if rv is None:
                continue
            fv = _fail(rv)
            peak = None if fv else rv.get("peak_bytes")
            out.append(f"| {case}, {m} calibration samples: whole vitexport process ≤ 2.5 GB | {fv or _gb(peak)} | "
                       f"{_verdict(None if peak is None else peak <= 2.5 * GB)} |")
    for case, m in _speed_cells(plan):
        tv, tn = r.quantize_s("vx", case, m), r.quantize_s("nncf", case, m)
        if r.rec("vx", case, m) is None:
            continue
        ok = None if tv is None or tn is None else tv <= tn
        out.append(f"| {case}, {m} samples: vitexport quantize stage no slower than NNCF's quantize, same run | "
                   f"vitexport {_s(tv)} vs NNCF {_s(tn) if r.rec('nncf', case, m) else 'not run'}"
                   f"{f' (×{tv / tn:.2f})' if tv and tn else ''} | {_verdict(ok)} |")
    return out


def _speed_cells(plan: CasePlan) -> list[tuple[str, int]]:
    """(case, samples) where vitexport and NNCF both quantize (the headline and the larger sets), extra cases first."""
    cells = [(case, m) for case, cs in plan.extra.items() if case in plan.cases
             for m in sorted({plan.num_samples, *(k for p, k in cs if p == "nncf")})]
    return cells


def speed_lines(records: dict, plan: CasePlan) -> list[str]:
    """vitexport's quantize stage beside ``nncf.quantize`` on the same FP32 ONNX and calibration file, same run:
    seconds, ratio, the whole export's seconds, and the load around each (the table ``make bench`` prints)."""
    r = _R(records)
    out = ["| case | samples | vitexport quantize stage | NNCF quantize | ratio (vitexport ÷ NNCF) | vitexport whole export | load (vitexport / NNCF) |",
           "|---|---|---|---|---|---|---|"]
    for case, m in _speed_cells(plan):
        rv, rn = r.rec("vx", case, m), r.rec("nncf", case, m)
        if rv is None and rn is None:
            continue
        tv, tn = r.quantize_s("vx", case, m), r.quantize_s("nncf", case, m)
        whole = ((rv or {}).get("data") or {}).get("seconds") if rv and rv.get("ok") else None
        loads = " / ".join(f"{(rec or {}).get('load_before', [None])[0]:.1f}"
                           if (rec or {}).get("load_before") else "–" for rec in (rv, rn))
        ratio = f"×{tv / tn:.2f}" if tv and tn else "–"
        out.append(f"| {case} | {m} | {_fail(rv) if rv and _fail(rv) else _s(tv)} | "
                   f"{(_fail(rn) if rn and _fail(rn) else _s(tn)) if rn else 'not run'} | {ratio} | {_s(whole)} | {loads} |")
    return out if len(out) > 2 else []


def _extra_table(r: _R, plan: CasePlan) -> list[str]:
    rows = []
    for case, cells in plan.extra.items():
        if case not in plan.cases:
            continue
        for path, m in cells:
            rows.append(tool_row(r, path, case, m, speed_of_file=m == plan.num_samples).replace(f"| {TOOL_TITLES[path]} |", f"| {case} | {m} | {TOOL_TITLES[path]} |", 1))
    if not rows:
        return []
    return ["## Larger calibration sets", "",
            "| case | samples | tool | cosine mean / min | top-1 agreement | accuracy | quantize time | peak memory | INT8 ÷ FP32 speed | `vitexport export` |",
            "|---|---|---|---|---|---|---|---|---|---|", *rows, ""]


def _latency(r: _R, plan: CasePlan) -> list[str]:
    out = ["| case | " + " | ".join(["FP32", *(TOOL_TITLES[p] for p in plan.paths)]) + " |",
           "|---|" + "---|" * (len(plan.paths) + 1)]
    for case in plan.cases:
        lat = ((r.r.get(f"lat|{case}") or {}).get("data") or {}).get("latency", {})
        if not lat:
            continue
        cells = []
        for k in ("fp32", *plan.paths):
            d = lat.get(k, {})
            cells.append("–" if not d else ("ORT cannot run it" if "error" in d else
                                            f"{d['median_ms']:.2f} ms" if d["median_ms"] < 10 else f"{d['median_ms']:.1f} ms"))
        out.append(f"| {case} | " + " | ".join(cells) + " |")
    return out


def _failures(records: dict) -> list[str]:
    out = []
    for rid, rec in records.items():
        if rid.startswith("_") or not isinstance(rec, dict) or rec.get("ok"):
            continue
        out.append(f"- `{rid}`: {_short(rec.get('error') or 'unknown', 300)}" + (f" (log: `{rec['log']}`)" if rec.get("log") else ""))
    return out


def _loads(records: dict, plan: CasePlan) -> list[str]:
    """The 1-minute load average around each case's quantizer runs (recorded since the load was)."""
    out = []
    for case in plan.cases:
        vals = [x for rid, rec in records.items() if isinstance(rec, dict) and rid.split("|")[1:2] == [case]
                and rid.split("|")[0] in TOOL_TITLES for x in (rec.get("load_before", [None])[0], rec.get("load_after", [None])[0])
                if x is not None]
        if vals:
            out.append(f"- {case}: 1-minute load average {min(vals):.1f}–{max(vals):.1f} around its quantizer runs (2 cores)")
    return out


def render_cases(plan: CasePlan, records: dict, info: dict, cap_gb: float) -> str:
    """The whole report of a peers-plan run."""
    r = _R(records)
    v = info.get("versions", {})
    peer_versions = sorted({f"{k} {d['version']}" for k, d in
                            (("NNCF", (records.get(f"nncf|{c}|{plan.num_samples}") or {}).get("data") or {}) for c in plan.cases)
                            if d.get("version")} |
                           {f"ModelOpt {d['version']}" for d in ((records.get(f"mo_fp16|{c}|{plan.num_samples}") or {}).get("data") or {}
                                                                  for c in plan.cases) if d.get("version")})
    lines = [
        f"# vitexport INT8 beside its peers ({plan.name})",
        "",
        f"`make bench{'-quick' if 'quick' in plan.name else ''}` on {info.get('date')}, issue 11's bench: every tool gets "
        "the same FP32 ONNX (vitexport's own parity-passed `model.fp32.onnx`) and the same calibration file "
        f"({plan.num_samples} samples unless a table says otherwise), and is scored on a held-out split that no tool saw "
        "(not for calibration, not for fallback selection, not for gating), Q/DQ evaluated as float "
        "(ONNX Runtime, `session.disable_quant_qdq=1`: TensorRT's arithmetic) against the untouched torch model. "
        f"Peers: {', '.join(peer_versions) or 'see the cells'}.",
        "",
        *render_distribution(records, plan),
        "## Issue 11: done when",
        "",
        *_checks(r, plan),
        "",
        "## Per case",
        "",
        "cosine: per held-out sample, of the INT8 output vs the torch FP32 output (logits; the text encoder: its "
        "pooled embedding). top-1 agreement / accuracy: of the logits (the text encoder: through its trained topic "
        "head, applied outside the ONNX). quantize time (the 1-minute load average when the run started, on 2 cores): vitexport's `quantize_int8` stage (calibration, Q/DQ, "
        "fallback search, its INT8 parity check); NNCF's `nncf.quantize`; ModelOpt's command line `main()`; plain "
        "`quantize_static`. peak memory: `VmHWM` of the process — vitexport's process also loaded torch and "
        "exported the model, the peers' and plain processes only quantized an ONNX file. speed: ONNX Runtime CPU, "
        "2 threads, batch 1, FP32 median ÷ INT8 median (integer kernels, not Q/DQ as float; on a CPU without "
        "VNNI/AMX — see Machine — ONNX Runtime's int8 kernels are often slower than FP32, and ModelOpt's default "
        "FP16 islands run as FP16 kernels or casts on CPU: the speed column says little about TensorRT on Orin). `vitexport export`: "
        "the exit code the command line would give (1: its INT8 parity gate failed; the INT8 file is scored anyway).",
        "",
    ]
    for case in plan.cases:
        if not CASES[case].generated:  # the generated distribution has its own compact tables above
            lines += _case_table(r, plan, case)
    lines += _extra_table(r, plan)
    speed = speed_lines(records, plan)
    if speed:
        lines += ["## Quantize time beside NNCF", "",
                  "Same FP32 ONNX, same calibration file, same run, one after the other: vitexport's `quantize_int8` "
                  "stage (its own seconds: calibration, searches, Q/DQ, the fallback's verdicts; the stage's parity "
                  "gate on the parity data not included) against `nncf.quantize` alone; the whole export (torch "
                  "passes, ONNX export, every stage's parity check) beside it. Ratio below 1: vitexport is faster. "
                  "Load: the 1-minute load average when each run started (2 cores).", "", *speed, ""]
    lines += ["## Latency (median, ms)", "", *_latency(r, plan), "", "## Cases", ""]
    for case in plan.cases:
        d = (records.get(f"prep|{case}") or {}).get("data") or {}
        notes = "; ".join(d.get("notes", [])) or "not prepared"
        uri = str(d.get("uri", "?")).replace(str(REPO) + "/", "")
        lines.append(f"- **{case}** ({CASES[case].title}): `{uri}`; {notes}"
                     + (f"; {d['distinct_top1']} distinct FP32 top-1 classes on the held-out split" if "distinct_top1" in d else ""))
    fails = _failures(records)
    lines += ["", "## Failures", "", *(fails or ["none"]), "", "## Machine", ""]
    lb, la = info.get("load_before"), info.get("load_after")
    fmt = lambda t: " ".join(f"{x:.2f}" for x in t) if t else "–"  # noqa: E731
    loads = _loads(records, plan)
    lines += [
        *loads,
        f"- CPU: {info.get('cpu')} ({info.get('logical_cpus')} logical CPUs; {info.get('cpu_flags')}), {info.get('memory_gb')} GB RAM; "
        f"memory cap per measurement {cap_gb:.1f} GB",
        f"- load average before / after: {fmt(lb)} / {fmt(la)} (a machine shared by several engineers)",
        f"- Python {info.get('python')}; " + ", ".join(f"{k} {x}" for k, x in v.items()),
        f"- commit {info.get('commit')}; the run took {info.get('bench_seconds', 0) / 60:.0f} min",
        *([f"- since then a partial re-run (`--models` / `--paths`) on {lp.get('date')}, commit {lp.get('commit')}, "
           f"{lp.get('bench_seconds', 0) / 60:.0f} min, load {fmt(lp.get('load_before'))} → {fmt(lp.get('load_after'))}"]
          if (lp := info.get("last_partial")) else []),
        "",
    ]
    return "\n".join(lines)
