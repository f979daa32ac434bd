"""What the dense training scripts (``train_detector.py``, ``train_segmenter.py``) share: the bench's held-out
splits of :mod:`bench.dense` scenes, a warm-up + cosine AdamW loop, and the Hugging Face folder they write."""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

from _train_common import deterministic

from bench.dense import SPLIT_SEEDS, TRAIN_BASE, label_arrays, scenes, write_preprocessor

__all__ = ["SIZES", "TINY_SIZES", "splits", "train_set", "fit", "write_case", "seeded"]

SIZES = {"calib": 256, "parity": 256, "score": 512}
TINY_SIZES = {k: 16 for k in SIZES}


def splits(sizes: dict[str, int]) -> dict[str, dict]:
    """The bench's calib / parity / score scenes, each from its own seed range (disjoint from training)."""
    return {k: scenes(n, SPLIT_SEEDS[k]) for k, n in sizes.items()}


def train_set(n: int) -> dict:
    """``n`` training scenes from :data:`~bench.dense.TRAIN_BASE`."""
    return scenes(n, TRAIN_BASE)


def fit(model, step_fn, steps: int, lr: float, wd: float, log_every: int, evaluate=None) -> None:
    """AdamW, linear warm-up over 5 % then cosine decay; ``step_fn(step)`` returns the loss of one batch;
    gradients clipped at 1.0 (DETR-style set losses spike early)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, steps - warm))))
    t0 = time.perf_counter()
    for step in range(steps):
        model.train()
        loss = step_fn(step)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if (step + 1) % log_every == 0 or step + 1 == steps:
            extra = f"  {evaluate()}" if evaluate is not None else ""
            print(f"step {step + 1:5d}  loss {loss.item():.3f}  {time.perf_counter() - t0:.0f} s{extra}", flush=True)


def write_case(out: Path, model, held: dict[str, dict], meta: dict, most: int) -> None:
    """``model/`` (``save_pretrained`` + ``preprocessor_config.json``: what ``hf:`` loads), ``calib.npz`` /
    ``parity.npz`` / ``score.npz`` (``pixel_values`` only, the ONNX input's name: what vitexport, the peers and the
    scoring feed), ``labels_<split>.npz``, and
    ``meta.json`` last (a folder with it is complete)."""
    out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(str(out / "model"), safe_serialization=True)
    write_preprocessor(out / "model")
    for name, d in held.items():
        for fname, arrays in ((f"{name}.npz", {"pixel_values": d["x"]}), (f"labels_{name}.npz", label_arrays(d, most))):
            with open(out / f"{fname}.tmp", "wb") as fh:
                np.savez(fh, **arrays)
            os.replace(out / f"{fname}.tmp", out / fname)
    (out / "meta.json.tmp").write_text(json.dumps(meta, indent=1))
    os.replace(out / "meta.json.tmp", out / "meta.json")


def seeded(seed: int, threads: int = 1) -> None:
    """:func:`_train_common.deterministic`, but HF's interpolations have no deterministic-algorithms variant
    to insist on (warn only), and ``threads`` torch threads (1: a second thread on a loaded 2-core machine
    spent 5× the CPU time per step spinning)."""
    deterministic(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_num_threads(threads)
