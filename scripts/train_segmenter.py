"""Train the bench's segmenter: a small Hugging Face ``SegformerForSemanticSegmentation`` (:data:`bench.dense.SEGFORMER`:
Mix Transformer encoder with reduction-conv attention, all-MLP decoder) on :mod:`bench.dense` scenes (background +
3 shape classes per pixel), offline, on 1 thread, Hugging Face's own loss (logits upsampled to the mask, cross-entropy).

Writes to ``--out``: ``model/`` (a Hugging Face folder: ``hf:<out>/model``), ``calib.npz``, ``parity.npz``,
``score.npz`` (``x``), ``labels_*.npz`` and ``meta.json`` with the held-out mIoU against the labels.
``--tiny`` is the tests' setting.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from _train_dense import SIZES, TINY_SIZES, fit, seeded, splits, train_set, write_case

from bench.dense import CLASSES, SCENE, build_segformer

__all__ = ["main", "heldout_miou", "upsampled_argmax"]

TINY = dict(hidden_sizes=[8, 8, 8, 8], decoder_hidden_size=8)


def upsampled_argmax(logits: np.ndarray, size: int) -> np.ndarray:
    """Classes per pixel at the image's size: logits upsampled bilinearly, as Hugging Face's
    ``post_process_semantic_segmentation`` does, then argmax."""
    t = torch.nn.functional.interpolate(torch.from_numpy(logits), size=(size, size), mode="bilinear", align_corners=False)
    return t.argmax(1).numpy()


def heldout_miou(pred: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    """mIoU over the classes (background included) and pixel accuracy of ``pred`` against the labelled masks."""
    c = len(CLASSES) + 1
    conf = np.bincount((mask.astype(np.int64) * c + pred).ravel(), minlength=c * c).reshape(c, c)
    inter = np.diag(conf).astype(np.float64)
    union = conf.sum(0) + conf.sum(1) - inter
    return float((inter[union > 0] / union[union > 0]).mean()), float(inter.sum() / conf.sum())


def predict(model, x: np.ndarray) -> np.ndarray:
    """The model's logits on ``x``, in batches."""
    model.eval()
    with torch.no_grad():
        return torch.cat([model(pixel_values=torch.from_numpy(x[i : i + 128])).logits for i in range(0, len(x), 128)]).numpy()


def main(argv: list[str] | None = None) -> dict:
    """Train and write the outputs; returns ``meta``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--train-scenes", type=int, default=8000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="a tiny model, a few steps, small splits (tests)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    seeded(a.seed)
    steps, n_train = (4, 64) if a.tiny else (a.steps, a.train_scenes)
    held = splits(TINY_SIZES if a.tiny else SIZES)
    train = train_set(n_train)
    model = build_segformer(**(TINY if a.tiny else {}))
    rng = np.random.default_rng(a.seed + 1)
    x_all, y_all = torch.from_numpy(train["x"]), torch.from_numpy(train["mask"])

    def step(_: int) -> torch.Tensor:
        idx = torch.from_numpy(rng.choice(n_train, a.batch, replace=False))
        flip = torch.from_numpy(rng.random(a.batch) < 0.5)
        x, y = x_all[idx], y_all[idx]
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        y = torch.where(flip[:, None, None], y.flip(-1), y)
        return model(pixel_values=x, labels=y).loss

    def evaluate() -> str:
        miou, acc = heldout_miou(upsampled_argmax(predict(model, held["parity"]["x"]), SCENE["size"]), held["parity"]["mask"])
        return f"parity mIoU {miou:.3f} pixel acc {acc:.3f}"

    fit(model, step, steps, a.lr, 0.01, max(1, steps // 10), evaluate)
    figures = {k: dict(zip(("miou", "pixel_accuracy"), heldout_miou(
        upsampled_argmax(predict(model, held[k]["x"]), SCENE["size"]), held[k]["mask"]))) for k in ("parity", "score")}
    meta = {"dataset": f"bench.dense scenes {SCENE['size']}x{SCENE['size']}, 1-3 shapes (square/disc/triangle), "
                       f"{n_train} training scenes with flips", "model": "SegformerForSemanticSegmentation",
            "steps": steps, "batch": a.batch, "seed": a.seed, "splits": {k: len(v["x"]) for k, v in held.items()},
            "heldout_vs_labels": figures, "seconds": round(time.perf_counter() - t0, 1)}
    write_case(a.out, model, held, meta, SCENE["max_objects"])
    print(f"wrote {a.out}: {figures} in {meta['seconds']} s")
    return meta


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
