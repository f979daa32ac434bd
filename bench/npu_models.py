"""Models of the NPU bench that bench/models.py does not have: a shrunk timm Swin-T (shifted windows,
so a window mask on every other block), random weights, seeded, built through vitexport's
``python:bench/npu_models.py:swin_shrunk`` URI."""
from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["swin_shrunk", "prepare_swin", "SWIN_TITLE"]

SWIN_TITLE = "Swin-T shrunk (timm, 32x32, window 4, depths 2-2, shifted-window masks)"
_URI = f"python:{Path(__file__).resolve()}:swin_shrunk"


def swin_shrunk():
    """timm's Swin-T at 32x32 with window 4, two stages of two blocks (the second block of each shifts
    its windows and masks across them), 10 classes, seed 0."""
    import timm
    import torch

    torch.manual_seed(0)
    return timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=32, window_size=4,
                             depths=(2, 2), num_heads=(2, 4), embed_dim=32, num_classes=10).eval()


def prepare_swin(work: Path, n_calib: int = 64, n_heldout: int = 32) -> dict:
    """Calibration and held-out image-like data, and the torch model's logits on the held-out part."""
    import torch

    from bench.models import smooth_images

    work.mkdir(parents=True, exist_ok=True)
    x = (smooth_images(n_calib + n_heldout, 32, 3, seed=1).astype(np.float32) - 0.45) / 0.25
    calib, heldout, reference = work / "calib.npz", work / "heldout.npz", work / "reference.npz"
    np.savez(calib, x=x[:n_calib])
    np.savez(heldout, x=x[n_calib:])
    with torch.no_grad():
        np.savez(reference, logits=swin_shrunk()(torch.from_numpy(x[n_calib:])).numpy())
    return {"uri": _URI, "weights": None, "calib": str(calib), "heldout": str(heldout), "reference": str(reference),
            "notes": ["random weights (timm init, seed 0); synthetic smooth images"]}
