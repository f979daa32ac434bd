"""Train the bundled demo ViT on scikit-learn's handwritten digits, deterministically and offline.

Writes vitexport/demo/demo_vit.safetensors, vitexport/demo/calib.npz (no labels: calibration needs
none) and vitexport/demo/heldout.npz (with labels ``y``: the parity/accuracy split): package data,
so an installed vitexport carries them.
Run with ``make demo-model``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vitexport.demo import DEMO_CALIB, DEMO_HELDOUT, DEMO_WEIGHTS  # noqa: E402
from vitexport.demo.model import DEMO_CONFIG, build_demo_vit  # noqa: E402
from vitexport.io import atomic_path  # noqa: E402

N_CALIB, N_HELDOUT = 200, 400


def preprocess(images: np.ndarray) -> np.ndarray:
    """8x8 digits in 0..16 → (N, 1, 16, 16) float32 normalised to mean 0.5 / std 0.5."""
    x = torch.from_numpy(images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    size = DEMO_CONFIG["img_size"]
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return ((x - 0.5) / 0.5).numpy().astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--epochs", type=int, default=60)
    args = ap.parse_args()

    from safetensors.torch import save_file
    from sklearn.datasets import load_digits

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # bit-for-bit reproducible reductions
    digits = load_digits()
    x_all, y_all = preprocess(digits.images), digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x_all))
    held, calib, train = order[:N_HELDOUT], order[N_HELDOUT : N_HELDOUT + N_CALIB], order[N_HELDOUT + N_CALIB :]

    model = build_demo_vit()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=args.epochs * ((len(train) + 63) // 64))
    xt, yt = torch.from_numpy(x_all[train]), torch.from_numpy(y_all[train])
    g = torch.Generator().manual_seed(0)
    for epoch in range(args.epochs):
        model.train()
        perm = torch.randperm(len(xt), generator=g)
        for i in range(0, len(xt), 64):
            idx = perm[i : i + 64]
            xb = xt[idx]
            # light augmentation: one-pixel shifts keep the tiny model from memorising
            shift = tuple(int(s) for s in torch.randint(-1, 2, (2,), generator=g))
            xb = torch.roll(xb, shifts=shift, dims=(2, 3))
            loss = F.cross_entropy(model(xb), yt[idx], label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        if (epoch + 1) % 10 == 0:
            model.eval()
            with torch.no_grad():
                acc = (model(torch.from_numpy(x_all[held])).argmax(1).numpy() == y_all[held]).mean()
            print(f"epoch {epoch + 1:3d}  loss {loss.item():.3f}  held-out accuracy {acc:.4f}")

    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    with atomic_path(DEMO_WEIGHTS) as tmp:
        save_file(state, str(tmp), metadata={"dataset": "sklearn.datasets.load_digits", "epochs": str(args.epochs)})
    with atomic_path(DEMO_CALIB) as tmp:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, x=x_all[calib])
    with atomic_path(DEMO_HELDOUT) as tmp:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, x=x_all[held], y=y_all[held])
    print(f"wrote {DEMO_WEIGHTS.relative_to(ROOT)}, {DEMO_CALIB.relative_to(ROOT)}, {DEMO_HELDOUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
