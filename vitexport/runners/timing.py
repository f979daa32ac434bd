"""Latency of a model in ONNX Runtime, for ``quantization.measure_latency`` (off by default).

A run does not time its models unless asked: two more ONNX Runtime sessions cost memory and seconds,
and a latency measured on the host says little about the target. ``make bench`` holds the careful
comparison (interleaved sessions, many runs, peers in the same run).
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from .sessions import TIMING, Session

__all__ = ["latency_ms", "latency_ratio"]


def latency_ms(model: str | Path | bytes, feed: dict[str, np.ndarray], *, threads: int = 2,
               warmup: int = 3, runs: int = 20, budget_s: float = 5.0, stat: str = "median") -> float:
    """Latency (ms) of one ``session.run`` on ``feed``.

    Args:
        model: an ONNX file or its bytes.
        feed: input name -> array (names the model does not take are dropped).
        threads: intra-op threads.
        warmup: untimed runs first.
        runs: timed runs at most; timing stops early after ``budget_s`` (and at least 3 runs).
        stat: ``median`` or ``min`` of the runs (``min`` is steadier on a shared machine).
    Returns:
        Milliseconds.
    """
    sess = Session(model, replace(TIMING, threads=threads))
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
    """FP32 and INT8 latency of one network and their ratio.

    The two models are timed alternately, twice each, and the fastest run of each kept, so a noisy
    neighbour on a shared machine hurts both alike and the ratio stays meaningful.

    Returns:
        ``{'fp32_ms', 'int8_ms', 'speedup', 'threads'}`` with speedup = fp32_ms / int8_ms (> 1: INT8 is faster).
    """
    kw = dict(threads=threads, runs=runs, budget_s=budget_s / 4, stat="min", warmup=2)
    f1 = latency_ms(fp32, feed, **kw)
    i1 = latency_ms(int8, feed, **kw)
    f2 = latency_ms(fp32, feed, **kw)
    i2 = latency_ms(int8, feed, **kw)
    f, i = min(f1, f2), min(i1, i2)
    return {"fp32_ms": f, "int8_ms": i, "speedup": f / i if i > 0 else float("nan"), "threads": float(threads)}
