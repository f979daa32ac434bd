"""Render the bench records into ``bench/results.md``: a headline table, then the detail tables.

Every vitexport figure stands beside the plain path's and their ratio, always vitexport ÷ plain (so
for memory, time and size below 1 favours vitexport; for quality and speed-up above 1 does). A
measurement that failed shows as ``error: <one line>``; one killed by the memory cap as ``exceeded N GB``.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from .models import MODELS
from .plan import Plan
from .proc import GB, REPO

__all__ = ["render", "machine_info", "headline_rows"]


def machine_info() -> dict:
    """CPU, cores, memory, load, library versions, commit and date (read without importing torch)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        have = {f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f" {f}" in text}
        flags = ", ".join(sorted(have)) or "none of avx2/avx512/vnni"
    except OSError:
        pass
    import psutil

    versions = {}
    for pkg in ("vitexport", "torch", "timm", "onnx", "onnxruntime", "onnxsim", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = "not installed"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "vitexport"], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        commit = commit + (" (vitexport/ has uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu, "cpu_flags": flags, "logical_cpus": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / GB, 1), "python": platform.python_version(),
        "versions": versions, "commit": commit, "load_before": os.getloadavg(),
    }


# --- formatting ------------------------------------------------------------------------------------

def _short(text: str, n: int = 70) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= n else text[: n - 1] + "…"


def _fail(rec: dict | None) -> str | None:
    """The cell text of a failed record, or None if it succeeded."""
    if rec is None:
        return "not run"
    if rec.get("ok"):
        return None
    if rec.get("exceeded_cap"):
        cap = rec.get("cap_bytes", 0) / GB
        return f"exceeded {cap:.1f} GB" + (" (not run: fewer samples already did)" if rec.get("skipped") else "")
    return "error: " + _short(rec.get("error") or "unknown")


def _tag(rec: dict | None) -> str | None:
    """A failure as a short tag for the side-by-side cells (the full line is under Failures)."""
    f = _fail(rec)
    if f is None or f == "not run":
        return f
    if rec.get("exceeded_cap"):
        return "killed: memory"
    return "timed out" if "timed out" in f else "error"


def _mem_pair(rv: dict | None, rp: dict | None) -> str:
    """Peak memory side by side; a run killed at the cap reads ">cap", and the ratio becomes a bound."""
    def side(rec: dict | None) -> tuple[str, float | None, bool]:
        if rec is not None and rec.get("exceeded_cap"):
            cap = rec.get("cap_bytes", 0)
            return f">{cap / GB:.1f} GB", float(cap), True
        f = _tag(rec)
        return (f, None, False) if f else (_gb(rec["peak_bytes"]), float(rec["peak_bytes"]), False)

    (ta, a, ka), (tb, b, kb) = side(rv), side(rp)
    if a is None or b is None or (ka and kb):
        return f"{ta} / {tb}"
    r = a / b
    bound = "<" if kb else (">" if ka else "")
    return f"{ta} / {tb} ({bound}{r:.2f}×)"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "–"
    return f"{a / b:.2f}×"


def _pair(a: float | None, b: float | None, fmt, fa: str | None = None, fb: str | None = None) -> str:
    """``vitexport / plain (ratio)`` with either side possibly a failure text."""
    sa = fa if fa else (fmt(a) if a is not None else "–")
    sb = fb if fb else (fmt(b) if b is not None else "–")
    r = _ratio(a, b) if not fa and not fb else ""
    return f"{sa} / {sb}" + (f" ({r})" if r and r != "–" else "")


def _gb(b: float | None) -> str:
    return "–" if b is None else f"{b / GB:.2f} GB"


def _s(x: float | None) -> str:
    return "–" if x is None else (f"{x:.1f} s" if x < 100 else f"{x:.0f} s")


def _ms(x: float | None) -> str:
    return "–" if x is None else (f"{x:.2f} ms" if x < 10 else f"{x:.1f} ms")


def _mb(b: float | None) -> str:
    return "–" if b is None else f"{b / 1e6:.1f} MB"


def _f4(x: float | None) -> str:
    return "–" if x is None else f"{x:.4f}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def _x(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


class _View:
    """Read access to the records with the bench's id scheme."""

    def __init__(self, records: dict, plan: Plan):
        self.r, self.plan = records, plan

    def get(self, rid: str) -> dict | None:
        return self.r.get(rid)

    def data(self, rid: str) -> dict:
        rec = self.r.get(rid)
        return rec.get("data", {}) if rec and rec.get("ok") else {}

    def run_id(self, path: str, model: str, method: str, n: int | None = None, target: str = "orin") -> str:
        n = self.plan.num_samples if n is None else n
        return f"vx|{model}|{target}|{method}|{n}" if path == "vx" else f"plain|{model}|{method}|{n}"

    def run(self, path: str, model: str, method: str, n: int | None = None) -> dict | None:
        """A run record: usable when the INT8 model came out (a vitexport gate failure included)."""
        return self.r.get(self.run_id(path, model, method, n))

    def quality(self, path: str, model: str, method: str, target: str = "orin") -> dict:
        return self.data("q|" + self.run_id(path, model, method, target=target))

    def latency(self, path: str, model: str, method: str | None, target: str = "orin") -> dict:
        """Latency stats of one file of the model's interleaved latency run (empty if not measured)."""
        if method is None:
            label = f"{path}|fp32"
        else:
            label = f"vx|{target}|{method}" if path == "vx" else f"plain|{method}"
        return self.data(f"lat|{model}").get("latency", {}).get(label, {})

    def speedup(self, path: str, model: str, method: str, target: str = "orin", stat: str = "median_ms") -> float | None:
        """FP32 time ÷ INT8 time of one path (``stat``: ``median_ms``, or ``p10_ms`` for the quiet moments)."""
        f, i = self.latency(path, model, None).get(stat), self.latency(path, model, method, target).get(stat)
        return f / i if f and i else None


# --- tables ----------------------------------------------------------------------------------------

def headline_rows(v: _View) -> list[str]:
    """Per model and method: quality, agreement, calibration peak, INT8 speed-up, wall time."""
    out = [
        "| model | method | INT8 quality¹ | top-1 agreement | peak memory² | INT8 ÷ FP32 speed | pipeline wall time |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in v.plan.models:
        spec = MODELS[model]
        for method in v.plan.methods:
            rv, rp = v.run("vx", model, method), v.run("plain", model, method)
            fv, fp = _tag(rv), _tag(rp)
            qv, qp = v.quality("vx", model, method), v.quality("plain", model, method)
            if spec.is_demo:
                quality = _pair(qv.get("accuracy"), qp.get("accuracy"), _pct, fv, fp)
            else:
                quality = _pair(qv.get("cosine_mean"), qp.get("cosine_mean"), _f4, fv, fp)
            top1 = _pair(qv.get("top1_agreement"), qp.get("top1_agreement"), _pct, fv, fp)
            mem = _mem_pair(rv, rp)
            speed = _pair(v.speedup("vx", model, method), v.speedup("plain", model, method), _x, fv, fp)
            wall = _pair((rv or {}).get("wall_s") if not fv else None, (rp or {}).get("wall_s") if not fp else None, _s, fv, fp)
            gate = " †" if (rv or {}).get("data", {}).get("gate_failure") else ""
            out.append(f"| {spec.title} | {method}{gate} | {quality} | {top1} | {mem} | {speed} | {wall} |")
    return out


def _quality_table(v: _View) -> list[str]:
    out = ["| model | method | path | cosine mean | cosine min | top-1 agreement | accuracy (FP32) | parity gate |",
           "|---|---|---|---|---|---|---|---|"]
    for model in v.plan.models:
        spec = MODELS[model]
        targets = [("vx", "orin")] + ([("vx", "cpu")] if v.plan.cpu_target and not spec.is_demo else []) + [("plain", "")]
        for method in v.plan.methods:
            for path, target in targets:
                rid = v.run_id(path, model, method, target=target or "orin")
                rec = v.get(rid)
                if target == "cpu" and rec is None:
                    continue
                name = "vitexport" + (f" ({target})" if path == "vx" else "") if path == "vx" else "plain"
                f = _fail(rec)
                if f:
                    out.append(f"| {spec.title} | {method} | {name} | {f} | | | | |")
                    continue
                q = v.data("q|" + rid)
                acc = f"{_pct(q.get('accuracy'))} ({_pct(q.get('fp32_accuracy'))})" if "accuracy" in q else "–"
                gate = rec.get("data", {}).get("gate_failure")
                gate_txt = ("failed: " + _short(gate.split(":", 1)[-1], 60)) if gate else ("passed" if path == "vx" else "none")
                out.append(f"| {spec.title} | {method} | {name} | {_f4(q.get('cosine_mean'))} | {_f4(q.get('cosine_min'))} | "
                           f"{_pct(q.get('top1_agreement'))} | {acc} | {gate_txt} |")
    return out


def _latency_table(v: _View) -> list[str]:
    out = ["| model | INT8 of | vitexport FP32 | plain FP32 | vitexport INT8 | plain INT8 | INT8 ratio | vitexport speed-up median (p10) | plain speed-up median (p10) | INT8 size vitexport / plain | FP32 size vitexport / plain |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model in v.plan.models:
        spec = MODELS[model]
        fv, fp = v.latency("vx", model, None), v.latency("plain", model, None)
        rows = [(m, "orin") for m in v.plan.methods]
        if v.plan.cpu_target and not spec.is_demo:
            rows.append(("percentile" if "percentile" in v.plan.methods else v.plan.methods[0], "cpu"))
        for method, target in rows:
            iv = v.latency("vx", model, method, target)
            ip = v.latency("plain", model, method) if target == "orin" else {}
            if target == "cpu" and not iv:
                rec = v.get(v.run_id("vx", model, method, target="cpu"))
                if rec is None:
                    continue
            label = f"{method}" + (" (vitexport cpu recipe)" if target == "cpu" else "")

            def cell(d: dict) -> str:
                if not d:
                    return "–"
                return f"{_ms(d['median_ms'])} ({_ms(d['p10_ms'])}–{_ms(d['p90_ms'])})"

            sv = f"{_x(v.speedup('vx', model, method, target))} ({_x(v.speedup('vx', model, method, target, 'p10_ms'))})"
            sp = (f"{_x(v.speedup('plain', model, method))} ({_x(v.speedup('plain', model, method, stat='p10_ms'))})"
                  if target == "orin" else "–")
            out.append(
                f"| {spec.title} | {label} | {cell(fv)} | {cell(fp)} | {cell(iv)} | {cell(ip)} | "
                f"{_ratio(iv.get('median_ms'), ip.get('median_ms'))} | {sv} | {sp} | "
                f"{_mb(iv.get('bytes'))} / {_mb(ip.get('bytes'))} ({_ratio(iv.get('bytes'), ip.get('bytes'))}) | "
                f"{_mb(fv.get('bytes'))} / {_mb(fp.get('bytes'))} ({_ratio(fv.get('bytes'), fp.get('bytes'))}) |"
            )
    return out


def _wall_table(v: _View) -> list[str]:
    out = ["| model | method | whole pipeline vitexport / plain | export (+ simplify) vitexport / plain torch.onnx.export | quantize vitexport / plain |",
           "|---|---|---|---|---|"]
    for model in v.plan.models:
        spec = MODELS[model]
        for method in v.plan.methods:
            rv, rp = v.run("vx", model, method), v.run("plain", model, method)
            fv, fp = _tag(rv), _tag(rp)
            dv, dp = (rv or {}).get("data", {}), (rp or {}).get("data", {})
            st = dv.get("stage_seconds", {})
            exp_v = (st.get("export_onnx", 0) + st.get("simplify", 0)) if "export_onnx" in st else None
            q_v = st.get("quantize_int8")
            out.append(
                f"| {spec.title} | {method} | {_pair(None if fv else rv.get('wall_s'), None if fp else rp.get('wall_s'), _s, fv, fp)} | "
                f"{_pair(exp_v, dp.get('export_s'), _s, fv, fp)} | {_pair(q_v, dp.get('quantize_s'), _s, fv, fp)} |"
            )
    return out


def _memory_table(v: _View) -> list[str]:
    cells: dict[tuple[str, str, int], None] = {}
    for model in v.plan.models:
        for method in v.plan.methods:
            cells[(model, method, v.plan.num_samples)] = None
        for c in v.plan.grid.get(model, ()):
            cells[(model, c.method, c.num_samples)] = None
    out = ["| model | method | samples | vitexport peak | plain peak | ratio | vitexport calibration stage peak³ |",
           "|---|---|---|---|---|---|---|"]
    for model, method, n in sorted(cells, key=lambda k: (v.plan.models.index(k[0]), k[2], k[1])):
        rv = v.get(v.run_id("vx", model, method, n))
        rp = v.get(v.run_id("plain", model, method, n)) if method != "mse" else {"ok": False, "error": "n/a"}
        # A cell the plan did not ask for on one side reads "–", not "not run".
        fv = "–" if rv is None else _fail(rv)
        fp = "–" if rp is None else _fail(rp)
        if method == "mse":
            fp = "n/a (ONNX Runtime has no MSE calibrator)"
        a = None if fv else rv.get("peak_bytes")
        b = None if fp else rp.get("peak_bytes")
        st = None if fv else (rv.get("data") or {}).get("stage_peak_bytes", {}).get("quantize_int8")
        out.append(f"| {MODELS[model].title} | {method} | {n} | {fv or _gb(a)} | {fp or _gb(b)} | {_ratio(a, b)} | {_gb(st) if st else '–'} |")
    return out


def _checks(v: _View) -> list[str]:
    """The figures other issues set as requirements, each with its verdict."""
    out = ["| requirement | measured | verdict |", "|---|---|---|"]

    def verdict(ok: bool | None) -> str:
        return "–" if ok is None else ("**met**" if ok else "**not met**")

    if "vit_base" in v.plan.models:
        m0 = v.plan.methods[0]
        dv, dp = v.data(v.run_id("vx", "vit_base", m0)), v.data(v.run_id("plain", "vit_base", m0))
        st = dv.get("stage_seconds", {})
        ev = (st.get("export_onnx", 0) + st.get("simplify", 0)) if "export_onnx" in st else None
        ep = dp.get("export_s")
        r = ev / ep if ev is not None and ep else None
        out.append(f"| ViT-B/16 export + simplify ≤ 1.5× plain `torch.onnx.export` | {_s(ev)} vs {_s(ep)} = {_x(r)} | {verdict(None if r is None else r <= 1.5)} |")
        for method in v.plan.methods:
            sp = v.speedup("vx", "vit_base", method)
            out.append(f"| ViT-B/16 INT8 ≥ 2.5× faster than FP32 (ORT, 2 threads, batch 1), {method}, orin recipe | {_x(sp)} | {verdict(None if sp is None else sp >= 2.5)} |")
        if v.plan.cpu_target:
            sp = v.speedup("vx", "vit_base", "percentile", "cpu")
            out.append(f"| … same, vitexport cpu recipe | {_x(sp)} | {verdict(None if sp is None else sp >= 2.5)} |")
        peaks = []
        for method in ("minmax", "percentile", "entropy", "mse"):
            rec = v.get(v.run_id("vx", "vit_base", method, 256))
            if rec is not None:
                peaks.append((method, None if _fail(rec) else rec.get("peak_bytes"), _fail(rec)))
        if peaks:
            txt = ", ".join(f"{m} {f or _gb(p)}" for m, p, f in peaks)
            ok = all(p is not None and p < 2.5 * GB for _, p, _ in peaks)
            out.append(f"| ViT-B/16, 256 calibration images: whole process < 2.5 GB, every method | {txt} | {verdict(ok)} |")
            stage = [(m, v.data(v.run_id("vx", "vit_base", m, 256)).get("stage_peak_bytes", {}).get("quantize_int8")) for m, _, f in peaks if not f]
            if stage:
                txt = ", ".join(f"{m} {_gb(p)}" for m, p in stage)
                ok = all(p is not None and p < 2.5 * GB for _, p in stage) and len(stage) == len(peaks)
                out.append(f"| … the calibration stage alone (calibrate, quantize, INT8 parity) < 2.5 GB | {txt} | {verdict(ok)} |")
    if "vit_tiny" in v.plan.models:
        for method in v.plan.methods:
            sp = v.speedup("vx", "vit_tiny", method)
            out.append(f"| ViT-Tiny INT8 faster than FP32, {method}, orin recipe | {_x(sp)} | {verdict(None if sp is None else sp > 1.0)} |")
        if v.plan.cpu_target:
            sp = v.speedup("vx", "vit_tiny", "percentile", "cpu")
            out.append(f"| … same, vitexport cpu recipe | {_x(sp)} | {verdict(None if sp is None else sp > 1.0)} |")
    return out


def _failures(records: dict) -> list[str]:
    out = []
    for rid, rec in records.items():
        if rid.startswith("_") or rec.get("ok") or rec.get("skipped"):
            continue
        out.append(f"- `{rid}`: {_short(rec.get('error') or 'unknown', 300)} (log: `{rec.get('log', '–')}`)")
    return out


def render(plan: Plan, records: dict, info: dict, cap_gb: float) -> str:
    """The whole ``results.md``."""
    v = _View(records, plan)
    n = plan.num_samples
    lines = [
        f"# vitexport benchmark ({plan.name})",
        "",
        f"`make bench{'-quick' if plan.name == 'quick' else ''}` on {info.get('date')}: vitexport "
        "(`vitexport.api.export`, `orin` recipe) against the plain path (`torch.onnx.export(opset_version=17, dynamo=False)` "
        "+ `onnxruntime.quantization.quantize_static`, QDQ, per-channel int8 weights, int8 activations) on the same "
        f"models, weights and data; {n} calibration samples unless a table says otherwise.",
        "",
        "## Headline",
        "",
        "Each cell: **vitexport / plain (vitexport ÷ plain)**; \"error\" and \"timed out\" are spelled out under Failures.",
        "",
        *headline_rows(v),
        "",
        "¹ cosine of INT8 vs the torch FP32 logits on held-out inputs (mean over samples); the demo: held-out accuracy. "
        "² peak resident memory of the whole process that exported and calibrated (`VmHWM`). "
        "† vitexport's own INT8 parity gate failed on this model; the INT8 model it wrote is measured anyway. "
        "Random-weight timm models have small logit margins, so their top-1 agreement is a harsher test than a trained model's.",
        "",
        "## Requirements measured here",
        "",
        *_checks(v),
        "",
        "## INT8 quality",
        "",
        *_quality_table(v),
        "",
        "## Latency and model size",
        "",
        "ONNX Runtime CPU, `intra_op_num_threads=2`, sequential, batch 1; median (10th–90th percentile) of "
        f"{', '.join(f'{MODELS[m].title} {plan.runs(m)}' for m in plan.models)} timed runs after {plan.warmup} warm-up runs. "
        "All ONNX files of one network are timed in one process, round-robin in blocks (per round, each file gets one "
        "untimed run, then up to 5 timed runs), so load on a shared machine hits FP32 and INT8, vitexport and plain "
        "alike, while each file runs from warm caches as a deployed model does (timed one run each per round, the "
        "files evicted each other from the last-level cache: ViT-B/16 INT8 85 ms alone, 130–150 ms interleaved). vitexport's FP32 is its simplified "
        "`model.fp32.onnx`, the plain path's is the raw export. INT8 ratio: vitexport INT8 time ÷ plain INT8 time "
        "(below 1: vitexport's is faster); speed-up: FP32 time ÷ INT8 time of the same path, from the medians and, in "
        "parentheses, from the 10th percentiles: on a loaded machine ONNX Runtime's spinning thread pool is often "
        "descheduled, and the fastest decile is the better estimate of an idle machine.",
        "",
        *_latency_table(v),
        "",
        "## Wall time",
        "",
        "Whole pipeline: the child process from start to exit (imports included); vitexport's includes its parity "
        "checks after every stage. Stage times come from vitexport's manifest and the plain script's own timers.",
        "",
        *_wall_table(v),
        "",
        "## Calibration peak memory",
        "",
        f"Peak resident memory of the process that exported and calibrated. A plain-path run is killed above {cap_gb:.1f} GB "
        "(a watchdog samples every 100 ms), shown as \"exceeded\".",
        "",
        *_memory_table(v),
        "",
        "³ vitexport's `quantize_int8` stage alone (equalisation statistics, calibration, Q/DQ conversion, its parity "
        "check): the process's high-water mark reset at the stage's start (`vitexport.memory`). The whole-process "
        "figure peaks earlier, in `torch.onnx.export`, and includes the torch wheel's CUDA libraries (~0.3 GB resident "
        "on a machine without a GPU).",
        "",
        "## How it was measured",
        "",
        "- Every measurement (data preparation, each export + calibration, each quality check, each latency run) is its own "
        "child process (`python -m bench.worker`), so each peak is that measurement's alone.",
        "- Both paths get the same weights (`.safetensors`) and the same calibration samples (the plain path draws the "
        "same seeded subset vitexport draws from the `.npz`), fed one sample at a time to `quantize_static`.",
        "- Plain path: MinMax, Percentile (ONNX Runtime's default 99.999) and Entropy calibrators, "
        "`QuantFormat.QDQ`, `per_channel=True`, `QInt8` activations and weights, no `quant_pre_process`. "
        "vitexport: `calibration.method` / `calibration.num_samples` overridden, everything else from the `orin` recipe "
        "(percentile 99.99, equalisation on, float fallback on); the `cpu` recipe is measured for latency as well.",
        "- timm models carry random weights (timm's init, no download); their data is synthetic smooth multi-scale "
        "noise normalised with the model's mean/std. The outlier ViT-Tiny plants ×50–100 channels in the residual stream "
        "and in the LayerNorm affine (compensated in the next Linear), as trained ViTs grow them. The demo uses its "
        "committed digits splits.",
        "",
        "Models:",
        "",
    ]
    for model in plan.models:
        d = v.data(f"prepare|{model}")
        facts = [*(d.get("notes") or [])]
        if d:
            facts.append(f"{d.get('distinct_top1')} distinct FP32 top-1 classes over {d.get('n_heldout')} held-out inputs")
        lines.append(f"- {MODELS[model].title}: " + ("; ".join(facts) if facts else (_fail(v.get(f'prepare|{model}')) or "–")))
    fails = _failures(records)
    if fails:
        lines += ["", "## Failures", "", *fails]
    ver = info.get("versions", {})
    total = info.get("bench_seconds")
    lines += [
        "",
        "## Machine",
        "",
        f"- CPU: {info.get('cpu')} ({info.get('logical_cpus')} logical CPUs; {info.get('cpu_flags')}), {info.get('memory_gb')} GB RAM",
        f"- load average before / after: {_load(info.get('load_before'))} / {_load(info.get('load_after'))} "
        "(a shared machine: latency figures carry that noise)",
        f"- Python {info.get('python')}; " + ", ".join(f"{k} {val}" for k, val in ver.items()),
        f"- commit {info.get('commit')}; date {info.get('date')}" + (f"; the bench took {total / 60:.1f} min" if total else ""),
        "",
    ]
    return "\n".join(lines)


def _load(x) -> str:
    return "–" if not x else " ".join(f"{float(a):.2f}" for a in x)
