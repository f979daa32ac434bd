"""Real photographs that installed packages ship (no download), cut into crops: the bench's real image
statistics.

Sources (all inside the wheels the project installs): scikit-image's bundled ``skimage.data`` images
(astronaut, chelsea, coffee, rocket, hubble_deep_field, immunohistochemistry, retina, the motorcycle
stereo pair; camera, coins, moon, brick, grass, gravel as grey), scikit-learn's ``load_sample_images``
(china, flower) and matplotlib's ``grace_hopper.jpg``. scikit-image's other images are downloaded on
first use and are not listed here.

Crops are taken inside *tiles*: each photo is cut into a grid of tiles, and a tile belongs to exactly
one split (a seeded assignment), so calibration, parity and score crops never share a pixel.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = ["PHOTOS", "photo", "tile_split", "crops", "IMAGENET_MEAN", "IMAGENET_STD", "normalize"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: name → loader; every one of them reads a file inside an installed package
PHOTOS: tuple[str, ...] = (
    "astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry", "retina",
    "motorcycle_left", "motorcycle_right", "china", "flower", "grace_hopper",
    "camera", "coins", "moon", "brick", "grass", "gravel",
)


def _load(name: str) -> np.ndarray:
    if name in ("china", "flower"):
        from sklearn.datasets import load_sample_image

        return load_sample_image(f"{name}.jpg")
    if name == "grace_hopper":
        from matplotlib import cbook
        from PIL import Image

        with cbook.get_sample_data("grace_hopper.jpg") as f:
            return np.asarray(Image.open(f).convert("RGB"))
    import skimage.data as data

    if name.startswith("motorcycle_"):
        left, right, _ = data.stereo_motorcycle()
        return left if name.endswith("left") else right
    return getattr(data, name)()


@lru_cache(maxsize=None)
def photo(name: str) -> np.ndarray:
    """One photo as H×W×3 uint8 (grey ones repeated over three channels)."""
    if name not in PHOTOS:
        raise KeyError(f"unknown photo {name!r}; known: {', '.join(PHOTOS)}")
    im = np.asarray(_load(name))
    if im.dtype == bool:
        im = im.astype(np.uint8) * 255
    if im.ndim == 2:
        im = np.repeat(im[:, :, None], 3, axis=2)
    return np.ascontiguousarray(im[:, :, :3].astype(np.uint8))


def tile_split(shape: tuple[int, int], tile: int, fractions: dict[str, float], seed: int) -> dict[str, list[tuple[int, int]]]:
    """The tiles (top-left corners) of an image of ``shape``, assigned to splits in ``fractions``."""
    h, w = shape
    corners = [(y, x) for y in range(0, h - tile + 1, tile) for x in range(0, w - tile + 1, tile)]
    order = np.random.default_rng(seed).permutation(len(corners))
    out: dict[str, list[tuple[int, int]]] = {}
    start = 0
    names = list(fractions)
    for i, name in enumerate(names):
        k = len(corners) - start if i == len(names) - 1 else int(round(fractions[name] * len(corners)))
        out[name] = [corners[j] for j in order[start : start + k]]
        start += k
    return out


def crops(n: int, size: int, seed: int, split: str, names: tuple[str, ...] = PHOTOS, tile: int = 96,
          fractions: dict[str, float] | None = None, labels: bool = False):
    """``n`` crops resized to ``size``×``size``, float32 NCHW in [0, 1] (and the photo index of each
    when ``labels``).

    Each crop lies inside one tile of ``split`` (tiles assigned once per photo by ``tile_split`` with a
    fixed seed, so every call agrees on them); its side is 40–100 % of the tile, at a random place, with
    a random horizontal flip, resized bilinearly.
    """
    import torch
    import torch.nn.functional as F

    fractions = fractions or {"train": 0.55, "calib": 0.15, "parity": 0.15, "score": 0.15}
    rng = np.random.default_rng(seed)
    tiles = {nm: tile_split(photo(nm).shape[:2], tile, fractions, seed=17 + i)[split] for i, nm in enumerate(names)}
    out = np.empty((n, 3, size, size), np.float32)
    ys = np.empty(n, np.int64)
    for i in range(n):
        k = int(rng.integers(len(names)))
        im, cand = photo(names[k]), tiles[names[k]]
        ty, tx = cand[int(rng.integers(len(cand)))]
        side = int(rng.integers(int(0.4 * tile), tile + 1))
        y0, x0 = ty + int(rng.integers(tile - side + 1)), tx + int(rng.integers(tile - side + 1))
        patch = torch.from_numpy(im[y0 : y0 + side, x0 : x0 + side].astype(np.float32) / 255.0).permute(2, 0, 1)[None]
        patch = F.interpolate(patch, size=(size, size), mode="bilinear", align_corners=False, antialias=True)[0]
        if rng.random() < 0.5:
            patch = patch.flip(-1)
        out[i], ys[i] = patch.clamp(0, 1).numpy(), k
    return (out, ys) if labels else out


def normalize(x: np.ndarray, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> np.ndarray:
    """``(x − mean) / std`` per channel, float32 (NCHW)."""
    m = np.asarray(mean, np.float32).reshape(1, -1, 1, 1)
    s = np.asarray(std, np.float32).reshape(1, -1, 1, 1)
    return ((x - m) / s).astype(np.float32)
