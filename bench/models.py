"""The benchmark's models and data: what is measured, built the same way for both paths.

No network: timm models are built with random weights (``pretrained=False``) and saved to
``.safetensors`` so both paths load the very same tensors. The data is synthetic but image-like
(smooth multi-scale noise squashed into [0, 1], then the model's mean/std), because white Gaussian
noise has none of the spatial correlation that makes real activations what they are.

The outlier-channel ViT plants what trained ViTs grow on their own (DOMAIN.md: residual values up to
|x|≈1400 in ViT-B): a few residual-stream channels ×50–100 larger than the rest, and LayerNorm
gammas/betas on those channels ×50–100, compensated in the next Linear so the float model stays a
sensible function while the activations the quantizer sees carry the outliers.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["ModelSpec", "MODELS", "prepare_model", "smooth_images", "plant_outliers"]


@dataclass(frozen=True)
class ModelSpec:
    """One benchmarked model.

    Attributes:
        key: short name used in tables and file names.
        title: what a reader sees.
        timm_name: the timm architecture, or None for the bundled demo.
        outliers: plant outlier channels (see module docstring).
        heldout: held-out samples for quality (the demo uses its own committed split).
    """

    key: str
    title: str
    timm_name: str | None
    outliers: bool = False
    heldout: int = 64

    @property
    def is_demo(self) -> bool:
        return self.timm_name is None


MODELS: dict[str, ModelSpec] = {
    m.key: m
    for m in (
        ModelSpec("demo", "demo ViT (digits)", None),
        ModelSpec("vit_tiny", "ViT-Tiny/16", "vit_tiny_patch16_224"),
        ModelSpec("vit_tiny_outlier", "ViT-Tiny/16 + outlier channels", "vit_tiny_patch16_224", outliers=True),
        ModelSpec("vit_small", "ViT-Small/16", "vit_small_patch16_224", heldout=48),
        ModelSpec("vit_base", "ViT-B/16", "vit_base_patch16_224", heldout=32),
    )
}


def smooth_images(n: int, size: int, channels: int, seed: int) -> np.ndarray:
    """``n`` image-like arrays in [0, 1], float32, NCHW: a few octaves of upsampled noise.

    Coarse octaves carry most of the energy (like natural images' 1/f spectrum); a sigmoid squashes
    the sum into [0, 1] with some saturated regions, as photos have.
    """
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(seed)
    out = np.empty((n, channels, size, size), dtype=np.float32)
    # In chunks: 256 ViT-B images are 150 MB, their float64 intermediates need not all exist at once.
    for i in range(0, n, 32):
        b = min(32, n - i)
        x = torch.zeros(b, channels, size, size)
        for cells, weight in ((4, 1.0), (8, 0.5), (16, 0.25), (size // 4, 0.12)):
            noise = torch.randn(b, channels, cells, cells, generator=g)
            x += weight * F.interpolate(noise, size=size, mode="bicubic", align_corners=False)
        # A per-image brightness / contrast jitter, so images differ in their global statistics too.
        x = x * (0.8 + 0.8 * torch.rand(b, 1, 1, 1, generator=g)) + 0.5 * torch.randn(b, 1, 1, 1, generator=g)
        out[i : i + b] = torch.sigmoid(1.2 * x).numpy()
    return out


def plant_outliers(model, channels: int = 4, seed: int = 0) -> dict:
    """Give a timm ViT the outlier channels trained ViTs have. Modifies ``model`` in place.

    Returns:
        What was planted (channel indices and factors), for the report.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    dim = model.embed_dim
    idx = torch.randperm(dim, generator=g)[:channels]
    factors = 50.0 + 50.0 * torch.rand(channels, generator=g)  # ×50–100
    with torch.no_grad():
        # Residual stream: the patch embedding, CLS token and position embedding write the outlier
        # channels large; every block adds to the same stream, so they stay large to the end.
        model.patch_embed.proj.weight[idx] *= factors.view(-1, 1, 1, 1)
        model.patch_embed.proj.bias[idx] *= factors
        model.cls_token[..., idx] *= factors
        model.pos_embed[..., idx] *= factors
        # LayerNorm affine on the same channels, compensated in the Linear that reads it: the float
        # function is unchanged, the quantizer sees activations ×50–100 on a few channels.
        for blk in model.blocks:
            for norm, linear in ((blk.norm1, blk.attn.qkv), (blk.norm2, blk.mlp.fc1)):
                norm.weight[idx] *= factors
                norm.bias[idx] *= factors
                linear.weight[:, idx] /= factors
    return {"channels": idx.tolist(), "factors": [round(float(f), 1) for f in factors]}


def _normalize(x: np.ndarray, mean, std) -> np.ndarray:
    m = np.asarray(mean, dtype=np.float32).reshape(1, -1, 1, 1)
    s = np.asarray(std, dtype=np.float32).reshape(1, -1, 1, 1)
    return ((x - m) / s).astype(np.float32)


def prepare_model(spec: ModelSpec, work: Path, max_calib: int, seed: int = 0) -> dict:
    """Write the model's weights, calibration and held-out data, and FP32 reference logits.

    Args:
        spec: the model.
        work: the model's work folder (created).
        max_calib: the most calibration samples any measurement will draw.
        seed: data and weights seed.
    Returns:
        Paths and facts: ``uri``, ``weights``, ``calib``, ``heldout``, ``reference`` (npz with
        ``logits`` of the torch FP32 model on the held-out inputs), ``labels`` (bool), ``notes``.
    """
    import torch

    work.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    if spec.is_demo:
        from vitexport.demo import DEMO_CALIB, DEMO_HELDOUT, DEMO_MODEL_URI, DEMO_WEIGHTS
        from vitexport.demo.model import build_demo_vit
        from vitexport.sources import load_weights

        model = build_demo_vit()
        load_weights(model, DEMO_WEIGHTS)
        uri, weights, calib, heldout = DEMO_MODEL_URI, DEMO_WEIGHTS, DEMO_CALIB, DEMO_HELDOUT
        n_cal = int(np.load(calib)["x"].shape[0])
        notes.append(f"demo: its committed splits ({n_cal} calibration, held-out with labels)")
    else:
        import timm
        from safetensors.torch import save_file
        from timm.data import resolve_data_config

        torch.manual_seed(seed)
        model = timm.create_model(spec.timm_name, pretrained=False)
        if spec.outliers:
            planted = plant_outliers(model, seed=seed)
            notes.append(f"outlier channels {planted['channels']} ×{planted['factors']}")
        cfg = resolve_data_config({}, model=model)
        c, h, _ = cfg["input_size"]
        uri = f"timm:{spec.timm_name}"
        weights = work / "weights.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
        calib = work / "calib.npz"
        heldout = work / "heldout.npz"
        np.savez(calib, x=_normalize(smooth_images(max_calib, h, c, seed=seed + 1), cfg["mean"], cfg["std"]))
        np.savez(heldout, x=_normalize(smooth_images(spec.heldout, h, c, seed=seed + 2), cfg["mean"], cfg["std"]))
        notes.append(f"random weights (timm init, seed {seed}); synthetic smooth images, timm mean/std")
    model.eval()
    held = np.load(heldout)
    x = held["x"]
    with torch.no_grad():
        logits = np.concatenate([model(torch.from_numpy(x[i : i + 8])).numpy() for i in range(0, len(x), 8)])
    reference = work / "reference.npz"
    extra = {"y": held["y"]} if "y" in held.files else {}
    np.savez(reference, logits=logits, **extra)
    top1 = logits.argmax(1)
    facts = {"distinct_top1": int(len(np.unique(top1))), "n_heldout": int(len(x))}
    if "y" in held.files:
        facts["fp32_accuracy"] = float((top1 == held["y"]).mean())
    return {
        "uri": uri, "weights": str(weights), "calib": str(calib), "heldout": str(heldout),
        "reference": str(reference), "labels": "y" in held.files, "notes": notes, **facts,
    }
