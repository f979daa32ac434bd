"""Issue 19's generator of hard cases: a seeded distribution of transformers with the outlier structure
trained ones have, tuned on its even seeds and reported on its odd ones.

One seed draws one :class:`GenSpec` (:func:`draw`): width (ViT-S 384 / 6 heads, or ViT-B 768 / 12 heads),
depth, resolution, pre-LN (timm's block) or post-LN (BERT's order), GELU or ReLU MLPs, then the planted
structure (:func:`plant`):

* **LayerNorm outlier channels**: 2–8 channels with gain ×10–×60 (±10 % per channel) and a bias shift of
  up to ±factor, either the *same* channels in every LayerNorm (what the older bench had) or chosen
  *independently per LayerNorm*. In a pre-LN model the Linears reading the LayerNorm undo it exactly
  (the float function is unchanged, the quantized inputs carry the outliers); in a post-LN model the
  LayerNorm output is also the residual stream, so the outliers travel on (massive activations).
* **residual-stream outliers** (pre-LN): 1–3 channels of the patch embedding / CLS / position embedding
  ×10–×30; **sink tokens** (pre-LN): 1–3 patch positions whose position embedding writes ±100–500 into
  those channels.
* **images**: crops of real photographs shipped by installed packages (:mod:`bench.photos`) or, for a
  quarter of the seeds, synthetic smooth noise (:func:`bench.models.smooth_images`).

The model reaches vitexport as ``python:bench/work/<case>/model.py:build`` (a three-line file calling
:func:`bench.arch.build_gen_vit` with the case's config) plus ``--weights``, as a user's own model would.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .photos import crops, normalize

__all__ = ["GenSpec", "draw", "plant", "write_model_file", "prepare_gen", "HELD_OUT", "is_held_out"]

ARCH = Path(__file__).resolve().parent / "arch.py"

WIDTHS = {"S": (384, 6), "B": (768, 12)}


@dataclass(frozen=True)
class GenSpec:
    """One drawn case. ``outliers``: ``shared`` | ``independent``; ``images``: ``photo`` | ``smooth``."""

    seed: int
    width: str
    depth: int
    img: int
    norm: str
    act: str
    outliers: str
    ln_channels: int
    factor: float
    bias_shift: float
    res_channels: int
    sinks: int
    sink_value: float
    images: str
    patch: int = 16
    num_classes: int = 100

    @property
    def config(self) -> dict:
        """Arguments of :func:`bench.arch.build_gen_vit`."""
        dim, heads = WIDTHS[self.width]
        return {"img_size": self.img, "patch_size": self.patch, "embed_dim": dim, "depth": self.depth,
                "num_heads": heads, "num_classes": self.num_classes, "norm": self.norm, "act": self.act}

    def title(self) -> str:
        dim, _ = WIDTHS[self.width]
        extra = [f"res ×{self.res_channels}ch" if self.res_channels else "", f"{self.sinks} sinks" if self.sinks else ""]
        return (f"ViT-{self.width} d{self.depth} {self.img}px {self.norm}-LN {self.act.upper()}, LN outliers "
                f"{self.outliers} {self.ln_channels}ch ×{self.factor:.0f}" + "".join(f", {e}" for e in extra if e)
                + f", {self.images} images")


#: the half that counts: odd seeds are never used to tune anything
HELD_OUT = "odd"


def is_held_out(seed: int) -> bool:
    """Odd seeds are the held-out half (reported, never tuned on); even seeds may be tuned on."""
    return seed % 2 == 1


def draw(seed: int) -> GenSpec:
    """The case of ``seed`` (a pure function of it)."""
    rng = np.random.default_rng(19_000 + seed)
    width = "B" if rng.random() < 0.25 else "S"
    depth = int(rng.choice((6, 8)) if width == "B" else rng.choice((6, 8, 12)))
    img = int(rng.choice((128, 160)) if width == "B" else rng.choice((96, 128, 160)))
    norm = "post" if rng.random() < 0.3 else "pre"
    act = "relu" if rng.random() < 0.3 else "gelu"
    outliers = "independent" if rng.random() < 0.5 else "shared"
    ln_channels = int(rng.integers(2, 9))
    factor = float(np.round(rng.uniform(10.0, 60.0), 1))
    bias_shift = float(np.round(rng.uniform(0.0, 1.0), 2))
    pre = norm == "pre"
    res_channels = int(rng.integers(1, 4)) if pre and rng.random() < 0.5 else 0
    sinks = int(rng.integers(1, 4)) if res_channels and rng.random() < 0.6 else 0
    sink_value = float(np.round(rng.uniform(100.0, 500.0))) if sinks else 0.0
    images = "smooth" if rng.random() < 0.25 else "photo"
    return GenSpec(seed, width, depth, img, norm, act, outliers, ln_channels, factor, bias_shift, res_channels, sinks,
                   sink_value, images)


def _ln_pairs(model, post: bool):
    """(LayerNorm, the Linears reading its output) pairs of a timm VisionTransformer."""
    blocks = list(model.blocks)
    if not post:
        return [(b.norm1, [b.attn.qkv]) for b in blocks] + [(b.norm2, [b.mlp.fc1]) for b in blocks] + [(model.norm, [model.head])]
    # post-LN: norm_pre feeds block 0's qkv; a block's norm1 its fc1; its norm2 the next block's qkv (the head
    # reads the CLS token of the last norm2)
    pairs = [(model.norm_pre, [blocks[0].attn.qkv])]
    for i, b in enumerate(blocks):
        pairs.append((b.norm1, [b.mlp.fc1]))
        pairs.append((b.norm2, [blocks[i + 1].attn.qkv] if i + 1 < len(blocks) else [model.head]))
    return pairs


def plant(model, spec: GenSpec) -> dict:
    """Plant the spec's outliers into a :func:`bench.arch.build_gen_vit` model, in place. Returns what
    was planted (channel indices per LayerNorm, residual channels, sink positions)."""
    import torch

    g = torch.Generator().manual_seed(spec.seed)
    dim = model.embed_dim
    shared = torch.randperm(dim, generator=g)[: spec.ln_channels]
    planted: dict = {"ln": []}
    with torch.no_grad():
        for norm, linears in _ln_pairs(model, spec.norm == "post"):
            idx = shared if spec.outliers == "shared" else torch.randperm(dim, generator=g)[: spec.ln_channels]
            a = 1.0 + 0.3 * torch.randn(dim, generator=g).abs()  # trained affines are not all ones
            b = 0.1 * torch.randn(dim, generator=g)
            f = spec.factor * (0.9 + 0.2 * torch.rand(len(idx), generator=g))
            sign = torch.where(torch.rand(len(idx), generator=g) < 0.5, -1.0, 1.0)
            a[idx] *= f
            b[idx] += spec.bias_shift * f * torch.rand(len(idx), generator=g) * sign
            norm.weight.mul_(a)
            norm.bias.mul_(a).add_(b)
            for lin in linears:  # LN'(x) = a·LN(x) + b; the Linear takes W/a, bias − W·(b/a)
                w = lin.weight.clone()
                lin.weight.copy_(w / a)
                lin.bias.sub_(w @ (b / a))
            planted["ln"].append(idx.tolist())
        if spec.res_channels:
            planted.update(_plant_residual(model, spec, g))
    return planted


def _plant_residual(model, spec: GenSpec, g) -> dict:
    import torch

    res = torch.randperm(model.embed_dim, generator=g)[: spec.res_channels]
    rf = 10.0 + 20.0 * torch.rand(len(res), generator=g)
    model.patch_embed.proj.weight[res] *= rf.view(-1, 1, 1, 1)
    if model.patch_embed.proj.bias is not None:
        model.patch_embed.proj.bias[res] *= rf
    model.cls_token[..., res] *= rf
    model.pos_embed[..., res] *= rf
    n_patches, prefix = model.patch_embed.num_patches, model.num_prefix_tokens
    pos = (prefix + torch.randperm(n_patches, generator=g)[: spec.sinks]).tolist()
    signs = torch.tensor([1.0 if i % 2 == 0 else -0.8 for i in range(len(res))])
    for p in pos:
        model.pos_embed[0, p, res] += spec.sink_value * signs
    return {"res_channels": res.tolist(), "res_factors": [round(float(x), 1) for x in rf], "sink_positions": pos}


def write_model_file(work: Path, spec: GenSpec) -> Path:
    """``work/model.py``: the ``python:`` entry point vitexport loads (architecture only; weights separate)."""
    text = (f'"""Bench case gen seed {spec.seed}: {spec.title()} (written by bench/gen.py)."""\n'
            "import importlib.util\n\n"
            f"_spec = importlib.util.spec_from_file_location('bench_arch_by_path', {str(ARCH)!r})\n"
            "_arch = importlib.util.module_from_spec(_spec)\n_spec.loader.exec_module(_arch)\n"
            f"CONFIG = {json.dumps(spec.config)}\n\n\n"
            "def build():\n    return _arch.build_gen_vit(**CONFIG)\n")
    path = work / "model.py"
    path.write_text(text)
    return path


def _images(spec: GenSpec, n: int, split: str, offset: int) -> np.ndarray:
    if spec.images == "photo":
        return normalize(crops(n, spec.img, seed=spec.seed * 10 + offset, split=split))
    from .models import _normalize, smooth_images

    x = smooth_images(n, spec.img, 3, seed=spec.seed * 10 + offset)
    return _normalize(x, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


def prepare_gen(spec: GenSpec, work: Path, max_calib: int, n_parity: int, n_score: int) -> tuple[object, dict]:
    """Build, plant and save the case; write its three splits. Returns (torch model, info)."""
    import importlib.util

    import torch
    from safetensors.torch import save_file

    loader = importlib.util.spec_from_file_location("bench_arch_by_path", ARCH)
    arch = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(arch)
    torch.manual_seed(spec.seed)
    model = arch.build_gen_vit(**spec.config)
    planted = plant(model, spec)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(work / "weights.safetensors"))
    model_py = write_model_file(work, spec)
    for name, n, off in (("calib", max_calib, 1), ("parity", n_parity, 2), ("score", n_score, 3)):
        np.savez(work / f"{name}.npz", x=_images(spec, n, name, off))
    (work / "spec.json").write_text(json.dumps(asdict(spec), indent=1))
    ln = planted.pop("ln")
    notes = [f"seed {spec.seed} ({'held out' if is_held_out(spec.seed) else 'tuning half'}): {spec.title()}",
             f"planted: LN channels {ln[0]}{' (all LNs)' if spec.outliers == 'shared' else ' (first LN; each LN its own)'}"
             + (f", {planted}" if planted else "")]
    return model.eval(), {"uri": f"python:{model_py}:build", "notes": notes, "spec": asdict(spec)}
