"""Train one of the bench's conv-attention hybrids (``bench/arch.py`` :data:`HYBRIDS`), deterministically,
offline, on 1 thread: timm's own model at 64×64 with a 10-class head, on 64×64 crops of 10 photos that
scikit-image / scikit-learn ship (:mod:`bench.photos`; the class is which photo a crop comes from).

The recipe is timm's usual one for small CNN-attention models: AdamW with linear warm-up and cosine decay,
label smoothing 0.1, random crops at random scale with flips and brightness / contrast jitter. Every photo is
cut into 96-pixel tiles and a tile belongs to one split (train, calib, parity, score), so held-out crops
never share a pixel with what was trained or calibrated on. BatchNorm runs in train mode, so its running
statistics are the trained model's, and the export folds them into the convs (as a user's would).

The models train in ``channels_last``: PyTorch's CPU depthwise-conv backward is ~20× faster in that layout
(measured here: MobileViT-XXS 5.1 s → 0.25 s per batch of 64 on 2 threads); the weights are the same.

Writes to ``--out``: ``weights.safetensors`` (a plain timm state dict), ``calib.npz`` (``x``), ``parity.npz``
and ``score.npz`` (``x``, ``y``), ``meta.json``. ``--tiny`` is the tests' setting.
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

from bench import arch
from bench.photos import crops, normalize

__all__ = ["CLASSES", "SIZES", "main"]

#: ten photos with enough 96-pixel tiles for four splits, colour and grey, textured and smooth
CLASSES = ("astronaut", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry", "retina", "motorcycle_left",
           "china", "flower", "camera")
SIZES = {"calib": 256, "parity": 256, "score": 512}


def _jitter(x: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
    """Brightness / contrast jitter per crop (in [0, 1]), then ImageNet normalisation, channels_last."""
    b = rng.uniform(-0.1, 0.1, (len(x), 1, 1, 1)).astype(np.float32)
    c = rng.uniform(0.8, 1.2, (len(x), 1, 1, 1)).astype(np.float32)
    m = x.mean(axis=(1, 2, 3), keepdims=True)
    return torch.from_numpy(normalize(np.clip((x - m) * c + m + b, 0.0, 1.0))).contiguous(memory_format=torch.channels_last)


def _accuracy(model, x: np.ndarray, y: np.ndarray) -> float:
    model.eval()
    with torch.no_grad():
        xs = torch.from_numpy(x).contiguous(memory_format=torch.channels_last)
        pred = torch.cat([model(xs[i : i + 256]) for i in range(0, len(x), 256)]).argmax(1).numpy()
    return float((pred == y).mean())


def _train(model, epochs: int, per_epoch: int, seed: int, size: int, lr: float) -> None:
    batch = 64
    steps = epochs * math.ceil(per_epoch / batch)
    warm = max(1, steps // 20)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
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


def main(key: str, argv: list[str] | None = None, epochs: int = 12, lr: float = 2e-3) -> dict:
    """Train the :data:`bench.arch.HYBRIDS` model ``key`` and write the outputs; returns ``meta``."""
    ap = argparse.ArgumentParser(description=f"train the bench's {key} ({arch.HYBRIDS[key]['name']})")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--epochs", type=int, default=epochs)
    ap.add_argument("--per-epoch", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="1 short epoch, small splits (tests)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    deterministic(a.seed)
    size = arch.HYBRIDS[key]["img_size"]
    sizes = {k: 24 for k in SIZES} if a.tiny else SIZES
    held = {k: crops(n, size, seed=a.seed + 101 + i, split=k, names=CLASSES, labels=True)
            for i, (k, n) in enumerate(sizes.items())}
    held = {k: (normalize(x), y) for k, (x, y) in held.items()}
    model = getattr(arch, f"build_{key}")().to(memory_format=torch.channels_last)
    _train(model, 1 if a.tiny else a.epochs, 128 if a.tiny else a.per_epoch, a.seed, size, lr)
    model.eval()
    meta = {
        "dataset": f"{size}x{size} crops of {len(CLASSES)} photos shipped by scikit-image / scikit-learn "
                   "(class = which photo), tiles split between train / calib / parity / score",
        "config": dict(arch.HYBRIDS[key]), "epochs": 1 if a.tiny else a.epochs, "seed": a.seed,
        "splits": {k: len(v[1]) for k, v in held.items()}, "classes": list(CLASSES),
        "fp32_accuracy": {k: _accuracy(model, *held[k]) for k in ("parity", "score")},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    arrays = {"calib": {"x": held["calib"][0]},
              "parity": {"x": held["parity"][0], "y": held["parity"][1]},
              "score": {"x": held["score"][0], "y": held["score"][1]}}
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_outputs(a.out, state, arrays, meta)
    print(f"wrote {a.out}: {meta['fp32_accuracy']} in {meta['seconds']} s")
    return meta
