"""Image folders as calibration data: read any common format, convert to RGB, preprocess like training.

Grayscale, palette, RGBA / LA (the alpha is dropped, as timm's and torchvision's loaders do with
``PIL.Image.convert('RGB')``), CMYK and 16-bit images all become 8-bit RGB before the model's
resize / center crop / normalisation.
"""
from __future__ import annotations

import hashlib
import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageOps

from ..errors import BadInput

if TYPE_CHECKING:  # pragma: no cover
    from ..recipe import PreprocessSpec
    from ..sources.base import Preprocess

__all__ = ["IMAGE_SUFFIXES", "ImagePipeline", "find_images", "read_rgb", "resolve_pipeline", "digest_files", "why_unreadable"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


@dataclass(frozen=True)
class ImagePipeline:
    """Resize the shorter side to ``resize``, center-crop ``crop`` (square or (h, w)), scale to
    [0, 1], normalise with ``mean`` / ``std``; result CHW float32."""

    resize: int
    crop: tuple[int, int]
    interpolation: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    #: where the numbers came from (the model source, the recipe, defaults); said in the report, not
    #: part of :meth:`describe` (the content key): the same numbers from elsewhere give the same inputs
    origin: str = ""

    def describe(self) -> str:
        return (f"resize={self.resize} crop={self.crop[0]}x{self.crop[1]} interpolation={self.interpolation} "
                f"mean={tuple(round(m, 4) for m in self.mean)} std={tuple(round(s, 4) for s in self.std)}")

    def summary(self) -> str:
        """One line a user reads: every step in order, and where its numbers came from."""
        fmt = lambda v: "(" + ", ".join(f"{x:.4g}" for x in v) + ")"  # noqa: E731
        text = (f"resize the shorter side to {self.resize} ({self.interpolation}), center crop {self.crop[0]}x{self.crop[1]}, "
                f"scale to [0, 1], mean {fmt(self.mean)} std {fmt(self.std)}")
        return text + (f"; from {self.origin}" if self.origin else "")

    def to_dict(self) -> dict:
        return {"resize": self.resize, "interpolation": self.interpolation, "crop": list(self.crop),
                "mean": list(self.mean), "std": list(self.std), "origin": self.origin}

    def __call__(self, img) -> np.ndarray:
        interp = {
            "bilinear": Image.Resampling.BILINEAR,
            "bicubic": Image.Resampling.BICUBIC,
            "nearest": Image.Resampling.NEAREST,
            "lanczos": Image.Resampling.LANCZOS,
        }.get(self.interpolation, Image.Resampling.BILINEAR)
        w, h = img.size
        ch, cw = self.crop
        scale = self.resize / min(w, h)
        nw, nh = max(cw, round(w * scale)), max(ch, round(h * scale))
        if (nw, nh) != (w, h):
            img = img.resize((nw, nh), interp)
        left, top = (nw - cw) // 2, (nh - ch) // 2
        img = img.crop((left, top, left + cw, top + ch))
        a = np.asarray(img, dtype=np.float32) / 255.0  # HWC
        a = (a - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        return np.ascontiguousarray(a.transpose(2, 0, 1))


def resolve_pipeline(
    input_shape: tuple[int, ...], preprocess: "Preprocess | None", spec: "PreprocessSpec | None"
) -> ImagePipeline:
    """The model's preprocessing, with the recipe's ``calibration.preprocess`` keys taking precedence.

    Args:
        input_shape: the model input's shape (N, C, H, W); H, W are the crop when nobody says.
    Returns:
        The pipeline; its ``origin`` says where the numbers came from.
    """
    h, w = int(input_shape[-2]), int(input_shape[-1])
    resize = preprocess.resize if preprocess else None
    crop: tuple[int, int] = (h, w)
    interp = preprocess.interpolation if preprocess else "bilinear"
    mean = tuple(preprocess.mean) if preprocess else (0.485, 0.456, 0.406)
    std = tuple(preprocess.std) if preprocess else (0.229, 0.224, 0.225)
    origin = [(preprocess.origin or "the model source") if preprocess
              else "ImageNet mean/std and bilinear resize by default (the model states no preprocessing)"]
    if preprocess and preprocess.crop and (preprocess.crop, preprocess.crop) != crop:
        # the model's pretrained crop differs from the export shape (img_size override): scale resize
        resize = round(resize * h / preprocess.crop) if resize else None
        origin.append(f"resize scaled by the export size {h} / the pretrained crop {preprocess.crop}")
    if spec is not None:
        fields = spec.model_fields_set
        if spec.resize is not None:
            resize = spec.resize
        if spec.crop is not None:
            crop = (spec.crop, spec.crop)
        if "interpolation" in fields or preprocess is None:
            interp = spec.interpolation
        if spec.mean is not None:
            mean = tuple(spec.mean)
        if spec.std is not None:
            std = tuple(spec.std)
        given = [k for k in ("resize", "crop", "interpolation", "mean", "std")
                 if k in fields and getattr(spec, k) is not None]
        if given:
            origin.append(f"{', '.join(given)} from the recipe's calibration.preprocess")
    if crop != (h, w):
        raise BadInput(f"calibration.preprocess.crop {crop[0]} does not match the model input {h}x{w}")
    if resize is None:
        resize = min(h, w)
        origin.append("resize = the model input's size (nobody states one)")
    if resize < min(crop):
        raise BadInput(f"calibration.preprocess.resize {resize} is smaller than the crop {crop[0]}x{crop[1]}")
    return ImagePipeline(int(resize), crop, str(interp), mean, std, "; ".join(origin))


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)  # follows a symlink; a dangling one is not a file
    except OSError:
        return False


def find_images(folder: Path, others: list[Path] | None = None) -> list[Path]:
    """Image files under ``folder`` (recursively, hidden entries skipped), in a stable order.

    Only regular files are returned: opening a FIFO named ``x.jpg`` would wait forever for a writer.
    Args:
        others: when given, receives the image-named entries that are not regular files.
    """
    found: list[Path] = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in sorted(files):
            if not f.startswith(".") and f.lower().endswith(IMAGE_SUFFIXES):
                path = Path(root) / f
                if _regular(path):
                    found.append(path)
                elif others is not None:
                    others.append(path)
    return found


def why_unreadable(exc: BaseException) -> str:
    """A short reason for a file :func:`read_rgb` refused (the size limit is said with numbers)."""
    if isinstance(exc, Image.DecompressionBombError):
        return f"too large: over {2 * (Image.MAX_IMAGE_PIXELS or 0)} pixels, the decoder's safety limit"
    text = " ".join(str(exc).split())
    if "cannot identify image file" in text:
        return "not an image"
    return (text[:80] + "...") if len(text) > 80 else (text or type(exc).__name__)


def read_rgb(path: Path):
    """Open an image and return an 8-bit RGB ``PIL.Image``; raise ``OSError``/``ValueError`` (or
    PIL's ``DecompressionBombError`` above its size limit) if unreadable."""
    with warnings.catch_warnings():
        # images between PIL's warning and error sizes are decoded, not reported once per read
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return _read_rgb(path)


def _read_rgb(path: Path):
    with Image.open(path) as im:
        im.load()
        try:
            im = ImageOps.exif_transpose(im)
        except Exception:  # a broken EXIF block is not a broken image
            pass
        mode = im.mode
        if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
            a = np.asarray(im, dtype=np.float64)
            top = 65535.0 if a.max() > 255 or mode.startswith("I;16") else 255.0
            a8 = np.clip(np.round(a / top * 255.0), 0, 255).astype(np.uint8)
            im = Image.fromarray(a8, mode="L")
        elif mode == "F":
            a = np.asarray(im, dtype=np.float64)
            top = 1.0 if a.max() <= 1.0 else 255.0
            im = Image.fromarray(np.clip(np.round(a / top * 255.0), 0, 255).astype(np.uint8), mode="L")
        elif mode == "RGBA" or mode == "LA" or (mode == "P" and "transparency" in im.info):
            im = im.convert("RGBA")
        if im.mode != "RGB":
            im = im.convert("RGB")
        return im.copy()


def digest_files(paths: list[Path], root: Path) -> str:
    """A content hash of the chosen files (names relative to ``root`` plus bytes)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(str(p.relative_to(root)).encode())
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()
