"""Child-process entry points: ``python -m bench.worker TASK ARGS.json RESULT.json``.

Each task does one measurement and writes a JSON object to ``RESULT.json``; the parent
(:mod:`bench.proc`) adds the process's wall time and watches its memory. A task that fails writes
``{"error": "<one line>"}`` so the table can say what broke instead of the whole bench stopping.
The child records its own peak resident memory (``VmHWM``) last thing before it exits.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

from .splits import inputs_only, select_calibration

__all__ = ["TASKS", "main", "select_calibration", "vm_hwm_bytes"]


def vm_hwm_bytes() -> int:
    """This process's peak resident memory: the kernel's high-water mark, and every mark vitexport's
    per-stage meter read before resetting it (:func:`vitexport.memory.process_peak_bytes`)."""
    from vitexport.memory import process_peak_bytes

    return int(process_peak_bytes() or 0)


def _load_torch_model(model_key: str, weights: str):
    """The torch FP32 model the plain path exports: same architecture and weights as vitexport's."""
    from bench.models import MODELS

    spec = MODELS[model_key]
    if spec.is_demo:
        from vitexport.demo.model import build_demo_vit

        model = build_demo_vit()
    else:
        import timm

        model = timm.create_model(spec.timm_name, pretrained=False)
    from safetensors.torch import load_file

    model.load_state_dict(load_file(weights))
    return model.eval()


# --- tasks -------------------------------------------------------------------------------------------

def task_prepare(a: dict) -> dict:
    """Write weights, data and FP32 reference logits for one model (:func:`bench.models.prepare_model`)."""
    from bench.models import MODELS, prepare_model

    spec = MODELS[a["model"]]
    if a.get("heldout"):
        spec = dataclasses.replace(spec, heldout=min(spec.heldout, int(a["heldout"])))
    return prepare_model(spec, Path(a["work"]), int(a["max_calib"]), seed=int(a.get("seed", 0)))


def task_prepare_case(a: dict) -> dict:
    """Train or build one issue-11 case and write its splits and reference (:func:`bench.cases.prepare_case`)."""
    from bench.cases import CASES, prepare_case

    return prepare_case(CASES[a["case"]], Path(a["work"]), int(a["max_calib"]), sizes=a.get("sizes"),
                        seed=int(a.get("seed", 0)), tiny=bool(a.get("tiny", False)))


def task_calib_subset(a: dict) -> dict:
    """The calibration ``.npz`` every tool of one cell gets (:func:`bench.cases.write_calib_subset`)."""
    from bench.cases import file_digest, write_calib_subset

    out = write_calib_subset(Path(a["src"]), Path(a["out"]), int(a["num_samples"]))
    return {"path": str(out), "digest": file_digest(out)}


def _model_bytes(path: str) -> int:
    """What an ONNX model occupies on disk: the ``.onnx`` and its external ``.data`` if it has one."""
    from vitexport.graph.files import artifact_files

    return sum(p.stat().st_size for p in artifact_files(path))


def task_vitexport(a: dict) -> dict:
    """``vitexport.api.export`` with a calibration method and sample count.

    A parity gate that fails is a result, not an error: the INT8 model exists and is measured like
    the plain path's (which has no gate at all); the table says the gate failed.
    """
    from vitexport import api
    from vitexport.errors import ParityFailure

    # No method given: the recipe's own (the peers plan measures vitexport's defaults).
    method = [f"calibration.method={a['method']}"] if a.get("method") else []
    overrides = [*method, f"calibration.num_samples={a['num_samples']}", *a.get("overrides", [])]
    out = Path(a["out"])
    t0 = time.perf_counter()
    gate = None
    stage_seconds: dict[str, float] = {}
    try:
        arts = api.export(a["uri"], a["target"], weights=a["weights"], calib=a["calib"], parity_data=a.get("parity", a.get("heldout")),
                          out=out, overrides=overrides, resume=bool(a.get("resume", False)),
                          log=lambda line: print(time.strftime("%H:%M:%S"), line, flush=True))  # timed stage lines, in the child's log
        stage_seconds = dict(arts.stage_seconds)
        resumed = list(arts.resumed)
    except ParityFailure as exc:
        gate = str(exc)
        resumed = []
    seconds = time.perf_counter() - t0
    manifest = out / "manifest.json"
    if manifest.is_file():
        man = json.loads(manifest.read_text())
        stage_seconds = stage_seconds or {k: v["seconds"] for k, v in man.get("stages", {}).items()}
        resumed = resumed or man.get("resumed_stages", [])
    stage_peaks: dict[str, int] = {}
    if manifest.is_file():
        stage_peaks = {k: v["peak_rss_bytes"] for k, v in man.get("stages", {}).items() if v.get("peak_rss_bytes")}
    files = {n: str(out / n) for n in ("model.raw.onnx", "model.fp32.onnx", "model.int8.onnx") if (out / n).is_file()}
    return {"seconds": seconds, "stage_seconds": stage_seconds, "stage_peak_bytes": stage_peaks, "gate_failure": gate,
            "files": files, "resumed": resumed, **_gate_figures(out / "parity.json")}


def _gate_figures(parity_json: Path) -> dict:
    """What the fallback predicted and what the INT8 gate then measured (``parity.json``), the pair issue 19's
    bench counts, and what the fallback kept in float."""
    if not parity_json.is_file():
        return {}
    stages = json.loads(parity_json.read_text()).get("stages", [])
    st = next((x for x in stages if x.get("stage") == "quantize_int8"), None)
    if not st:
        return {}
    q = (st.get("details") or {}).get("quantize") or {}
    m = st.get("metrics") or {}
    keep = ("cosine_min", "cosine_mean", "top1_agreement", "top1_agreement_gated", "accuracy", "reference_accuracy")
    return {"gate_measured": {k: m.get(k) for k in keep}, "gate_passed": st.get("passed"),
            "predicted": (q.get("parity") or {}).get("prediction"),
            "predicted_before_fallback": (q.get("parity_before_fallback") or {}).get("prediction"),
            "float_nodes": [f.get("node") for f in q.get("float_fallback") or []],
            "float_macs_share": q.get("float_macs_share"), "attention": q.get("attention")}


class _NpzReader:
    """An ``onnxruntime.quantization.CalibrationDataReader`` over in-memory samples, one per call."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays, self.i = arrays, 0
        self.n = len(next(iter(arrays.values())))

    def get_next(self):
        if self.i >= self.n:
            return None
        self.i += 1
        return {k: v[self.i - 1 : self.i] for k, v in self.arrays.items()}

    def rewind(self) -> None:
        self.i = 0


def task_plain(a: dict) -> dict:
    """The plain path: ``torch.onnx.export`` then ``quantize_static`` (QDQ, per-channel, int8).

    ``fp32`` given and present: the export is skipped (the calibration-memory grid re-quantizes one
    export; the export is timed in the model's first plain run; the peers plan quantizes vitexport's
    ``model.fp32.onnx``). Calibration feeds are every array of the ``.npz`` but ``y``, by input name.
    """
    import torch
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    out = Path(a["out"])
    out.mkdir(parents=True, exist_ok=True)
    fp32 = Path(a.get("fp32") or out / "model.fp32.onnx")
    int8 = out / "model.int8.onnx"
    export_s = None
    if not fp32.is_file():
        model = _load_torch_model(a["model"], a["weights"])
        x = torch.from_numpy(np.load(a["heldout"])["x"][:1])
        with torch.no_grad():
            model(x)  # warm, as vitexport's model is by the time it exports (reference capture)
        t0 = time.perf_counter()
        # dynamo=False: the TorchScript exporter, what most tutorials and existing scripts call.
        torch.onnx.export(model, (x,), str(fp32), opset_version=17, dynamo=False, input_names=["x"], output_names=["output"])
        export_s = time.perf_counter() - t0
        del model
    with np.load(a["calib"]) as z:
        calib = inputs_only(z)
    idx = select_calibration(len(next(iter(calib.values()))), int(a["num_samples"]))
    feeds = {k: v[idx] for k, v in calib.items()}
    method = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
              "entropy": CalibrationMethod.Entropy}[a["method"]]
    t0 = time.perf_counter()
    quantize_static(
        str(fp32), str(int8), _NpzReader(feeds),
        quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
        calibrate_method=method,
    )
    quantize_s = time.perf_counter() - t0
    return {"export_s": export_s, "quantize_s": quantize_s, "files": {"model.fp32.onnx": str(fp32), "model.int8.onnx": str(int8)}}


def task_ablation(a: dict) -> dict:
    """``quantize_int8`` on a case's FP32 file with recipe overrides, scored on the held-out split
    (:mod:`bench.ablation`). The calibration samples are drawn as ``vitexport export`` draws them."""
    import onnx

    from bench.score import score_onnx
    from vitexport.calibration import load_samples
    from vitexport.quantize import quantize_int8
    from vitexport.targets import load_target

    target = load_target("orin", a["overrides"])
    recipe = target.recipe
    m = onnx.load(a["fp32"], load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    example = {i.name: np.zeros([d.dim_value for d in i.type.tensor_type.shape.dim],
                                onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
               for i in m.graph.input if i.name not in inits}
    cal = recipe.calibration
    calib = load_samples(a["calib"], example, num_samples=cal.num_samples, seed=cal.seed)
    out = Path(a["out"])
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rep = quantize_int8(Path(a["fp32"]), out / "model.int8.onnx", calib, target, out)
    seconds = time.perf_counter() - t0
    res = score_onnx(out / "model.int8.onnx", a["score"], a["reference"], qdq_as_float=True)
    table = json.loads((out / "calibration.json").read_text())
    res.update(quantize_s=seconds, float_nodes=len(rep.float_fallback), smoothed=rep.smoothed,
               fp32_islands=len(rep.precision.get("fp32_islands", {})), error_split=table.get("choices", {}).get("error"))
    return res


def task_quality(a: dict) -> dict:
    """One ONNX file's outputs vs the torch FP32 model's on the held-out inputs (:func:`bench.score.score_onnx`).

    The bench computes its own metrics (it does not ask vitexport's parity code to grade vitexport).
    Args (JSON): ``onnx``, ``heldout`` (inputs), ``reference``, ``qdq_as_float`` (default False: the
    legacy plan timed ORT's int8 kernels; the peers plan scores Q/DQ as float), ``kind``.
    """
    from bench.score import score_onnx

    return score_onnx(a["onnx"], a["heldout"], a["reference"], qdq_as_float=bool(a.get("qdq_as_float", False)),
                      kind=a.get("kind", "classifier"))


def task_latency(a: dict) -> dict:
    """ONNX Runtime latency, batch 1, of several models of one network, interleaved.

    All sessions are loaded first, warmed up, then timed round-robin in blocks: each round gives every
    model one untimed run (its weights back in the CPU caches, as in a deployment that runs one model
    over and over) and ``block`` timed runs, so a load change on a shared machine hits FP32 and INT8
    alike and their ratio stays meaningful. One run of each per round measured the models evicting
    each other from the last-level cache instead: measured here, ViT-B/16 INT8 85 ms alone, 130–150 ms
    interleaved with its 344 MB FP32 twin.

    Args (JSON): ``models`` label → ONNX path, ``runs``, ``warmup``, ``threads``, ``block`` (default 5),
        ``feeds`` (optional ``.npz``: its first row of each input; default: one random image).
    Returns:
        label → ``median_ms``, ``p10_ms``, ``p90_ms``, ``runs``, ``bytes``; or ``error`` for a file
        ONNX Runtime cannot load or run.
    """
    import onnxruntime as ort

    sessions, feeds, failed = {}, {}, {}
    for label, path in a["models"].items():
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(a.get("threads", 2))
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        try:
            sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - one file ORT cannot run (a kernel it lacks) is a cell, not the end
            failed[label] = {"error": " ".join(f"{type(exc).__name__}: {exc}".split())[:200]}
            continue
        sessions[label] = sess
        if a.get("feeds"):  # real inputs (token ids must be ids): row 0 of an .npz, by input name
            with np.load(a["feeds"]) as z:
                feeds[label] = {i.name: z[i.name][:1] for i in sess.get_inputs()}
            continue
        inp = sess.get_inputs()[0]
        shape = [d if isinstance(d, int) else 1 for d in inp.shape]
        feeds[label] = {inp.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    for label, sess in list(sessions.items()):
        try:
            for _ in range(int(a.get("warmup", 3))):
                sess.run(None, feeds[label])
        except Exception as exc:  # noqa: BLE001
            failed[label] = {"error": " ".join(f"{type(exc).__name__}: {exc}".split())[:200]}
            del sessions[label]
    times: dict[str, list[float]] = {label: [] for label in sessions}
    runs, block = int(a["runs"]), max(1, int(a.get("block", 5)))
    while times and min(len(ts) for ts in times.values()) < runs:
        for label, sess in sessions.items():
            sess.run(None, feeds[label])  # untimed: back in cache after the other models ran
            for _ in range(min(block, runs - len(times[label]))):
                t = time.perf_counter()
                sess.run(None, feeds[label])
                times[label].append(time.perf_counter() - t)
    out = {}
    for label, ts in times.items():
        ms = np.array(ts) * 1e3
        out[label] = {"median_ms": float(np.median(ms)), "p10_ms": float(np.percentile(ms, 10)),
                      "p90_ms": float(np.percentile(ms, 90)), "runs": len(ts), "bytes": _model_bytes(a["models"][label])}
    out.update(failed)
    return {"latency": out}


def task_alloc(a: dict) -> dict:
    """Touch ``mb`` MiB, hold it ``hold_s`` seconds: the harness's own test of its memory watchdog."""
    block = np.ones(int(a["mb"]) * 2**20 // 8)
    time.sleep(float(a.get("hold_s", 0.0)))
    return {"mb": int(block.nbytes // 2**20)}


TASKS = {"ablation": task_ablation, "alloc": task_alloc, "prepare": task_prepare, "prepare_case": task_prepare_case, "calib_subset": task_calib_subset, "vitexport": task_vitexport, "plain": task_plain, "quality": task_quality, "latency": task_latency}


def main(argv: list[str] | None = None) -> int:
    """Run one task; always write a result file (the error as one line if the task raised)."""
    from bench.peers import run_task

    return run_task(TASKS, sys.argv[1:] if argv is None else argv, peak=vm_hwm_bytes)


if __name__ == "__main__":
    sys.exit(main())
