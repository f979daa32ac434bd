"""The rknn-toolkit2 worker: run by ``.venv-rknn``'s interpreter, never imported by vitexport.

rknn-toolkit2 pins numpy<=1.26.4, onnx<=1.18 and protobuf<=4.25.4, imports torch, prints to the
terminal from C++ and can crash its process (a segfault in its subgraph manager on some masks), so it
runs here, in a process of its own, with files in and files out:

    python -I worker.py REQUEST.json

reads a JSON request, writes the JSON reply to ``request["reply"]`` (atomically, after every stage, so
a crash leaves the stages that finished) and the outputs as ``.npy`` files. Only the standard library,
numpy and rknn are imported here. The schema is in :mod:`vitexport.targets.rknn.client` (the client).
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback

import numpy as np

__all__ = ["main", "run_request", "inject_ranges", "base_name"]

#: suffixes RKNN appends to an ONNX tensor's name when it only re-lays the tensor out (reshape,
#: transpose, swap): such a tensor holds the same values, so the ONNX tensor's range is its range
_LAYOUT_SUFFIX = re.compile(r"(?:(?:_|-)(?:sw|rs|tp|tp-rs|sw-rs|tp_rs|rs_sw|rs-sw))+$")


class StageFailed(Exception):
    """An RKNN call returned non-zero (RKNN logs the reason; the client reads it from the log)."""


def base_name(rknn_name: str) -> str:
    """The ONNX tensor an RKNN tensor name stands for when RKNN only re-laid it out (else the name itself)."""
    return _LAYOUT_SUFFIX.sub("", rknn_name)


def inject_ranges(cfg_path: str, ranges: dict, layers: dict) -> dict:
    """Write ``ranges`` (ONNX tensor name → [lo, hi]) into RKNN's quantization config.

    Entries whose RKNN name is an ONNX name, or an ONNX name plus layout suffixes, take that tensor's
    range; ``layers`` (RKNN name → int8 / int16 / float16) go to ``custom_quantize_layers``.
    rknn-toolkit2 2.5.0's step 2 recomputes the derived int32 scales (biases, position embeddings)
    from the ranges and refuses a config whose stored ones then differ ("scale is not allowed to be
    modified"): edited ranges are refused as a whole; ``layers`` is the part step 2 takes.
    Returns:
        {"matched": [rknn names], "unmatched": [ONNX names no entry took]}.
    """
    from ruamel.yaml import YAML

    yaml = YAML()
    with open(cfg_path) as f:
        cfg = yaml.load(f)
    params = cfg.get("quantize_parameters") or {}
    matched, used = [], set()
    for name, entry in params.items():
        src = name if name in ranges else base_name(name)
        if src not in ranges or entry.get("dtype") != "int8" or entry.get("qmethod") != "layer":
            continue
        lo, hi = (float(v) for v in ranges[src])
        # step 2 derives scale and zero point from min/max itself and refuses an edited scale
        entry["min"], entry["max"] = [min(lo, 0.0)], [max(hi, 0.0)]
        matched.append(name)
        used.add(src)
    if layers:
        custom = cfg.get("custom_quantize_layers") or {}
        custom.update(layers)
        cfg["custom_quantize_layers"] = custom
    with open(cfg_path, "w") as f:
        yaml.dump(cfg, f)
    return {"matched": matched, "unmatched": sorted(set(ranges) - used)}


def _dataset_file(rows: list[list[str]], path: str) -> str:
    with open(path, "w") as f:
        for row in rows:
            f.write(" ".join(row) + "\n")
    return path


def _check(ret, what: str):
    if ret != 0 and ret is not None:
        raise StageFailed(f"{what} returned {ret}")
    return ret


def _build(rknn, req: dict, work: str, reply: dict):
    """``build`` (float or RKNN's own quantizer) or the two hybrid-quantization steps. Returns the RKNN
    object that holds the built model (step 2 needs a fresh one: it refuses an object that loaded a model)."""
    q = req.get("quantization") or {"mode": "none"}
    mode = q.get("mode", "none")
    dataset = _dataset_file(q["dataset"], os.path.join(work, "dataset.txt")) if q.get("dataset") else None
    if mode in ("none", "rknn"):
        _check(rknn.build(do_quantization=mode == "rknn", dataset=dataset), "build")
        return rknn
    if mode != "hybrid":
        raise ValueError(f"unknown quantization mode {mode!r}")
    cwd = os.getcwd()
    os.chdir(work)  # step1 writes <model>.model / .data / .quantization.cfg into the current folder
    try:
        _check(rknn.hybrid_quantization_step1(dataset=dataset, proposal=False), "hybrid_quantization_step1")
        stem = os.path.splitext(os.path.basename(req["onnx"]))[0]
        cfg = os.path.join(work, f"{stem}.quantization.cfg")
        reply["hybrid"] = inject_ranges(cfg, q.get("ranges") or {}, q.get("layers") or {})
        reply["hybrid"]["config"] = cfg
        _save(req, reply)
        rknn.release()
        rknn = _new_rknn(req)
        _check(rknn.hybrid_quantization_step2(model_input=os.path.join(work, f"{stem}.model"),
                                              data_input=os.path.join(work, f"{stem}.data"),
                                              model_quantization_cfg=cfg), "hybrid_quantization_step2")
    finally:
        os.chdir(cwd)
    return rknn


def _new_rknn(req: dict):
    from rknn.api import RKNN

    rknn = RKNN(verbose=True)  # verbose: the log then holds the per-op table the client reads
    rknn.config(target_platform=req["platform"], **(req.get("config") or {}))
    return rknn


def _infer(rknn, req: dict, reply: dict) -> None:
    """Inference over the samples; output j of every sample stacked into ``output_j.npy``."""
    outs: list[list[np.ndarray]] = []
    t0 = time.perf_counter()
    for row in req.get("inputs") or []:
        res = rknn.inference(inputs=[np.load(p) for p in row], data_format="nchw")
        if res is None:
            raise StageFailed("inference returned None")
        for j, arr in enumerate(res):
            if len(outs) <= j:
                outs.append([])
            outs[j].append(np.asarray(arr, np.float32))
    n = len(req.get("inputs") or [])
    reply["seconds_per_sample"] = (time.perf_counter() - t0) / max(n, 1)
    reply["outputs"] = []
    for j, arrs in enumerate(outs):
        path = os.path.join(req["outputs_dir"], f"output_{j}.npy")
        np.save(path, np.concatenate(arrs, axis=0))
        reply["outputs"].append(path)


def _line_buffered_stdio() -> None:
    """Make C's stdout/stderr line-buffered: RKNN's compiler logs through C stdio, which buffers 4 KiB
    when writing to a file, so a segfault would lose the lines naming the pass it died in."""
    import ctypes

    libc = ctypes.CDLL(None)
    for name in ("stdout", "stderr"):
        libc.setvbuf(ctypes.c_void_p.in_dll(libc, name), None, 1, 0)  # 1 = _IOLBF


def _save(req: dict, reply: dict) -> None:
    tmp = req["reply"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(reply, f, indent=1)
    os.replace(tmp, req["reply"])


def run_request(req: dict) -> dict:
    """Run one request: config, load_onnx, build, export_rknn, init_runtime, inference, analysis."""
    reply: dict = {"ok": False, "stages": {}, "stage": None, "error": None}
    work = req["work_dir"]
    os.makedirs(work, exist_ok=True)
    os.makedirs(req["outputs_dir"], exist_ok=True)
    st: dict = {}  # the RKNN object of the moment (hybrid step 2 replaces it)

    def build() -> None:
        st["rknn"] = _build(st["rknn"], req, work, reply)

    steps = [
        ("config", lambda: st.update(rknn=_new_rknn(req))),
        ("load_onnx", lambda: _check(st["rknn"].load_onnx(model=req["onnx"]), "load_onnx")),
        ("build", build),
        ("export_rknn", lambda: _check(st["rknn"].export_rknn(req["rknn"]), "export_rknn") if req.get("rknn") else None),
        ("init_runtime", lambda: _check(st["rknn"].init_runtime(), "init_runtime") if req.get("inputs") else None),
        ("inference", lambda: _infer(st["rknn"], req, reply) if req.get("inputs") else None),
        ("accuracy_analysis", lambda: _analysis(st["rknn"], req, reply)),
    ]
    try:
        for name, step in steps:
            reply["stage"] = name
            _save(req, reply)  # a crash inside the step leaves this stage named in the reply
            print(f"@@vitexport-stage {name}", flush=True)
            t0 = time.perf_counter()
            step()
            reply["stages"][name] = round(time.perf_counter() - t0, 4)
        reply["ok"], reply["stage"] = True, None
    except Exception as exc:  # an RKNN failure is data for the client, not a crash of the worker
        reply["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    finally:
        if "rknn" in st:
            st["rknn"].release()
    _save(req, reply)
    return reply


def _analysis(rknn, req: dict, reply: dict) -> None:
    """RKNN's accuracy_analysis (own-quantizer builds): per-layer cosine in ``error_analysis.txt``."""
    spec = req.get("accuracy_analysis")
    if not spec:
        return
    _check(rknn.accuracy_analysis(inputs=spec["inputs"], output_dir=spec["output_dir"]), "accuracy_analysis")
    reply["accuracy_analysis"] = os.path.join(spec["output_dir"], "error_analysis.txt")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: worker.py REQUEST.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        req = json.load(f)
    _line_buffered_stdio()
    return 0 if run_request(req)["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
