"""NPU bench (issue 20): RKNN's own quantizer vs vitexport's routes on RKNN's x86 simulator, and
OpenVINO INT8 vs FP32 on its CPU plugin -> bench/results-npu.md.

    python -m bench.npu [--models demo,vit_tiny,swin] [--samples 32] [--ov-models vit_tiny,vit_small]

Per model: vitexport exports with the ``rk3588`` recipe up to its INT8 file (:data:`RKNN_SETS`: the
bench compiles every route itself); then the float graph, its Q/DQ file and its calibration table go to
rknn-toolkit2 (``make setup-rknn``) by the three routes of :mod:`vitexport.toolchains.rknn_routes`,
the ``qdq`` route's file being what ``--target rk3588`` compiles. OpenVINO: the ``openvino`` recipe's
FP32 and INT8 files on the CPU plugin. Parity is measured against the torch model's
logits on held-out inputs no calibration saw; the INT8 share comes from RKNN's own op table.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.models import MODELS, prepare_model
from bench.npu_models import SWIN_TITLE, prepare_swin
from vitexport.api import export
from vitexport.runners import OnnxRuntimeRunner, OpenVinoRunner
from vitexport.runners.sessions import QDQ_AS_FLOAT
from vitexport.errors import BadInput
from vitexport.targets.rk3588 import Rk3588Target
from vitexport.toolchains.rknn import RknnRequest, run_rknn
from vitexport.toolchains.rknn_routes import ROUTES, float_for_rknn, qdq_for_rknn, route_quantization

__all__ = ["main", "RKNN_SETS", "OV_SETS", "bench_model", "bench_openvino"]

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "bench" / "work" / "npu"
#: the rk3588 recipe as it ships, without its own compile (the bench runs every route itself)
RKNN_SETS = ["stages.build_engine.enabled=false", "quantization.measure_latency=false", "calibration.num_samples=64"]
#: the openvino recipe as it ships; the bench runs both files on the CPU plugin itself
OV_SETS = ["stages.build_engine.enabled=false", "quantization.measure_latency=false", "calibration.num_samples=64"]


def _feeds(npz: str, name: str, n: int, start: int = 0) -> list[dict[str, np.ndarray]]:
    x = np.load(npz)["x"]
    return [{name: x[i : i + 1].astype(np.float32)} for i in range(start, min(start + n, len(x)))]


def _parity(out: np.ndarray, ref: np.ndarray) -> dict:
    a, b = out.reshape(len(ref), -1).astype(np.float64), ref.reshape(len(ref), -1).astype(np.float64)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return {"cos_min": float(cos.min()), "cos_mean": float(cos.mean()), "top1": float((a.argmax(1) == b.argmax(1)).mean())}


def _rknn_row(onnx: Path, quant, feeds, ref, work: Path) -> dict:
    try:
        res = run_rknn(RknnRequest(onnx=onnx, platform=Rk3588Target.platform, config=Rk3588Target.rknn_config,
                                   quantization=quant, rknn=work / "model.rknn", inputs=feeds), work)
    except BadInput as exc:
        return {"error": str(exc)}
    return {**_parity(res.outputs[0], ref), **res.summary.to_dict(), "compile_s": res.compile_s,
            "sim_ms": 1e3 * (res.seconds_per_sample or 0.0), "hybrid": {k: len(v) for k, v in (res.reply.get("hybrid") or {}).items() if isinstance(v, list)}}


def bench_model(key: str, samples: int) -> dict:
    """Every RKNN route (and FP16, and ONNX Runtime's run of the Q/DQ file) on one model."""
    work = WORK / key
    info = prepare_swin(work) if key == "swin" else prepare_model(MODELS[key], work, max_calib=64)
    out = work / "export"
    export(info["uri"], "rk3588", weights=info["weights"], calib=info["calib"], parity_data=info["heldout"],
           out=out, overrides=RKNN_SETS, resume=True)
    name = "x"
    calib = _feeds(info["calib"], name, 32)
    held = _feeds(info["heldout"], name, samples)
    ref = np.load(info["reference"])["logits"][: len(held)]
    rows: dict = {"notes": info["notes"]}
    float_for_rknn(out / "model.fp32.onnx", work / "float.onnx")
    rows["layout"] = qdq_for_rknn(out / "model.int8.onnx", work / "qdq.onnx", calib)
    rows["fp16"] = _rknn_row(work / "float.onnx", route_quantization("qdq", calib), held, ref, work / "r-fp16")
    for route in ROUTES:
        src = work / ("qdq.onnx" if route == "qdq" else "float.onnx")
        quant = route_quantization(route, calib, out / "calibration.json")
        rows[route] = _rknn_row(src, quant, held, ref, work / f"r-{route}")
    with OnnxRuntimeRunner(out / "model.int8.onnx", config=QDQ_AS_FLOAT) as run:
        rows["ort_qdq"] = _parity(run.infer_batches(held)["output"], ref)
    return rows


def _latency_ms(runner: OpenVinoRunner, feed: dict, runs: int = 20) -> float:
    runner.infer(feed)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        runner.infer(feed)
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def bench_openvino(key: str, samples: int) -> dict:
    """OpenVINO CPU plugin, 2 threads: vitexport's FP32 and INT8 files (openvino recipe) vs torch."""
    spec = MODELS[key]
    work = WORK / f"ov-{key}"
    info = prepare_model(spec, work, max_calib=64)
    out = work / "export"
    export(info["uri"], "openvino", weights=info["weights"], calib=info["calib"], parity_data=info["heldout"], out=out,
           overrides=OV_SETS, resume=True)
    held = _feeds(info["heldout"], "x", samples)
    ref = np.load(info["reference"])["logits"][: len(held)]
    row: dict = {}
    for kind in ("fp32", "int8"):
        with OpenVinoRunner(out / f"model.{kind}.onnx", threads=2) as run:
            row[kind] = {**_parity(run.infer_batches(held)["output"], ref), "latency_ms": _latency_ms(run, held[0]),
                         "int8_share": run.precisions().int8_share}
    row["speedup"] = row["fp32"]["latency_ms"] / row["int8"]["latency_ms"]
    return row


def _fmt(r: dict) -> str:
    if "error" in r:
        return f"| error: {r['error'][:160]} | | | | | |"
    return (f"| {r['cos_min']:.4f} | {r['cos_mean']:.4f} | {r['top1']:.3f} | {r['int8_share']:.1%} | "
            f"{r['compile_s']:.1f} | {r['sim_ms']:.1f} |")


def render(results: dict, ov: dict, samples: int) -> str:
    lines = ["# NPU bench (issue 20)", "",
             f"Regenerate: `python -m bench.npu` (needs `make setup-rknn`). Parity vs the torch model's logits on "
             f"{samples} held-out inputs per model (never calibrated on); INT8 share = INT8 GEMM/Conv MACs / all "
             "GEMM/Conv MACs from RKNN's own op table; compile = load_onnx + build + export_rknn; sim = RKNN x86 "
             "simulator per sample. rknn-toolkit2 2.5.0, target rk3588. vitexport: the `rk3588` recipe "
             f"(`{' '.join('--set ' + s for s in RKNN_SETS)}`); OpenVINO: the `openvino` recipe.", ""]
    for key, rows in results.items():
        title = SWIN_TITLE if key == "swin" else MODELS[key].title
        lines += [f"## {title}", "", "; ".join(rows.get("notes", [])), "",
                  f"Layout transform: {json.dumps(rows.get('layout', {}))}", "",
                  "| route | cos min | cos mean | top-1 agree | INT8 share | compile s | sim ms/sample |",
                  "|---|---|---|---|---|---|---|"]
        for route, title in (("fp16", "FP16 (no quantization)"), ("rknn", "(a) RKNN's own quantizer on vitexport's float graph"),
                             ("hybrid", "(b) vitexport's ranges injected (hybrid quantization)"),
                             ("qdq", "(c) vitexport's Q/DQ in RKNN's INT8 layout")):
            lines.append(f"| {title} " + _fmt(rows[route]))
        o = rows["ort_qdq"]
        lines += [f"| vitexport's Q/DQ file in ONNX Runtime (float Q/DQ) | {o['cos_min']:.4f} | {o['cos_mean']:.4f} | "
                  f"{o['top1']:.3f} | | | |", ""]
    if ov:
        lines += ["## OpenVINO 2026.4 CPU plugin (2 threads, batch 1)", "",
                  "| model | FP32 cos min | INT8 cos min | INT8 top-1 agree | INT8 share (runtime) | FP32 ms | INT8 ms | speedup |",
                  "|---|---|---|---|---|---|---|---|"]
        for key, r in ov.items():
            lines.append(f"| {MODELS[key].title} | {r['fp32']['cos_min']:.4f} | {r['int8']['cos_min']:.4f} | "
                         f"{r['int8']['top1']:.3f} | {r['int8']['int8_share']:.1%} | {r['fp32']['latency_ms']:.1f} | "
                         f"{r['int8']['latency_ms']:.1f} | {r['speedup']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="demo,vit_tiny,swin")
    ap.add_argument("--ov-models", default="vit_tiny,vit_small")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--out", default=str(REPO / "bench" / "results-npu.md"))
    a = ap.parse_args(argv)
    results = {k: bench_model(k, a.samples) for k in a.models.split(",") if k}
    ov = {k: bench_openvino(k, a.samples) for k in a.ov_models.split(",") if k}
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "results.json").write_text(json.dumps({"rknn": results, "openvino": ov}, indent=1, default=str))
    Path(a.out).write_text(render(results, ov, a.samples))
    print(Path(a.out).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
