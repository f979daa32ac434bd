"""Issue 19's part of ``bench/results.md``: the generated distribution in its two halves, the trained
models, the fallback's predicted worst case beside the gate's measurement, and the issue's done-when.

The even seeds are the tuning half (what the techniques and the tail margin were chosen on); the odd
seeds are the held-out half, never looked at while tuning: their figures are the ones that count.
"""
from __future__ import annotations

import statistics

from .cases import CASES
from .gen import draw, is_held_out
from .plan import CasePlan
from .report import _f4, _pct

__all__ = ["render_distribution", "prediction_pairs"]

TOOLS = (("vx", "vitexport"), ("nncf", "NNCF"), ("plain", "plain"))


def _q(records: dict, path: str, case: str, n: int) -> dict:
    rec = records.get(f"q|{path}|{case}|{n}") or {}
    return rec.get("data") or {} if rec.get("ok") else {}


def _vx(records: dict, case: str, n: int) -> dict:
    rec = records.get(f"vx|{case}|{n}") or {}
    return rec.get("data") or {} if rec.get("ok") else {}


def _exit(d: dict) -> str:
    return "–" if not d else ("exit 0" if not d.get("gate_failure") else "**exit 1**")


def prediction_pairs(records: dict, plan: CasePlan) -> list[tuple[str, float, float, float | None]]:
    """(case, predicted worst cosine over the gate's samples, the gate's measured worst cosine, the score
    split's worst cosine) for every case whose vitexport run recorded both."""
    out = []
    for case in plan.cases:
        d = _vx(records, case, plan.num_samples)
        p, m = d.get("predicted") or {}, d.get("gate_measured") or {}
        if p.get("cosine_min") is not None and m.get("cosine_min") is not None:
            out.append((case, p["cosine_min"], m["cosine_min"], _q(records, "vx", case, plan.num_samples).get("cosine_min")))
    return out


def _spec_line(case: str) -> str:
    s = draw(CASES[case].seed)
    extra = ", ".join(x for x in (f"{s.res_channels} residual ch" if s.res_channels else "",
                                  f"{s.sinks} sink tok ±{s.sink_value:.0f}" if s.sinks else "") if x)
    return (f"ViT-{s.width} d{s.depth} {s.img}px {s.norm}-LN {s.act}, {s.outliers} {s.ln_channels}ch ×{s.factor:.0f} "
            f"(bias {s.bias_shift:.2f}·f){', ' + extra if extra else ''}, {s.images}")


def _row(records: dict, case: str, n: int) -> str:
    cells = []
    for path, _ in TOOLS:
        q = _q(records, path, case, n)
        cells.append(f"{_f4(q.get('cosine_mean'))} / {_f4(q.get('cosine_min'))}" if q else "–")
    d = _vx(records, case, n)
    p, m = (d.get("predicted") or {}), (d.get("gate_measured") or {})
    q = _q(records, "vx", case, n)
    att = d.get("attention") or {}
    fb = (f"{len(d.get('float_nodes') or [])} float" + (f", attn·V float {len(att.get('pv_float', []))}/{att.get('pv')}"
                                                        if att.get("pv_float") else "")) if d else "–"
    return (f"| {case} | {_spec_line(case)} | " + " | ".join(cells) + f" | {_pct(q.get('top1_agreement'))} | "
            f"{_f4(p.get('cosine_min'))} / {_f4(m.get('cosine_min'))} | {fb} | {_exit(d)} |")


def _summary(records: dict, cases: list[str], n: int) -> list[str]:
    out = []
    for path, name in TOOLS:
        mins = [q["cosine_min"] for c in cases if (q := _q(records, path, c, n)).get("cosine_min") is not None]
        means = [q["cosine_mean"] for c in cases if (q := _q(records, path, c, n)).get("cosine_mean") is not None]
        if mins:
            out.append(f"| {name} | {len(mins)} | {statistics.median(mins):.4f} | {min(mins):.4f} | "
                       f"{statistics.median(means):.4f} | {min(means):.4f} |")
    return out


def _half(records: dict, plan: CasePlan, held: bool) -> list[str]:
    n = plan.num_samples
    cases = [c for c in plan.cases if CASES[c].generated and is_held_out(CASES[c].seed) == held]
    title = "held-out half (odd seeds: the figures that count)" if held else "tuning half (even seeds)"
    if not cases:
        return []
    return [f"### {title}", "",
            "| tool | cases | median of cosine min | worst cosine min | median of cosine mean | worst cosine mean |",
            "|---|---|---|---|---|---|", *_summary(records, cases, n), "",
            "| case | drawn | vitexport mean / min | NNCF mean / min | plain mean / min | vitexport top-1 | "
            "predicted / gate-measured worst | fallback | `vitexport export` |",
            "|---|---|---|---|---|---|---|---|---|", *(_row(records, c, n) for c in cases), ""]


def _done(records: dict, plan: CasePlan) -> list[str]:
    """Issue 19's done-when, measured."""
    n = plan.num_samples
    counted = [c for c in plan.cases if CASES[c].held_out]
    out = ["| requirement | measured | verdict |", "|---|---|---|"]
    bad = []
    for c in counted:
        v, nn, d = _q(records, "vx", c, n), _q(records, "nncf", c, n), _vx(records, c, n)
        ok = (v.get("cosine_min", 0) >= 0.99 and v.get("cosine_mean", 0) >= 0.998 and d and not d.get("gate_failure")
              and (not nn or v.get("cosine_min", 0) >= nn.get("cosine_min", -1)))
        if not ok:
            bad.append(f"{c} (vitexport {_f4(v.get('cosine_min'))} / {_f4(v.get('cosine_mean'))}, NNCF min "
                       f"{_f4(nn.get('cosine_min'))}, {_exit(d)})")
    out.append(f"| held-out seeds and trained models ({len(counted)} cases): cosine min ≥ 0.99 and ≥ NNCF's, mean ≥ 0.998, "
               f"`vitexport export --target orin` exit 0 | {'all' if not bad else 'misses: ' + '; '.join(bad)} | "
               f"{'**met**' if counted and not bad else '**not met**'} |")
    pairs = prediction_pairs(records, plan)
    under = sum(1 for _, p, m, _ in pairs if p <= m + 1e-12)
    share = under / len(pairs) if pairs else 0.0
    out.append(f"| the fallback's predicted worst case ≤ the gate's measured one on ≥ 95 % of bench cases | {under}/{len(pairs)} "
               f"({share:.0%}) | {'**met**' if pairs and share >= 0.95 else '**not met**'} |")
    return out


def _pairs_table(records: dict, plan: CasePlan) -> list[str]:
    rows = [f"| {c} | {p:.4f} | {m:.4f} | {_f4(s)} | {'yes' if p <= m + 1e-12 else '**no**'} |"
            for c, p, m, s in prediction_pairs(records, plan)]
    return ["| case | predicted worst cosine (gate's N) | gate measured (parity data) | score split measured | "
            "prediction ≤ gate |", "|---|---|---|---|---|", *rows]


def render_distribution(records: dict, plan: CasePlan) -> list[str]:
    """The issue-19 section (empty when the plan has no generated case)."""
    if not any(CASES[c].generated for c in plan.cases):
        return []
    return ["## Issue 19: done when", "", *_done(records, plan), "",
            "## Issue 19: the distribution", "",
            "Each seed draws one case (`bench/gen.py`): width ViT-S (384, 6 heads; 75 %) or ViT-B (768, 12 heads), depth "
            "6/8/12 (ViT-B 6/8), 96–160 px, pre-LN (70 %) or post-LN, GELU (70 %) or ReLU; 2–8 LayerNorm outlier channels "
            "×10–×60 with a bias shift up to ±factor, the same channels in every LayerNorm or chosen independently per "
            "LayerNorm (50/50); pre-LN cases: residual-stream outlier channels ×10–×30 (50 %), of which 60 % with 1–3 sink "
            "tokens of ±100–500; real photo crops from images installed packages ship (75 %, `bench/photos.py`) or smooth "
            "noise. Random weights otherwise (timm init). Cosine: per held-out sample, min and mean over the score split "
            "(no tool saw it). Predicted / gate-measured: the fallback's predicted worst cosine over the gate's sample count, "
            "and what the gate then measured on the parity data.", "",
            *_half(records, plan, held=False), *_half(records, plan, held=True),
            "### Predicted vs measured worst case, every case", "", *_pairs_table(records, plan), ""]
