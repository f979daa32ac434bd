"""What each INT8 technique is worth: ``python -m bench.ablation [--cases …] [--samples N]``.

On a case's own files from the side-by-side bench (vitexport's ``model.fp32.onnx`` from its
``vx-N`` run, the same ``calib-N.npz`` every tool got), :func:`vitexport.quantize.quantize_int8`
runs once per variant — the ``orin`` recipe's defaults, then each technique switched off alone —
with the fallback off, so a technique's effect is not hidden behind float layers. Each INT8 file is
scored on the held-out ``score.npz`` against the torch reference exactly like every tool's
(:func:`bench.score.score_onnx`, Q/DQ as float). A last row is the defaults with the fallback on
(what ``vitexport export`` does). Writes ``bench/results-ablation.md`` and the records beside the
case (``bench/work/<case>/ablation.json``). Each variant is a child process: its quantize time and
peak memory are its own.

Also measured per case, on the defaults' scale table: where the INT8 error comes from, per Linear,
weights alone vs activations alone (``error_split``): the evidence for or against a weight-rounding
optimiser (GPTQ / AdaRound) — rounding only ever touches the weight part.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from .proc import GB, REPO, run_child

__all__ = ["VARIANTS", "main"]

WORK = REPO / "bench" / "work"
#: name → (what it shows, recipe overrides)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "defaults": ("every technique on (orin recipe), fallback off", []),
    "no smoothing": ("smoothing off (no factors anywhere)", ["quantization.smooth=false"]),
    "LayerNorm folds only": ("no inserted Mul: GELU / attention outputs unsmoothed", ["quantization.smooth_insert=false"]),
    "fixed alpha 0.5": ("one migration strength for every site", ["quantization.smooth_alpha=0.5"]),
    "percentile ranges": ("one clipping method (99.99th percentile) for every tensor", ["calibration.method=percentile"]),
    "no bias correction": ("the mean INT8 error left in the outputs", ["quantization.bias_correction=false"]),
    "attn·V float": ("only Q·Kᵀ of attention in INT8", ["quantization.quantize_attention_pv=false"]),
    "attention float": ("neither attention MatMul in INT8", ["quantization.quantize_attention_matmuls=false"]),
    "FP32 float parts": ("float parts in FP32 instead of FP16", ["quantization.high_precision=fp32"]),
    "defaults + fallback": ("what vitexport export does", ["quantization.fallback.enabled=true"]),
}
_BASE = ["quantization.measure_latency=false", "calibration.reuse=false", "quantization.fallback.enabled=false"]


def _child(args: dict) -> dict:
    """One variant in a child process (``bench.worker`` task ``ablation``)."""
    return run_child("ablation", args, cap_bytes=int(14 * GB), timeout_s=3600,
                     log_path=Path(args["out"]) / "child.log").to_dict()


def run_case(case: str, n: int, variants: list[str], log=print) -> dict:
    """Every variant on one case; returns (and stores) the records."""
    case_dir = WORK / case
    fp32 = case_dir / f"vx-{n}" / "model.fp32.onnx"
    calib = case_dir / f"calib-{n}.npz"
    if not fp32.is_file() or not calib.is_file():
        raise SystemExit(f"{case}: run `python -m bench.run --models {case}` first (needs {fp32} and {calib})")
    path = case_dir / "ablation.json"
    records = json.loads(path.read_text()) if path.is_file() else {}
    for name in variants:
        overrides = [*_BASE, f"calibration.num_samples={n}", *VARIANTS[name][1]]
        out = case_dir / "ablation" / name.replace(" ", "_").replace("·", "").replace("+", "plus")
        log(f"[{time.strftime('%H:%M:%S')}] {case} · {name} ...")
        rec = _child({"fp32": str(fp32), "calib": str(calib), "out": str(out), "overrides": overrides,
                      "score": str(case_dir / "score.npz"), "reference": str(case_dir / "reference.npz"),
                      "error_split": name == "defaults"})
        records[name] = rec
        path.write_text(json.dumps(records, indent=1))
        d = rec.get("data") or {}
        log(f"    {rec.get('wall_s', 0):.0f} s, peak {rec.get('peak_bytes', 0) / GB:.2f} GB, "
            f"cosine {d.get('cosine_mean', float('nan')):.5f} / {d.get('cosine_min', float('nan')):.5f}"
            + ("" if rec.get("ok") else f", FAILED: {rec.get('error')}"))
    return records


def _row(name: str, rec: dict, base: dict | None) -> str:
    if not rec.get("ok"):
        return f"| {name} | failed: {rec.get('error', '?')} | | | | |"
    d = rec["data"]
    top1 = f"{d['top1_agreement']:.1%}" if d.get("top1_agreement") is not None else "–"
    acc = f"{d['accuracy']:.2%}" if d.get("accuracy") is not None else "–"
    delta = ""
    if base and base.get("ok") and name != "defaults":
        delta = f" ({d['cosine_min'] - base['data']['cosine_min']:+.4f})"
    return (f"| {name} | {d['cosine_mean']:.5f} / {d['cosine_min']:.5f}{delta} | {top1} | {acc} | "
            f"{d['quantize_s']:.0f} s | {rec['peak_bytes'] / GB:.2f} GB |")


def render(cases: dict[str, dict], n: int) -> str:
    lines = [f"# INT8 technique ablation (`python -m bench.ablation`, {n} calibration samples)", "",
             "Each row switches one technique off (fallback off throughout, except the last row), on the case's own "
             "FP32 file and calibration file from the side-by-side bench; scored on its held-out split against the "
             "torch model, Q/DQ as float. In parentheses: the change of worst-case cosine against the defaults.", ""]
    for case, recs in cases.items():
        base = recs.get("defaults")
        lines += [f"## {case}", "", "| variant | cosine mean / min | top-1 agreement | accuracy | quantize time | peak |",
                  "|---|---|---|---|---|---|"]
        lines += [_row(name, rec, base) for name, rec in recs.items()]
        split = (base or {}).get("data", {}).get("error_split")
        if split:
            lines += ["", f"Where the defaults' INT8 error comes from (relative output error summed over {split['linears']} "
                          f"Linears on sampled activations): weights alone {split['weights']:.3g}, activations alone "
                          f"{split['activations']:.3g}, both {split['both']:.3g}. A weight-rounding optimiser (GPTQ / AdaRound) "
                          f"can only reduce the first."]
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ablation", description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="text_encoder,vit_base_outlier,digits_vit")
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of the variants")
    ap.add_argument("--out", default=str(REPO / "bench" / "results-ablation.md"))
    a = ap.parse_args(argv)
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    cases = {c.strip(): run_case(c.strip(), a.samples, variants) for c in a.cases.split(",") if c.strip()}
    Path(a.out).write_text(render(cases, a.samples))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
