"""A detector's labels: the boxes and classes of each parity sample, in one fixed-shape array.

Two ways in, one form out (``float64 [N, M, 5]``: class, cx, cy, w, h per box, the box normalised to the
model's input as DETR's and YOLOS's ``pred_boxes`` are; class ``-1`` pads a sample with fewer than M boxes):

* an ``.npz`` with ``y`` [N, M] (the model's class index per box, ``-1`` for none) beside ``y_boxes``
  [N, M, 4] (normalised cx, cy, w, h, as Hugging Face's DETR labels and ``pred_boxes`` hold them);
* an image folder holding a COCO json (``images``, ``annotations``, ``categories``): each annotation's
  ``bbox`` (pixels x, y, w, h of the original image) is carried through the folder's own preprocessing
  (the shorter side resized, the center crop) and clipped to the crop; a box left with no area is dropped,
  as are ``iscrowd`` ones (COCO's evaluator ignores them). ``category_id`` is the model's class index, the
  convention of Hugging Face's detectors (DETR's COCO checkpoints index their 91 classes by COCO's ids).

The metrics (:mod:`vitexport.parity.tasks`) read :func:`per_sample`'s lists.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..errors import BadInput

__all__ = ["is_box_labels", "box_labels", "per_sample", "find_coco_json", "coco_box_labels"]

#: values per box in the combined array: class, cx, cy, w, h
_FIELDS = 5


def is_box_labels(labels: np.ndarray | None) -> bool:
    """Whether ``labels`` is a detector's (float [N, M, 5]) rather than classes [N] or label maps [N, H, W]."""
    return labels is not None and labels.ndim == 3 and labels.dtype.kind == "f" and labels.shape[-1] == _FIELDS


def box_labels(y: np.ndarray, boxes: np.ndarray, source: str) -> np.ndarray:
    """Check an ``.npz``'s ``y`` [N, M] and ``y_boxes`` [N, M, 4] and combine them (module docstring).

    Raises:
        BadInput: shapes that disagree, classes that are not integers >= -1, boxes outside 0..1 or not finite.
    """
    y, boxes = np.asarray(y), np.asarray(boxes)
    if boxes.ndim != 3 or boxes.shape[-1] != 4:
        raise BadInput(f"{source}: 'y_boxes' has shape {tuple(boxes.shape)}; a detector's boxes are [N, M, 4] "
                       "(normalised cx, cy, w, h, as pred_boxes)")
    if y.shape != boxes.shape[:2]:
        raise BadInput(f"{source}: 'y' has shape {tuple(y.shape)} but 'y_boxes' {tuple(boxes.shape)}: give one class "
                       "per box, [N, M] beside [N, M, 4] (-1 where a sample has fewer than M boxes)")
    if not (y.dtype.kind in "iu" or (y.dtype.kind == "f" and np.isfinite(y).all() and (y == np.round(y)).all())):
        raise BadInput(f"{source}: 'y' holds {y.dtype} values; a box's class must be the model's class index")
    if y.size and y.min() < -1:
        raise BadInput(f"{source}: 'y' holds class {int(y.min())}; classes are 0..K-1, -1 marking no box")
    if boxes.dtype.kind != "f" or not np.isfinite(boxes).all():
        raise BadInput(f"{source}: 'y_boxes' must hold finite float values (normalised cx, cy, w, h)")
    real = boxes[y >= 0]
    if real.size and (real.min() < 0 or real.max() > 1 or (real[:, 2:] <= 0).any()):
        raise BadInput(f"{source}: 'y_boxes' holds values outside 0..1 or a box of no size; boxes are normalised "
                       "(cx, cy, w, h as fractions of the model's input), not pixels")
    return np.concatenate([y[..., None].astype(np.float64), boxes.astype(np.float64)], axis=-1)


def per_sample(labels: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per sample, (classes [n], xyxy boxes [n, 4] in 0..1), padding rows left out: what COCOeval reads."""
    out = []
    for row in np.asarray(labels, np.float64):
        keep = row[:, 0] >= 0
        cls, (cx, cy, w, h) = row[keep, 0].astype(np.int64), row[keep, 1:].T
        out.append((cls, np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)))
    return out


def find_coco_json(folder: Path) -> Path | None:
    """The COCO json of an image folder (its only ``*.json`` at the top with ``annotations``), or None.

    Raises:
        BadInput: several such files (which one is meant?), or one that is not valid json.
    """
    found = []
    for p in sorted(folder.glob("*.json")):
        try:
            data = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BadInput(f"{p}: not readable json ({exc}); an image folder's .json must be COCO annotations") from None
        if isinstance(data, dict) and "annotations" in data:
            found.append(p)
    if len(found) > 1:
        raise BadInput(f"{folder}: {len(found)} COCO json files ({', '.join(p.name for p in found)}); keep the one "
                       "that labels these images")
    return found[0] if found else None


def _geometry(size: tuple[int, int], resize: int, crop: tuple[int, int]) -> tuple[float, float, float, float, int, int]:
    """The preprocessing's map of a (w, h) image: x' = x * sx - left, y' = y * sy - top, in a crop of (cw, ch)
    (:class:`~vitexport.calibration.images.ImagePipeline`'s arithmetic)."""
    w, h = size
    ch, cw = crop
    scale = resize / min(w, h)
    nw, nh = max(cw, round(w * scale)), max(ch, round(h * scale))
    return nw / w, nh / h, float((nw - cw) // 2), float((nh - ch) // 2), cw, ch


def coco_box_labels(path: Path, files: Sequence[Path], sizes: Mapping[Path, tuple[int, int]], root: Path,
                    resize: int, crop: tuple[int, int]) -> np.ndarray:
    """The box labels of ``files`` (in order) from the COCO json at ``path``, carried through the resize and
    center crop (module docstring); ``sizes``: each file's (width, height) as decoded.

    Raises:
        BadInput: a malformed image or annotation, or an image of ``files`` the json does not list
            (``file_name`` relative to the folder, or its base name).
    """
    data = json.loads(path.read_text())
    try:
        by_name = {}
        for im in data.get("images", []):
            by_name.setdefault(str(im["file_name"]), int(im["id"]))
        anns: dict[int, list[tuple[int, list[float]]]] = {}
        for a in data["annotations"]:
            if a.get("iscrowd", 0):
                continue
            bbox = [float(v) for v in a["bbox"]]
            if len(bbox) != 4:
                raise ValueError(f"annotation {a.get('id')}: bbox has {len(bbox)} values, not x, y, w, h")
            anns.setdefault(int(a["image_id"]), []).append((int(a["category_id"]), bbox))
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(f"{path}: not COCO annotations ({exc}); each image needs id and file_name, each annotation "
                       "image_id, category_id and bbox [x, y, w, h]") from None
    ids = []
    for f in files:
        rel = f.relative_to(root).as_posix()
        ids.append(by_name.get(rel, by_name.get(f.name)))
    missing = [f for f, i in zip(files, ids) if i is None]
    if missing:
        raise BadInput(f"{path}: {len(missing)} of the folder's images are not among its 'images' (file_name relative "
                       f"to {root}, or the base name), {missing[0].name} first; is it the json of these images? "
                       "(an image with no objects is listed in 'images' with no annotation)")
    rows: list[list[list[float]]] = []
    for f, img_id in zip(files, ids):
        sx, sy, left, top, cw, ch = _geometry(sizes[f], resize, crop)
        row = []
        for cat, (x, y, w, h) in anns.get(img_id, []):
            x0, y0 = np.clip([x * sx - left, y * sy - top], 0, [cw, ch])
            x1, y1 = np.clip([(x + w) * sx - left, (y + h) * sy - top], 0, [cw, ch])
            if x1 > x0 and y1 > y0:
                row.append([cat, (x0 + x1) / 2 / cw, (y0 + y1) / 2 / ch, (x1 - x0) / cw, (y1 - y0) / ch])
        rows.append(row)
    most = max(1, max(len(r) for r in rows))
    out = np.zeros((len(files), most, _FIELDS), np.float64)
    out[..., 0] = -1
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = r
    return out
