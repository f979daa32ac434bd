"""NPU bench (issue 20): RKNN's own quantizer vs vitexport's routes on RKNN's x86 simulator,
OpenVINO INT8 vs FP32 on its CPU plugin, and Arm Ethos-U85 (issue 32) -> bench/results-npu.md.

    python -m bench.npu [--models demo,vit_tiny,swin,digits_vit,text_encoder,photo_swin] [--samples 32]
                        [--trained-samples 256] [--ov-models vit_tiny,vit_small,demo,digits_vit,text_encoder]
                        [--ethos-models demo,digits_vit] [--ethos-samples 128]

``--models '' --ov-models ''`` runs only the Ethos-U models and replaces that section of the file.
Ethos-U85: ``vitexport export --target ethos-u85`` as it ships (ExecuTorch's quantizer on the case's
calibration split, Vela, the TOSA reference model), its parity data being the case's ``score`` split,
which ExecuTorch's quantizer never sees; the figures are the export's own report (``parity.json``).

Models: random-weight timm ViT-Tiny and a shrunk Swin-T, and the trained ones as issue 19's bench
cases (:data:`CASE_MODELS`, :mod:`bench.cases`: trained once by ``scripts/train_*.py`` and cached in
``bench/work/<case>``, where ``make bench``'s :mod:`bench.run` keeps them; the demo's committed
held-out split cut in two), which export with their ``parity`` split as the gate and are scored on
their ``score`` split, which neither calibration nor the gate nor the fallback selection saw.
Per model: vitexport exports with the ``rk3588`` recipe as the command line does (:data:`RKNN_SETS`: its
own compile, INT8-share gate and simulator gate included, so the section's exit is the command line's);
then the float graph, its Q/DQ file and its calibration table go to
rknn-toolkit2 (``make setup-rknn``) by the three routes of :mod:`vitexport.targets.rknn.routes`,
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

from bench.cases import CASES, prepare_case
from bench.dense_case import DENSE_KINDS, score_dense
from bench.models import MODELS, prepare_model
from bench.npu_models import SWIN_TITLE, prepare_swin
from vitexport.api import export
from vitexport.runners import OnnxRuntimeRunner
from vitexport.targets.openvino.runner import OpenVinoRunner
from vitexport.runners.sessions import QDQ_AS_FLOAT
from vitexport.errors import BadInput, ParityFailure, VitexportError
from vitexport.graph.split import split_integer_prefix
from vitexport.targets.rknn.rk3588 import Rk3588Target
from vitexport.targets.rknn.client import RknnRequest, run_rknn
from vitexport.targets.rknn.routes import ROUTES, float_for_rknn, qdq_for_rknn, route_quantization

__all__ = ["main", "RKNN_SETS", "OV_SETS", "ETHOS_SETS", "CASE_MODELS", "bench_model", "bench_openvino", "bench_ethos",
           "ethos_row", "render_ethos"]

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "bench" / "work" / "npu"
#: where :mod:`bench.run` keeps its cases (trained once, minutes each): the NPU bench reuses them
CASES_WORK = REPO / "bench" / "work"
#: the rk3588 recipe as it ships, its own compile and simulator gate included, so the section's exit is the command
#: line's (INT8-share gate and all, and its calibration size: on MobileViT-XXS, 64 samples exit 1 where the default
#: 128 exits 0); the bench compiles every route itself besides
RKNN_SETS = ["quantization.measure_latency=false"]
#: the openvino recipe as it ships (its runtime-precision gate included); the bench runs both files on the CPU plugin
OV_SETS = ["quantization.measure_latency=false"]
#: the ethos-u85 recipe as it ships (its worker runs the reference model on every parity sample: ~1 s each on 2 cores)
ETHOS_SETS = ["quantization.measure_latency=false"]
ETHOS_TITLE = "## Arm Ethos-U85-256 (issue 32)"
#: the trained models, as issue 19's bench cases (bench/cases.py): the demo, a digits ViT, a text encoder
#: with a padding mask and mean pooling (scored through its trained topic head), a shifted-window Swin
CASE_MODELS = ("demo", "digits_vit", "text_encoder", "photo_swin", "minilm", "mpnet", "shapes_yolos", "shapes_segformer",
               "photo_mobilevit", "photo_effvit")


def _feeds(npz: str, names: list[str], n: int) -> list[dict[str, np.ndarray]]:
    """The first ``n`` rows of ``npz``, one feed per row (float inputs as float32, token ids as they are)."""
    with np.load(npz) as z:
        cols = {k: z[k] if z[k].dtype.kind in "iu" else z[k].astype(np.float32) for k in names}
    return [{k: v[i : i + 1] for k, v in cols.items()} for i in range(min(n, len(cols[names[0]])))]


def _prepare(key: str, samples: int, trained_samples: int) -> dict:
    """One model's files in one shape: ``uri``, ``weights``, ``calib``, ``parity`` (the export's gate),
    ``heldout`` (scored here), ``inputs``, ``n`` (held-out rows scored) and ``ref``: the torch model's
    outputs on them, ``y`` labels and ``head`` (an embedding's trained topic head) where the model has them."""
    work = WORK / key
    if key in CASE_MODELS:
        c = prepare_case(CASES[key], CASES_WORK / key, max_calib=256)
        info = {**c, "heldout": c["score"], "n": min(trained_samples, c["n_score"])}
        ref_key = "out"
        if c["kind"] in DENSE_KINDS:  # issue 29: outputs by name, labels beside them (bench.dense_case)
            with np.load(info["reference"]) as z:
                info["ref"] = {k: z[k][: info["n"]] for k in z.files}
            return {**info, "y": None, "head": None}
    else:
        info = prepare_swin(work) if key == "swin" else prepare_model(MODELS[key], work, max_calib=64)
        info = {**info, "parity": info["heldout"], "inputs": ["x"], "n": samples}
        ref_key = "logits"
    with np.load(info["reference"]) as z:
        info["ref"] = z[ref_key][: info["n"]]
        info["y"] = z["y"][: info["n"]] if "y" in z.files else None
        info["head"] = (z["head_w"], z["head_b"]) if "head_w" in z.files else None
    return info


def _outputs(onnx: Path, outs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """A runner's output list by the ONNX file's output names (RKNN keeps the graph's output order)."""
    import onnx as onnx_lib

    names = [o.name for o in onnx_lib.load(str(onnx), load_external_data=False).graph.output]
    return dict(zip(names, outs))


def _parity(out, info: dict) -> dict:
    """Cosine vs the torch outputs; top-1 agreement and accuracy on the logits (an embedding's: its head's); a
    dense case's (``out``: outputs by name) task figures vs FP32 and vs labels (:func:`bench.dense_case.score_dense`)."""
    if isinstance(out, dict):
        kind, ref = info["kind"], info["ref"]
        if len(out) == 1 == len(DENSE_KINDS[kind]):  # vitexport names a model's only output 'output'
            out = {DENSE_KINDS[kind][0]: next(iter(out.values()))}
        outs = {k: out[k].reshape(ref[k].shape) for k in DENSE_KINDS[kind]}
        a, b = (v.reshape(len(v), -1).astype(np.float64) for v in (outs["logits"], ref["logits"]))
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        return {"cos_min": float(cos.min()), "cos_mean": float(cos.mean()), **score_dense(kind, outs, ref)}
    ref = info["ref"]
    a, b = out.reshape(len(ref), -1).astype(np.float64), ref.reshape(len(ref), -1).astype(np.float64)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    if info["head"] is not None:
        w, bias = info["head"]
        a, b = a @ w.T + bias, b @ w.T + bias
    res = {"cos_min": float(cos.min()), "cos_mean": float(cos.mean()), "top1": float((a.argmax(1) == b.argmax(1)).mean())}
    if info["y"] is not None:
        res["accuracy"], res["fp32_accuracy"] = float((a.argmax(1) == info["y"]).mean()), float((b.argmax(1) == info["y"]).mean())
    return res


def _rknn_row(onnx: Path, route: str, calib, info: dict, work: Path, calibration_json: Path | None = None) -> dict:
    """Compile ``onnx`` by ``route`` and score RKNN's simulator on the held-out feeds. Token-id inputs: the
    integer prefix is cut off and run on the host first, as ``--target rk3588`` does (``host.onnx``)."""
    work.mkdir(parents=True, exist_ok=True)
    host = split_integer_prefix(onnx, work / "npu.onnx", work / "host.onnx")
    to_npu = host.feed if host else dict
    held = _feeds(info["heldout"], info["inputs"], info["n"])
    quant = route_quantization(route, [to_npu(f) for f in calib], calibration_json)
    try:
        res = run_rknn(RknnRequest(onnx=work / "npu.onnx" if host else onnx, platform=Rk3588Target.platform,
                                   config=Rk3588Target.rknn_config, quantization=quant, rknn=work / "model.rknn",
                                   inputs=[to_npu(f) for f in held]), work)
    except BadInput as exc:
        return {"error": str(exc)}
    got = _outputs(work / "npu.onnx" if host else onnx, res.outputs) if info.get("kind") in DENSE_KINDS else res.outputs[0]
    return {**_parity(got, info), **res.summary.to_dict(), "compile_s": res.compile_s,
            "sim_ms": 1e3 * (res.seconds_per_sample or 0.0), "hybrid": {k: len(v) for k, v in (res.reply.get("hybrid") or {}).items() if isinstance(v, list)}}


def _export(info: dict, target: str, out: Path, overrides: list[str]) -> tuple[Path, str]:
    """Export as the command line does; a failed gate (exit 1) sets the failed stage's files aside in
    ``rejected/``, where the bench still measures them (what the gate said is reported beside the figures).
    Returns the folder holding ``model.int8.onnx`` (``OUT`` when a later stage failed) and the verdict."""
    try:
        export(info["uri"], target, weights=info["weights"], calib=info["calib"], parity_data=info["parity"], out=out,
               overrides=overrides, resume=True)
    except ParityFailure as exc:
        return (out if (out / "model.int8.onnx").is_file() else out / "rejected"), f"exit 1: {exc}"[:300]
    return out, "exit 0"


def _title(key: str) -> str:
    return SWIN_TITLE if key == "swin" else CASES[key].title if key in CASE_MODELS else MODELS[key].title


def bench_model(key: str, samples: int, trained_samples: int) -> dict:
    """Every RKNN route (and FP16, and ONNX Runtime's run of the Q/DQ file) on one model."""
    work = WORK / key
    info = _prepare(key, samples, trained_samples)
    out = work / "export"
    int8_dir, gate = _export(info, "rk3588", out, RKNN_SETS)
    calib = _feeds(info["calib"], info["inputs"], 32)
    rows: dict = {"notes": info["notes"], "n": info["n"], "gate": gate}
    float_for_rknn(out / "model.fp32.onnx", work / "float.onnx")
    rows["layout"] = qdq_for_rknn(int8_dir / "model.int8.onnx", work / "qdq.onnx", calib)
    rows["fp16"] = _rknn_row(work / "float.onnx", "qdq", calib, info, work / "r-fp16")
    for route in ROUTES:
        src = work / ("qdq.onnx" if route == "qdq" else "float.onnx")
        rows[route] = _rknn_row(src, route, calib, info, work / f"r-{route}", int8_dir / "calibration.json")
    held = _feeds(info["heldout"], info["inputs"], info["n"])
    with OnnxRuntimeRunner(int8_dir / "model.int8.onnx", config=QDQ_AS_FLOAT) as run:
        got = run.infer_batches(held)
        rows["ort_qdq"] = _parity(got if info.get("kind") in DENSE_KINDS else next(iter(got.values())), info)
    return rows


def _latency_ms(runner: OpenVinoRunner, feed: dict, runs: int = 20) -> float:
    runner.infer(feed)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        runner.infer(feed)
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def bench_openvino(key: str, samples: int, trained_samples: int) -> dict:
    """OpenVINO CPU plugin, 2 threads: vitexport's FP32 and INT8 files (openvino recipe) vs torch."""
    info = _prepare(key, samples, trained_samples)
    out = WORK / f"ov-{key}" / "export"
    int8_dir, gate = _export(info, "openvino", out, OV_SETS)
    held = _feeds(info["heldout"], info["inputs"], info["n"])
    row: dict = {"n": info["n"], "gate": gate}
    for kind in ("fp32", "int8"):
        with OpenVinoRunner((out if kind == "fp32" else int8_dir) / f"model.{kind}.onnx", threads=2) as run:
            got = run.infer_batches(held)
            got = got if info.get("kind") in DENSE_KINDS else next(iter(got.values()))
            row[kind] = {**_parity(got, info), "latency_ms": _latency_ms(run, held[0]),
                         "int8_share": run.precisions().int8_share}
    row["speedup"] = row["fp32"]["latency_ms"] / row["int8"]["latency_ms"]
    return row


def bench_ethos(key: str, samples: int, route: str = "executorch") -> dict:
    """``vitexport export --target ethos-u85`` on one trained case by one route (``target_options.route``),
    gated on ``samples`` of its score split; the figures read back from the export's ``parity.json`` (a failed
    gate's too)."""
    info = _prepare(key, samples, samples)
    out = WORK / f"ethos-{key}-{route}" / "export"
    t0 = time.perf_counter()
    code, error = 0, None
    try:
        export(info["uri"], "ethos-u85", weights=info["weights"], calib=info["calib"], parity_data=info["heldout"], out=out,
               overrides=[*ETHOS_SETS, f"parity_data.num_samples={info['n']}", f"target_options.route={route}"],
               resume=True)
    except VitexportError as exc:
        code, error = exc.exit_code, str(exc)
    return {"route": route, **ethos_row(out, info["n"], code, time.perf_counter() - t0, error)}


def ethos_row(out: Path, n: int, code: int, wall_s: float, error: str | None = None) -> dict:
    """One Ethos-U export's figures from its ``parity.json``: each stage's parity, Vela's report, the NPU share."""
    row: dict = {"n": n, "exit": code, "wall_s": wall_s, **({"error": error} if error else {})}
    doc = json.loads((out / "parity.json").read_text()) if (out / "parity.json").is_file() else {"stages": []}
    stages = {s["stage"]: s for s in doc["stages"]}
    for name in ("quantize_int8", "build_engine", "simulate"):
        if name in stages:
            row[name] = {k: stages[name]["metrics"].get(k) for k in ("cosine_min", "cosine_mean", "top1_agreement", "accuracy",
                                                                      "reference_accuracy")}
    build = stages.get("build_engine", {})
    row["runtime"] = (build.get("details") or {}).get("runtime", {})
    row["int8_share"] = next((c["value"] for c in build.get("checks", []) if c["metric"] == "int8_share"), None)
    row["seconds"] = {k: round(v.get("seconds") or 0.0, 1) for k, v in stages.items()}
    return row


def _cell(r: dict | None, key: str, fmt: str = ".4f") -> str:
    v = (r or {}).get(key)
    return "" if v is None else format(v, fmt)


def render_ethos(ethos: dict) -> list[str]:
    """The Ethos-U85 section: per case and route, the export's exit code, reference-runtime parity, NPU share,
    Vela's estimates."""
    lines = [ETHOS_TITLE, "",
             "`vitexport export --target ethos-u85` with its defaults, by each route (`target_options.route`), gated on the "
             "case's score split, which neither quantizer sees (int16 activations, int8 weights, Vela 5.2.0, system "
             "config Ethos_U85_SYS_DRAM_Mid / Sram_Only). executorch: ExecuTorch 1.5.1's EthosUQuantizer on the case's "
             "calibration split, EthosUPartitioner → TOSA → Vela, model.pte; ref runtime = the quantized program on the "
             "TOSA reference model (tosa-tools 2026.8.0), quantized = ExecuTorch's quantized program in torch. tflite: "
             "vitexport's FP32 ONNX lowered to TFLite, LiteRT 2.3.0's post-training quantizer (16x8) on the same "
             "calibration samples → Vela, model.tflite; ref runtime = quantized = Vela's input on the LiteRT interpreter's "
             "reference kernels. NPU share = multiply-accumulates in Vela's NPU parts / all; cycles and latency are "
             "Vela's estimates for one inference; stages s = the export's stage seconds summed (a stage resumed from "
             "an earlier run of the same code counts the seconds it took then).", "",
             "| model | route | held-out | exit | ref runtime cos min | cos mean | top-1 agree | accuracy (FP32) | quantized "
             "cos min | NPU share | CPU compute ops | Vela cycles | est. latency ms | SRAM KiB | flash KiB | stages s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in ethos.items():
        key = name.split("@")[0]
        sim, rt = r.get("simulate"), r.get("runtime") or {}
        acc = f"{sim['accuracy']:.3f} ({sim['reference_accuracy']:.3f})" if sim and sim.get("accuracy") is not None else ""
        share = "" if r.get("int8_share") is None else f"{r['int8_share']:.1%}"
        cpu = ", ".join(rt.get("cpu_compute_ops", [])) or ("none" if rt else "")
        lines.append(f"| {_title(key)} | {r.get('route', 'executorch')} | {r['n']} | {r['exit']} | {_cell(sim, 'cosine_min')} | "
                     f"{_cell(sim, 'cosine_mean')} | {_cell(sim, 'top1_agreement', '.3f')} | {acc} | "
                     f"{_cell(r.get('build_engine'), 'cosine_min')} | {share} | {cpu} | {_cell(rt, 'npu_cycles', ',')} | "
                     f"{_cell(rt, 'latency_ms', '.3f')} | {_cell(rt, 'sram_kib', '.1f')} | {_cell(rt, 'flash_kib', '.1f')} | "
                     f"{sum((r.get('seconds') or {}).values()) or r['wall_s']:.0f} |")
        if r.get("error"):
            lines.append(f"| ↳ {r['error'][:200]} |" + " |" * 15)
    return [*lines, ""]


def _splice(text: str, section: list[str]) -> str:
    """``text`` with its Ethos-U section replaced by ``section`` (appended when it has none)."""
    head, found, tail = text.partition(ETHOS_TITLE)
    i = tail.find("\n## ") if found else -1
    rest = tail[i + 1:] if i >= 0 else ""
    return head.rstrip("\n") + "\n\n" + "\n".join(section) + ("\n" + rest if rest else "")


def _acc(r: dict) -> str:
    return f"{r['accuracy']:.3f} ({r['fp32_accuracy']:.3f})" if "accuracy" in r else ""


def _task(r: dict) -> str:
    """A dense case's task figures in the top-1 / accuracy columns: vs FP32 and vs the labels (FP32's in brackets)."""
    if "map_vs_fp32" in r:
        # None: FP32 made no detection at the score threshold, so there was nothing to score INT8's against
        vs = "–" if r["map_vs_fp32"] is None else f"{r['map_vs_fp32']:.3f}"
        return f"mAP {vs} vs FP32 | mAP {r['map_labels']:.3f} ({r['fp32_map_labels']:.3f}) vs labels"
    return f"mIoU {r['miou_vs_fp32']:.3f} vs FP32 | mIoU {r['miou_labels']:.3f} ({r['fp32_miou_labels']:.3f}) vs labels"


def _fmt(r: dict) -> str:
    if "error" in r:
        return f"| error: {r['error'][:160]} | | | | | | |"
    if "top1" not in r:
        return (f"| {r['cos_min']:.4f} | {r['cos_mean']:.4f} | {_task(r)} | {r['int8_share']:.1%} | "
                f"{r['compile_s']:.1f} | {r['sim_ms']:.1f} |")
    return (f"| {r['cos_min']:.4f} | {r['cos_mean']:.4f} | {r['top1']:.3f} | {_acc(r)} | {r['int8_share']:.1%} | "
            f"{r['compile_s']:.1f} | {r['sim_ms']:.1f} |")


def render(results: dict, ov: dict, samples: int, trained_samples: int, ethos: dict | None = None) -> str:
    lines = ["# NPU bench (issue 20)", "",
             f"Regenerate: `python -m bench.npu` (needs `make setup-rknn`; `make bench` runs it too). Parity vs the torch "
             f"model's outputs on held-out inputs: {samples} per random-weight model (the export gates on the same ones); "
             f"on the trained models (issue 19's bench cases) up to {trained_samples} of their `score` split, which "
             "neither calibration nor the export's gate and fallback selection (their `parity` split) saw. Accuracy: "
             "labels of the score split, FP32 torch in brackets; the text encoder's top-1 and accuracy go through its "
             "trained topic head. INT8 share = INT8 GEMM/Conv MACs / all "
             "GEMM/Conv MACs from RKNN's own op table; compile = load_onnx + build + export_rknn; sim = RKNN x86 "
             "simulator per sample. rknn-toolkit2 2.5.0, target rk3588. vitexport: the `rk3588` recipe "
             f"(`{' '.join('--set ' + s for s in RKNN_SETS)}`); OpenVINO: the `openvino` recipe.", ""]
    for key, rows in results.items():
        lines += [f"## {_title(key)}", "", "; ".join(rows.get("notes", [])) + f"; scored on {rows['n']} held-out inputs; "
                  f"`vitexport export --target rk3588`: {rows.get('gate', 'exit 0')}", "",
                  f"Layout transform: {json.dumps(rows.get('layout', {}))}", "",
                  "| route | cos min | cos mean | top-1 agree | accuracy (FP32) | INT8 share | compile s | sim ms/sample |",
                  "|---|---|---|---|---|---|---|---|"]
        for route, title in (("fp16", "FP16 (no quantization)"), ("rknn", "(a) RKNN's own quantizer on vitexport's float graph"),
                             ("hybrid", "(b) vitexport's ranges injected (hybrid quantization)"),
                             ("qdq", "(c) vitexport's Q/DQ in RKNN's INT8 layout")):
            lines.append(f"| {title} " + _fmt(rows[route]))
        o = rows["ort_qdq"]
        fig = _task(o) if "top1" not in o else f"{o['top1']:.3f} | {_acc(o)}"
        lines += [f"| vitexport's Q/DQ file in ONNX Runtime (float Q/DQ) | {o['cos_min']:.4f} | {o['cos_mean']:.4f} | "
                  f"{fig} | | | |", ""]
    if ov:
        lines += ["## OpenVINO 2026.4 CPU plugin (2 threads, batch 1)", "",
                  "| model | held-out | FP32 cos min | INT8 cos min | INT8 top-1 agree | INT8 accuracy (FP32) | INT8 share (runtime) "
                  "| FP32 ms | INT8 ms | speedup | `vitexport export --target openvino` |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for key, r in ov.items():
            fig = _task(r["int8"]) if "top1" not in r["int8"] else f"{r['int8']['top1']:.3f} | {_acc(r['int8'])}"
            lines.append(f"| {_title(key)} | {r['n']} | {r['fp32']['cos_min']:.4f} | {r['int8']['cos_min']:.4f} | "
                         f"{fig} | {r['int8']['int8_share']:.1%} | {r['fp32']['latency_ms']:.1f} | "
                         f"{r['int8']['latency_ms']:.1f} | {r['speedup']:.2f}x | {r.get('gate', 'exit 0').replace('|', '/')} |")
    if ethos:
        lines += ["", *render_ethos(ethos)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="demo,vit_tiny,swin,digits_vit,text_encoder,photo_swin,minilm,mpnet,shapes_yolos,shapes_segformer,"
                                      "photo_mobilevit,photo_effvit")
    ap.add_argument("--ov-models", default="vit_tiny,vit_small,demo,digits_vit,text_encoder,minilm,mpnet,shapes_yolos,shapes_segformer,"
                                         "photo_mobilevit,photo_effvit")
    ap.add_argument("--samples", type=int, default=32, help="held-out inputs per random-weight model")
    ap.add_argument("--trained-samples", type=int, default=256, help="held-out (score split) inputs per trained model")
    ap.add_argument("--ethos-models", default="demo,digits_vit", help="trained cases exported with --target ethos-u85")
    ap.add_argument("--ethos-routes", default="executorch,tflite", help="target_options.route values, each benched")
    ap.add_argument("--ethos-samples", type=int, default=128,
                    help="score-split inputs per Ethos-U model (the TOSA reference model takes ~1 s each on 2 cores)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results-npu.md"))
    a = ap.parse_args(argv)
    results = {k: bench_model(k, a.samples, a.trained_samples) for k in a.models.split(",") if k}
    ov = {k: bench_openvino(k, a.samples, a.trained_samples) for k in a.ov_models.split(",") if k}
    ethos = {f"{k}@{r}": bench_ethos(k, a.ethos_samples, r) for k in a.ethos_models.split(",") if k
             for r in a.ethos_routes.split(",") if r}
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "results.json").write_text(json.dumps({"rknn": results, "openvino": ov, "ethos": ethos}, indent=1, default=str))
    out = Path(a.out)
    if not results and not ov and out.is_file():  # the Ethos-U models alone: only their section is rewritten
        out.write_text(_splice(out.read_text(), render_ethos(ethos)))
    else:
        out.write_text(render(results, ov, a.samples, a.trained_samples, ethos))
    print(Path(a.out).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
