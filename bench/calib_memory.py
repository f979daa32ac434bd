"""Peak memory of calibration in a fresh process, as the number of samples grows.

:func:`measure_calibration_memory` runs ``quantize_int8`` on N samples in a child (``python -m
bench.calib_memory calibrate ARGS.json RESULT.json``, through :func:`bench.proc.run_child`), so the
caller's imports and allocator reuse do not blur the figure: the child records its own ``VmHWM``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx

from vitexport.memory import process_peak_bytes

from .peers import run_task
from .proc import GB, run_child

__all__ = ["measure_calibration_memory", "TASKS"]


def _input_specs(path: str | Path) -> dict[str, tuple[list[int], str]]:
    """Data inputs of a model (read here, so the measured child never loads the model twice)."""
    m = onnx.load(str(path), load_external_data=False)
    init = {i.name for i in m.graph.initializer}
    out = {}
    for i in m.graph.input:
        if i.name in init:
            continue
        tt = i.type.tensor_type
        out[i.name] = ([d.dim_value or 1 for d in tt.shape.dim], np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)).str)
    return out


def measure_calibration_memory(fp32_path: str | Path, num_samples: int, work_dir: str | Path, *,
                               recipe: str = "orin", overrides: list[str] | tuple[str, ...] = (),
                               data: str | Path | None = None, with_torch: bool = True,
                               timeout: float = 3600, cap_bytes: int = 16 * GB) -> dict:
    """Peak RSS (MB) of a child process running ``quantize_int8`` on ``num_samples`` samples.

    Args:
        fp32_path: the float ONNX model.
        num_samples: calibration samples (random ones unless ``data`` is given).
        work_dir: where the child writes its artifacts (a fresh folder; nothing is reused).
        recipe: target name or recipe path; ``overrides`` are ``key=value`` strings.
        data: an image folder or ``.npz`` (default: random samples).
        with_torch: import torch in the child first, as the pipeline's process does (~0.5 GB).
        timeout: seconds before the child is killed.
        cap_bytes: the child is killed above this resident memory.
    Returns:
        ``{'peak_rss_mb', 'import_rss_mb', 'report', 'seconds'}``.
    Raises:
        RuntimeError: the child failed (its last line says why).
    """
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    overrides = list(overrides) + [f"calibration.num_samples={num_samples}", "calibration.reuse=false",
                                   "quantization.fallback.enabled=false"]
    args = {"fp32": str(fp32_path), "num_samples": num_samples, "work": str(work), "recipe": recipe,
            "overrides": overrides, "data": str(data) if data else None, "inputs": _input_specs(fp32_path),
            "with_torch": with_torch}
    res = run_child("calibrate", args, cap_bytes=cap_bytes, timeout_s=timeout, env={"OMP_NUM_THREADS": "2"},
                    module="bench.calib_memory", log_path=work / "child.log")
    if not res.ok:
        raise RuntimeError(f"memory measurement failed: {res.error} (log: {work / 'child.log'})")
    return {"peak_rss_mb": res.peak_bytes / 2**20, "import_rss_mb": res.data["import_bytes"] / 2**20,
            "report": res.data["report"], "seconds": res.wall_s}


def _peak_bytes() -> int:
    return int(process_peak_bytes() or 0)


def task_calibrate(a: dict) -> dict:
    """The child: load the recipe and samples, quantize, report (its peak is added by ``run_task``)."""
    if a["with_torch"]:
        import torch  # noqa: F401  - the pipeline's process has it loaded: count it

    # the child's work, imported here: the parent measures and must stay small (no onnxruntime)
    from vitexport.calibration import load_samples, random_samples
    from vitexport.quantize import quantize_int8
    from vitexport.targets import load_target

    base = _peak_bytes()
    target = load_target(a["recipe"], a["overrides"])
    example = {k: np.zeros(shape, dtype) for k, (shape, dtype) in a["inputs"].items()}
    if a["data"]:
        samples = load_samples(a["data"], example, num_samples=a["num_samples"], seed=0)
    else:
        samples = random_samples(example, a["num_samples"], seed=0)
    work = Path(a["work"])
    rep = quantize_int8(Path(a["fp32"]), work / "model.int8.onnx", samples, target, work)
    return {"import_bytes": base, "report": rep.to_dict()}


TASKS = {"calibrate": task_calibrate}

if __name__ == "__main__":
    sys.exit(run_task(TASKS, sys.argv[1:], peak=_peak_bytes))
