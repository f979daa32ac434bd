"""Train the bench's photo Swin (``bench/arch.py:photo_swin``), deterministically, offline, on 1 thread.

A recipe unlike the digits ViT's: a Swin transformer (shifted windows, so an additive mask on the
attention logits; relative position bias; patch merging) trained Swin/DeiT-style — AdamW with linear
warm-up and cosine decay, stochastic depth 0.1, label smoothing 0.1, random crops at random scale with
flips and brightness / contrast jitter — on real photographs: 32×32 crops of the 17 photos that
scikit-image, scikit-learn and matplotlib ship (:mod:`bench.photos`), the class being which photo a
crop comes from. Each photo is cut into 96-pixel tiles and each tile belongs to one split (train,
calib, parity, score), so held-out crops never share a pixel with what was trained or calibrated on.

Writes to ``--out``: ``weights.safetensors``, ``calib.npz`` (``x``), ``parity.npz`` and ``score.npz``
(``x``, ``y``), ``meta.json``. Run by the bench's prepare step; ``--tiny`` is the tests' setting.
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from _train_common import deterministic, save_outputs

from bench.arch import PHOTO_SWIN, build_photo_swin
from bench.photos import PHOTOS, crops, normalize

__all__ = ["CLASSES", "main"]

#: the photos that are classes (the right motorcycle view would be the left one's twin)
CLASSES = tuple(p for p in PHOTOS if p != "motorcycle_right")
SIZES = {"calib": 256, "parity": 256, "score": 512}
TINY = dict(embed_dim=16, depths=(1, 1), num_heads=(1, 2))


def _jitter(x: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
    """Brightness / contrast jitter per crop (in [0, 1]), then ImageNet normalisation."""
    b = rng.uniform(-0.1, 0.1, (len(x), 1, 1, 1)).astype(np.float32)
    c = rng.uniform(0.8, 1.2, (len(x), 1, 1, 1)).astype(np.float32)
    m = x.mean(axis=(1, 2, 3), keepdims=True)
    return torch.from_numpy(normalize(np.clip((x - m) * c + m + b, 0.0, 1.0)))


def _accuracy(model, x: np.ndarray, y: np.ndarray) -> float:
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(torch.from_numpy(x[i : i + 256])) for i in range(0, len(x), 256)]).argmax(1).numpy()
    return float((pred == y).mean())


def _train(model, epochs: int, per_epoch: int, seed: int, size: int) -> None:
    batch = 64
    steps = epochs * math.ceil(per_epoch / batch)
    warm = max(1, steps // 20)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, steps - warm))))
    rng = np.random.default_rng(seed + 7)
    for epoch in range(epochs):
        model.train()
        x, y = crops(per_epoch, size, seed=1000 * seed + epoch, split="train", names=CLASSES, labels=True)
        xt, yt = _jitter(x, rng), torch.from_numpy(y)
        for i in range(0, per_epoch, batch):
            loss = F.cross_entropy(model(xt[i : i + batch]), yt[i : i + batch], label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        print(f"epoch {epoch + 1:3d}  loss {loss.item():.3f}", flush=True)


def main(argv: list[str] | None = None) -> dict:
    """Train and write the outputs; returns ``meta``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--epochs", type=int, default=24)
    ap.add_argument("--per-epoch", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="a tiny model, 1 short epoch, small splits (tests)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    deterministic(a.seed)
    size = PHOTO_SWIN["img_size"]
    sizes = {k: 24 for k in SIZES} if a.tiny else SIZES
    held = {k: crops(n, size, seed=a.seed + 101 + i, split=k, names=CLASSES, labels=True)
            for i, (k, n) in enumerate(sizes.items())}
    held = {k: (normalize(x), y) for k, (x, y) in held.items()}
    model = build_photo_swin(**(TINY if a.tiny else {}))
    _train(model, 1 if a.tiny else a.epochs, 128 if a.tiny else a.per_epoch, a.seed, size)
    meta = {
        "dataset": f"32x32 crops of {len(CLASSES)} photos shipped by scikit-image / scikit-learn / matplotlib "
                   "(class = which photo), tiles split between train / calib / parity / score",
        "config": {**PHOTO_SWIN, **(TINY if a.tiny else {})}, "epochs": 1 if a.tiny else a.epochs, "seed": a.seed,
        "splits": {k: len(v[1]) for k, v in held.items()}, "classes": list(CLASSES),
        "fp32_accuracy": {k: _accuracy(model, *held[k]) for k in ("parity", "score")},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    arrays = {"calib": {"x": held["calib"][0]},
              "parity": {"x": held["parity"][0], "y": held["parity"][1]},
              "score": {"x": held["score"][0], "y": held["score"][1]}}
    save_outputs(a.out, model.state_dict(), arrays, meta)
    print(f"wrote {a.out}: {meta['fp32_accuracy']} in {meta['seconds']} s")
    return meta


if __name__ == "__main__":
    main()
