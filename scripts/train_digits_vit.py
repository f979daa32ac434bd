"""Train the bench's digits ViT (``bench/arch.py:digits_vit``), deterministically, offline, on 1 thread.

Harder than the bundled demo: scikit-learn's 8×8 digits rendered at 32×32 through a random affine
warp (rotation, scale, shift) and pixel noise, a fresh draw every epoch, so a held-out image is a
new rendering of a digit the model never saw. The 1797 source digits are split by index into
disjoint sets: ``score`` (held out from every tool: not calibration, not fallback selection, not
gating), ``parity`` (vitexport's ``--parity-data``) and the rest, which is trained on and from
which ``calib`` is drawn (calibrating on training images is the usual practice).

Writes to ``--out``: ``weights.safetensors``, ``calib.npz`` (``x``), ``parity.npz`` and ``score.npz``
(``x``, ``y``), ``meta.json`` (split sizes, FP32 accuracy per split, seconds). Run by the bench's
prepare step; ``--tiny`` is the tests' setting (seconds).
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from _train_common import deterministic, save_outputs, split_indices

from bench.arch import DIGITS, build_digits_vit

__all__ = ["render", "main"]

SIZES = {"score": 600, "parity": 200}
N_CALIB = 256
TINY = dict(embed_dim=32, depth=1, num_heads=2)


def render(images: np.ndarray, size: int, g: torch.Generator, augment: bool = True) -> torch.Tensor:
    """8×8 digits in 0..16 → (N, 1, size, size) normalised to mean 0.5 / std 0.5, warped and noised."""
    x = torch.from_numpy(images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    if augment:
        n = len(x)
        ang = (torch.rand(n, generator=g) - 0.5) * 2 * math.radians(15)
        scale = 0.85 + 0.3 * torch.rand(n, generator=g)
        shift = (torch.rand(n, 2, generator=g) - 0.5) * 0.3
        cos, sin = torch.cos(ang) / scale, torch.sin(ang) / scale
        theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        x = F.grid_sample(x, grid, align_corners=False, padding_mode="zeros")
        x = (x + 0.08 * torch.randn(x.shape, generator=g)).clamp(0, 1)
    return (x - 0.5) / 0.5


def _accuracy(model, x: torch.Tensor, y: np.ndarray) -> float:
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(x[i : i + 256]) for i in range(0, len(x), 256)]).argmax(1).numpy()
    return float((pred == y).mean())


def main(argv: list[str] | None = None) -> dict:
    """Train and write the outputs; returns ``meta``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="a tiny model, 1 epoch, small splits (tests)")
    a = ap.parse_args(argv)
    from sklearn.datasets import load_digits

    t0 = time.perf_counter()
    deterministic(a.seed)
    digits = load_digits()
    images, labels = digits.images, digits.target.astype(np.int64)
    sizes = {"score": 40, "parity": 20} if a.tiny else SIZES
    split = split_indices(len(images), sizes, a.seed)
    if a.tiny:
        split["rest"] = split["rest"][:200]
    epochs = 1 if a.tiny else a.epochs
    model = build_digits_vit(**(TINY if a.tiny else {}))
    size = DIGITS["img_size"]
    g = torch.Generator().manual_seed(a.seed)
    # Fixed renderings for the evaluation splits (drawn once, before training uses the generator).
    held = {k: render(images[split[k]], size, g) for k in ("score", "parity")}
    calib_src = np.sort(np.random.default_rng(a.seed + 1).permutation(split["rest"])[: min(N_CALIB, len(split["rest"]))])
    calib = render(images[calib_src], size, g)
    train = split["rest"]
    yt = torch.from_numpy(labels[train])
    batch = 64
    steps = epochs * math.ceil(len(train) / batch)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps, pct_start=0.15)
    for epoch in range(epochs):
        model.train()
        xt = render(images[train], size, g)  # a fresh augmentation draw every epoch
        perm = torch.randperm(len(train), generator=g)
        for i in range(0, len(train), batch):
            idx = perm[i : i + batch]
            loss = F.cross_entropy(model(xt[idx]), yt[idx], label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        if (epoch + 1) % 10 == 0 or epoch + 1 == epochs:
            acc = _accuracy(model, held["parity"], labels[split["parity"]])
            print(f"epoch {epoch + 1:3d}  loss {loss.item():.3f}  parity-split accuracy {acc:.4f}", flush=True)
    meta = {
        "dataset": "sklearn.datasets.load_digits rendered 32x32 with random affine + noise",
        "config": {**DIGITS, **(TINY if a.tiny else {})}, "epochs": epochs, "seed": a.seed,
        "splits": {"train": len(train), "calib": len(calib_src), "parity": len(split["parity"]), "score": len(split["score"])},
        "calib_sources_in_train": True,
        "fp32_accuracy": {k: _accuracy(model, held[k], labels[split[k]]) for k in ("parity", "score")},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    arrays = {"calib": {"x": calib.numpy()},
              "parity": {"x": held["parity"].numpy(), "y": labels[split["parity"]]},
              "score": {"x": held["score"].numpy(), "y": labels[split["score"]]}}
    save_outputs(a.out, model.state_dict(), arrays, meta)
    print(f"wrote {a.out}: {meta['fp32_accuracy']} in {meta['seconds']} s")
    return meta


if __name__ == "__main__":
    main()
