"""``python -m bench.run [--quick] [--plan peers|legacy]``: measure, write ``bench/results.md``.

The default plan (``peers``, :mod:`bench.casebench`) is issue 11's: vitexport beside NNCF, ModelOpt
and plain ``quantize_static`` on transformer cases with real outlier structure, scored on held-out
data no tool saw. ``--plan legacy`` is the earlier vitexport-vs-plain bench on random-weight timm
models (export time, calibration memory grid, latency), written to ``bench/results-legacy.md``.

Every measurement is a child process (:func:`bench.proc.run_child`); its outcome is stored as a
record in ``bench/work/records.json`` as soon as it exists, so an interrupted run loses one
measurement, ``--resume`` re-measures only what is missing or failed, and ``--render-only``
re-renders the report from the records.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from .cases import CASES
from .casebench import CaseBench
from .harness import Bench, default_cap_gb
from .models import MODELS
from .plan import PATHS, cases_plan, cases_quick_plan, full_plan, quick_plan
from .proc import GB
from .report import machine_info, render
from .report_cases import render_cases, speed_lines

__all__ = ["main", "Bench"]

BENCH_DIR = Path(__file__).resolve().parent


def _select(plan, wanted: str | None, known: dict, ap: argparse.ArgumentParser):
    """The plan cut to ``--models`` (plan order kept)."""
    if not wanted:
        return plan
    names = [m.strip() for m in wanted.split(",") if m.strip()]
    unknown = [m for m in names if m not in known]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(known)}")
    field = "cases" if hasattr(plan, "cases") else "models"
    return type(plan)(**{**plan.__dict__, field: tuple(names)})


#: a report's tail from this line on is kept when the report is rendered again: figures another
#: run measured (issue 13's old-versus-new comparison of the redesign), written by hand
KEPT = "<!-- kept across runs: everything below is written by hand -->"


def kept_tail(path: Path) -> str:
    """The hand-written tail of the report at ``path`` (from :data:`KEPT` on), or ``""``."""
    if not path.is_file():
        return ""
    text = path.read_text()
    i = text.find(KEPT)
    return "" if i < 0 else "\n" + text[i:]


def main(argv: list[str] | None = None) -> int:
    """Command line: see ``--help`` and ``bench/README.md``."""
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    ap.add_argument("--plan", choices=("peers", "legacy"), default="peers",
                    help="peers (default): issue 11's cases, vitexport beside NNCF / ModelOpt / quantize_static; "
                         "legacy: vitexport vs torch.onnx.export + quantize_static on random-weight timm models")
    ap.add_argument("--quick", action="store_true", help="a few minutes: peers: demo + text encoder at 32 samples; "
                                                          "legacy: demo + ViT-Tiny (+ outliers), 32 samples")
    ap.add_argument("--complete-grid", action="store_true", help="legacy: ViT-B/16 memory at every method × 32/128/256 (hours)")
    ap.add_argument("--models", help="comma-separated subset of the plan's models / cases")
    ap.add_argument("--paths", help=f"peers plan: measure only these tools now ({','.join(PATHS)}); the others' records stand")
    ap.add_argument("--no-latency", action="store_true", help="peers plan: skip the latency run")
    ap.add_argument("--extra-only", action="store_true", help="peers plan: only the extra cells (larger calibration sets)")
    ap.add_argument("--work", default=str(BENCH_DIR / "work"), help="scratch folder (git-ignored)")
    ap.add_argument("--out", default=None, help="report path (default bench/results.md, legacy bench/results-legacy.md; "
                                               "--quick: bench/work/results-*quick.md)")
    ap.add_argument("--mem-cap-gb", type=float, default=None, help="kill a measurement above this resident memory")
    ap.add_argument("--timeout-s", type=float, default=None, help="kill a measurement after this long (default: the plan's)")
    ap.add_argument("--resume", action="store_true", help="keep good records of an earlier run, re-measure the rest")
    ap.add_argument("--vx-set", action="append", default=[], metavar="KEY=VALUE",
                    help="legacy: a recipe override for every vitexport run (e.g. quantization.high_precision=fp32)")
    ap.add_argument("--render-only", action="store_true", help="re-render the report from the stored records")
    a = ap.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the running child (its own process group) is killed too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    peers = a.plan == "peers"
    # --models cuts what is measured now; the report still shows every model of the plan (from the
    # records), so iterating on two cases does not shrink bench/results.md to those two.
    whole = (cases_quick_plan() if a.quick else cases_plan()) if peers else (
        quick_plan() if a.quick else full_plan(complete_grid=a.complete_grid))
    plan = _select(whole, a.models, CASES if peers else MODELS, ap)
    if a.timeout_s:
        plan = type(plan)(**{**plan.__dict__, "timeout_s": a.timeout_s})
    paths = None
    if a.paths:
        paths = tuple(p.strip() for p in a.paths.split(",") if p.strip())
        bad = [p for p in paths if p not in PATHS]
        if bad or not peers:
            ap.error(f"--paths {a.paths}: the peers plan's tools are {', '.join(PATHS)}")
    work = Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    # The quick run must not overwrite the committed full report.
    default_out = {(True, False): BENCH_DIR / "results.md", (True, True): work / "results-peers-quick.md",
                   (False, False): BENCH_DIR / "results-legacy.md", (False, True): work / "results-quick.md"}[(peers, a.quick)]
    out = Path(a.out) if a.out else default_out
    cap_gb = a.mem_cap_gb or default_cap_gb()
    # --paths implies --resume: measuring some tools only makes sense beside the others' records.
    resume = a.resume or a.render_only or paths is not None
    if peers:
        bench: Bench = CaseBench(plan, work, cap_gb, resume=resume, paths=paths, latency=not a.no_latency,
                                 extra_only=a.extra_only)
    else:
        bench = Bench(plan, work, cap_gb, resume=resume)
        bench.vx_overrides = tuple(a.vx_set)
    info = machine_info()
    if not a.render_only:
        t0 = time.perf_counter()
        print(f"bench ({plan.name}): {', '.join(plan.models)}; memory cap {cap_gb:.1f} GB; records in {bench.path}")
        for model in plan.models:
            bench.run_case(model) if peers else bench.run_model(model)
        info["bench_seconds"] = time.perf_counter() - t0
        info["load_after"] = os.getloadavg()
        info["partial"] = plan.models != whole.models or paths is not None
        meta = bench.records.setdefault("_meta", {"ok": True})
        if info["partial"] and "date" in meta:
            # a partial re-run (some models or tools) keeps the full run's facts and adds its own
            meta["last_partial"] = {k: info[k] for k in ("date", "commit", "bench_seconds", "load_before", "load_after")}
            info = {k: v for k, v in meta.items() if k not in ("ok", "cap_gb")}
        else:
            meta.update(info, cap_gb=cap_gb)
        bench._save()
    else:
        info.update({k: v for k, v in bench.records.get("_meta", {}).items() if k != "ok"})
        # The cap the measurements ran under, not today's (a run still going has no _meta yet).
        caps = [r.get("cap_bytes") for r in bench.records.values() if isinstance(r, dict) and r.get("cap_bytes")]
        cap_gb = info.pop("cap_gb", None) or (round(max(caps) / GB, 1) if caps else cap_gb)
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = kept_tail(out)
    if peers:
        out.write_text(render_cases(whole, bench.records, info, cap_gb) + kept)
        print("\n".join(speed_lines(bench.records, whole)))  # issue 30: the quantize stage beside NNCF, same run
    else:
        out.write_text(render(whole, bench.records, info, cap_gb) + kept)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
