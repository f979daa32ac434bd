"""Measurements the benchmark (and ``quantize_int8``, when cheap) calls: latency and peak memory.

- :func:`latency_ms` / :func:`latency_ratio`: median ONNX Runtime latency (CPU, fixed threads,
  batch as exported) of a model, and FP32 / INT8 speed-up.
- :func:`measure_calibration_memory`: peak RSS of a *fresh process* that loads a float model,
  calibrates it on N samples and writes the QDQ model, so import costs and allocator reuse of the
  caller do not blur the figure.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["latency_ms", "latency_ratio", "measure_calibration_memory", "peak_rss_mb"]


def _session(model: str | Path | bytes, threads: int):
    from ..runners.sessions import TIMING, Session

    return Session(model, TIMING.replace(threads=threads))


def latency_ms(model: str | Path | bytes, feed: dict[str, np.ndarray], *, threads: int = 2,
               warmup: int = 3, runs: int = 20, budget_s: float = 5.0, stat: str = "median") -> float:
    """Latency (ms) of one ``session.run`` on ``feed`` — the ``median`` or the ``min`` of the runs
    (``min`` is steadier on a shared machine); stops early after ``budget_s``."""
    sess = _session(model, threads)
    feed = {k: v for k, v in feed.items() if k in sess.input_names}
    for _ in range(warmup):
        sess.run(None, feed)
    times = []
    t_end = time.perf_counter() + budget_s
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feed)
        times.append(time.perf_counter() - t0)
        if time.perf_counter() > t_end and len(times) >= 3:
            break
    return float((np.min(times) if stat == "min" else np.median(times)) * 1000.0)


def latency_ratio(fp32: str | Path | bytes, int8: str | Path | bytes, feed: dict[str, np.ndarray], *,
                  threads: int = 2, runs: int = 20, budget_s: float = 5.0) -> dict[str, float]:
    """``{'fp32_ms', 'int8_ms', 'speedup'}`` with speedup = fp32_ms / int8_ms (> 1: INT8 is faster).

    The two models are timed alternately, twice each, and the fastest run of each kept, so a noisy
    neighbour on a shared machine hurts both alike and the ratio stays meaningful.
    """
    kw = dict(threads=threads, runs=runs, budget_s=budget_s / 4, stat="min", warmup=2)
    f1 = latency_ms(fp32, feed, **kw)
    i1 = latency_ms(int8, feed, **kw)
    f2 = latency_ms(fp32, feed, **kw)
    i2 = latency_ms(int8, feed, **kw)
    f, i = min(f1, f2), min(i1, i2)
    return {"fp32_ms": f, "int8_ms": i, "speedup": f / i if i > 0 else float("nan"), "threads": float(threads)}


def peak_rss_mb() -> float:
    """This process's peak resident memory (MB) so far (:func:`vitexport.memory.process_peak_bytes`:
    ``VmHWM``, which starts afresh at ``exec``, unlike ``ru_maxrss``)."""
    from ..memory import process_peak_bytes

    return (process_peak_bytes() or 0) / 2**20


_CHILD = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from pathlib import Path
import numpy as np
args = json.loads(sys.argv[1])
if args["with_torch"]:
    import torch  # the pipeline's process has it; count it
from vitexport.recipe import load_recipe
from vitexport.quantize.bench import peak_rss_mb
base = peak_rss_mb()
recipe = load_recipe(args["recipe"], args["overrides"])
from vitexport.calibration import load_samples, random_samples
example = {k: np.zeros(shape, dtype) for k, (shape, dtype) in args["inputs"].items()}
if args["data"]:
    samples = load_samples(args["data"], example, num_samples=args["num_samples"], seed=0)
else:
    samples = random_samples(example, args["num_samples"], seed=0)
from vitexport.quantize import quantize_int8
work = Path(args["work"])
rep = quantize_int8(Path(args["fp32"]), work / "model.int8.onnx", samples, recipe, work)
print(json.dumps({"peak_rss_mb": peak_rss_mb(), "import_rss_mb": base, "report": rep.to_dict()}))
"""


def _input_specs(path: str | Path) -> dict[str, tuple[list[int], str]]:
    """Data inputs of a model (read here, so the measured child never loads the model twice)."""
    import onnx

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
                               timeout: float = 3600) -> dict:
    """Peak RSS (MB) of a child process running ``quantize_int8`` on ``num_samples`` samples.

    Args:
        fp32_path: the float ONNX model.
        num_samples: calibration samples (random ones unless ``data`` is given).
        work_dir: where the child writes its artifacts (a fresh folder; nothing is reused).
        recipe: recipe name or path; ``overrides`` are ``key=value`` strings (e.g. ``calibration.method=entropy``).
        data: an image folder or ``.npz`` (default: random samples).
        with_torch: import torch in the child first, as the pipeline's process does (~0.5 GB).
    Returns:
        ``{'peak_rss_mb', 'import_rss_mb', 'report', 'seconds'}``.
    """
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    overrides = list(overrides) + [f"calibration.num_samples={num_samples}", "calibration.reuse=false",
                                   "quantization.measure_latency=false", "quantization.fallback.enabled=false"]
    args = {"fp32": str(fp32_path), "num_samples": num_samples, "work": str(work), "recipe": recipe,
            "overrides": overrides, "data": str(data) if data else None, "inputs": _input_specs(fp32_path), "with_torch": with_torch}
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args)], capture_output=True, text=True,
                         timeout=timeout, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"memory measurement failed:\n{res.stderr[-4000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["seconds"] = time.perf_counter() - t0
    return out
