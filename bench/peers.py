"""Peer quantizers, run by the peers' own interpreter: ``bench/.peers-venv/bin/python -m bench.peers TASK ARGS RESULT``.

The peers venv (``make bench-peers``) holds NNCF and NVIDIA ModelOpt; ModelOpt pulls onnxruntime-gpu,
which must never enter the project's venv, so this module imports neither ``vitexport`` nor anything
of the bench that does: only the standard library, numpy and onnx, then the peer itself.

Every peer gets vitexport's own ``model.fp32.onnx`` and the very calibration ``.npz`` vitexport got
(:func:`bench.cases.write_calib_subset`), and writes an INT8 Q/DQ ONNX; the bench scores it like every
other tool's. A task writes ``{"error": "<one line>"}`` when the peer raises.

Tasks:
    ``nncf``: ``nncf.quantize(model, dataset, model_type=TRANSFORMER, preset=PERFORMANCE, subset_size=N)``
    on the ONNX model (PERFORMANCE: symmetric activations, what TensorRT accepts).
    ``modelopt``: the ``python -m modelopt.onnx.quantization --quantize_mode int8`` command line, run in
    this process (its ``main()``), with ``--high_precision_dtype`` left at its default (fp16) or set.
"""
from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from .splits import inputs_only  # numpy alone

__all__ = ["TASKS", "main", "peak_bytes", "run_task"]


def peak_bytes() -> int:
    """This process's peak resident memory (``VmHWM``), 0 where ``/proc`` has none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _calib(path: str) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return inputs_only(z)


def task_nncf(a: dict) -> dict:
    """NNCF post-training quantization of the ONNX model; ``quantize_s`` times ``nncf.quantize`` alone."""
    import nncf
    import onnx

    model = onnx.load(a["fp32"])
    data = _calib(a["calib"])
    n = len(next(iter(data.values())))
    # one sample per call, batch 1 as exported: the dict keys are the ONNX input names
    items = [{k: v[i : i + 1] for k, v in data.items()} for i in range(n)]
    t0 = time.perf_counter()
    q = nncf.quantize(model, nncf.Dataset(items), model_type=nncf.ModelType.TRANSFORMER,
                      preset=nncf.QuantizationPreset.PERFORMANCE, subset_size=n)
    quantize_s = time.perf_counter() - t0
    out = Path(a["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(q, str(out))
    return {"quantize_s": quantize_s, "samples": n, "version": nncf.__version__, "files": {"model.int8.onnx": str(out)}}


def task_modelopt(a: dict) -> dict:
    """ModelOpt's ONNX PTQ command line, in-process; ``quantize_s`` times its ``main()``."""
    import modelopt
    import modelopt.onnx.quantization.__main__ as cli

    out = Path(a["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = ["modelopt.onnx.quantization", "--onnx_path", a["fp32"], "--quantize_mode", "int8",
            "--calibration_data_path", a["calib"], "--output_path", str(out)]
    if a.get("high_precision_dtype"):
        argv += ["--high_precision_dtype", a["high_precision_dtype"]]
    saved = sys.argv
    sys.argv = argv
    try:
        t0 = time.perf_counter()
        cli.main()
        quantize_s = time.perf_counter() - t0
    finally:
        sys.argv = saved
    if not out.is_file():
        raise RuntimeError(f"modelopt wrote no {out.name}")
    return {"quantize_s": quantize_s, "argv": argv[1:], "version": modelopt.__version__, "files": {"model.int8.onnx": str(out)}}


def task_fail(a: dict) -> dict:
    """Raise on purpose: the harness's own test that a failing peer becomes a cell with a reason."""
    raise RuntimeError(a.get("message", "peer failed"))


TASKS = {"nncf": task_nncf, "modelopt": task_modelopt, "fail": task_fail}


def run_task(tasks: dict, argv: list[str], peak=peak_bytes) -> int:
    """The child protocol both workers share: run ``TASK`` on ``ARGS.json``, always write ``RESULT.json``.

    A task that raises is reported as one line (the table's cell); the traceback goes to the log.
    """
    task, args_path, out_path = argv
    args = json.loads(Path(args_path).read_text())
    try:
        result = tasks[task](args)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a table cell, not a crash
        traceback.print_exc()
        msg = " ".join(f"{type(exc).__name__}: {exc}".split())
        result = {"error": msg[:300]}
    result["peak_bytes"] = peak()
    Path(out_path).write_text(json.dumps(result))
    return 0 if "error" not in result else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.peers TASK ARGS.json RESULT.json``."""
    return run_task(TASKS, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
