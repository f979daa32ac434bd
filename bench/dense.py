"""Issue 29's dense bench cases: synthetic scenes of shapes with boxes and masks, and the small Hugging Face
detector (YOLOS: a plain ViT with detection tokens) and segmenter (SegFormer) trained on them.

A scene is a deterministic function of its seed: a smooth random background with noise, and one to
:data:`SCENE` ``max_objects`` shapes (square, disc, triangle: the class is the shape, never the colour), each
a random colour with enough contrast against the background, sizes 12–30 px, placed without overlapping
much (box IoU < 0.1, so a box is the tight box of what is visible). Labels come in both forms:

* detection: ``boxes`` in pixels ``[x0, y0, x1, y1]`` and a ``category`` per box (COCO's 1..3);
* segmentation: a mask per pixel, 0 background and ``1 + class`` where a shape is.

The training scripts draw from seeds ``[TRAIN_BASE, …)``; the bench's calib / parity / score splits from
their own disjoint ranges (:data:`SPLIT_SEEDS`), so no held-out scene was ever trained or calibrated on.
Models are saved as Hugging Face folders (``save_pretrained`` plus a ``preprocessor_config.json``), loaded by
vitexport as ``hf:<folder>`` exactly as a user's would be.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["SCENE", "CLASSES", "SPLIT_SEEDS", "TRAIN_BASE", "YOLOS", "SEGFORMER", "scene", "scenes", "normalize",
           "build_yolos", "build_segformer", "write_preprocessor", "coco_ground_truth", "label_arrays"]

CLASSES = ("square", "disc", "triangle")
#: the scene geometry: a 64×64 RGB image, 1..3 shapes of 12..30 px
SCENE = dict(size=64, min_objects=1, max_objects=3, min_side=12, max_side=30)
#: first seed of each split; the training scripts draw from TRAIN_BASE upwards (never reaching the others)
SPLIT_SEEDS = {"calib": 1_000_000, "parity": 2_000_000, "score": 3_000_000}
TRAIN_BASE = 0
#: the detector: YOLOS (a plain ViT: 64 patches of 8×8 plus 16 detection tokens, one per cell of a 4×4 tiling, for
#: at most 3 objects; 16-pixel patches leave a 4×4 grid too coarse to place a 12-pixel shape)
YOLOS = dict(image_size=[64, 64], patch_size=8, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
             intermediate_size=128, num_detection_tokens=16, use_mid_position_embeddings=False,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
#: the segmenter: SegFormer (Mix Transformer, 4 stages, efficient attention with reduction convs, all-MLP decoder)
SEGFORMER = dict(num_channels=3, num_encoder_blocks=4, depths=[1, 1, 1, 1], sr_ratios=[4, 2, 1, 1],
                 hidden_sizes=[16, 32, 64, 96], num_attention_heads=[1, 1, 2, 2], decoder_hidden_size=64,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                 classifier_dropout_prob=0.0, drop_path_rate=0.0)
MEAN = STD = (0.5, 0.5, 0.5)


def _background(rng: np.random.Generator, s: int) -> np.ndarray:
    """A smooth colour gradient plus noise: shapes stand out by edges, not by a flat field."""
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32) / (s - 1)
    c0, c1, c2 = (rng.uniform(0.1, 0.9, 3).astype(np.float32) for _ in range(3))
    img = c0[:, None, None] + (c1 - c0)[:, None, None] * xx * 0.6 + (c2 - c0)[:, None, None] * yy * 0.6
    return img + rng.normal(0, 0.04, (3, s, s)).astype(np.float32)


def _shape_mask(kind: int, x0: int, y0: int, w: int, h: int, s: int, rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[0:s, 0:s]
    inside = (xx >= x0) & (xx < x0 + w) & (yy >= y0) & (yy < y0 + h)
    if kind == 0:  # square (an axis-aligned rectangle, near square)
        return inside
    if kind == 1:  # disc (an ellipse in the box)
        cx, cy = x0 + (w - 1) / 2, y0 + (h - 1) / 2
        return ((xx - cx) / (w / 2)) ** 2 + ((yy - cy) / (h / 2)) ** 2 <= 1.0
    # triangle: apex at the top (or bottom), base on the other side
    up = rng.random() < 0.5
    t = (yy - y0) / max(h - 1, 1) if up else (y0 + h - 1 - yy) / max(h - 1, 1)
    half = t * (w / 2)
    cx = x0 + (w - 1) / 2
    return inside & (np.abs(xx - cx) <= half + 0.5)


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def scene(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One scene, a pure function of ``seed``.

    Returns:
        ``image`` float32 [3, S, S] in [0, 1]; ``boxes`` float32 [n, 4] pixels ``x0, y0, x1, y1``;
        ``classes`` int64 [n] (0-based); ``mask`` int64 [S, S] (0 background, 1 + class).
    """
    rng = np.random.default_rng(seed)
    s = SCENE["size"]
    img = _background(rng, s)
    mask = np.zeros((s, s), np.int64)
    boxes, classes = [], []
    for _ in range(int(rng.integers(SCENE["min_objects"], SCENE["max_objects"] + 1))):
        for _try in range(20):
            w = int(rng.integers(SCENE["min_side"], SCENE["max_side"] + 1))
            h = int(np.clip(w * rng.uniform(0.8, 1.25), SCENE["min_side"], SCENE["max_side"]))
            x0, y0 = int(rng.integers(0, s - w + 1)), int(rng.integers(0, s - h + 1))
            kind = int(rng.integers(0, len(CLASSES)))
            m = _shape_mask(kind, x0, y0, w, h, s, rng)
            ys, xs = np.nonzero(m)
            box = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float32)
            if all(_iou(box, b) < 0.1 for b in boxes) and not (mask[m] > 0).any():
                break
        else:
            continue
        colour = rng.uniform(0, 1, 3).astype(np.float32)
        bg = img[:, m].mean(axis=1)
        if np.abs(colour - bg).max() < 0.35:  # too close to the background: push the furthest channel away
            i = int(np.argmax(np.abs(colour - bg)))
            colour[i] = 0.0 if bg[i] > 0.5 else 1.0
        img[:, m] = colour[:, None] + rng.normal(0, 0.03, (3, int(m.sum()))).astype(np.float32)
        mask[m] = kind + 1
        boxes.append(box)
        classes.append(kind)
    return (np.clip(img, 0, 1).astype(np.float32), np.array(boxes, np.float32).reshape(-1, 4),
            np.array(classes, np.int64), mask)


def normalize(x: np.ndarray) -> np.ndarray:
    """[0, 1] images → the models' input (mean / std 0.5, as the preprocessor config says)."""
    m = np.asarray(MEAN, np.float32)[:, None, None]
    sd = np.asarray(STD, np.float32)[:, None, None]
    return ((x - m) / sd).astype(np.float32)


def scenes(n: int, first_seed: int) -> dict:
    """``n`` scenes from seeds ``first_seed …``: ``x`` (normalised, [n, 3, S, S]), ``mask`` [n, S, S], and
    per scene lists ``boxes`` (pixels xyxy) and ``classes``."""
    out = [scene(first_seed + i) for i in range(n)]
    return {"x": normalize(np.stack([o[0] for o in out])), "mask": np.stack([o[3] for o in out]),
            "boxes": [o[1] for o in out], "classes": [o[2] for o in out]}


def build_yolos(**overrides):
    """``YolosForObjectDetection`` from :data:`YOLOS` (``overrides`` for tiny test settings), random weights.

    Hugging Face's YOLOS built from a config leaves its ``[CLS]`` token, detection tokens and position embeddings
    at zeros (its checkpoints carry trained ones): every detection token is then the same vector, self-attention
    treats identical tokens identically, and every token predicts the same box and class for ever, whatever the
    loss (the earlier held-out mAP 0.001). They are drawn here as the YOLOS and DeiT code draws them
    (truncated normal, std 0.02). Needed, not enough: drawn apart, the queries still learnt an image-independent
    tiling in 3000 steps with the Hungarian-matched loss (their attention over the patches stayed uniform; mAP
    0.0007); ``scripts/train_detector.py`` trains them with a fixed assignment to cells of the image instead."""
    import torch
    from transformers import YolosConfig, YolosForObjectDetection

    cfg = YolosConfig(**{**YOLOS, **overrides}, id2label={i: c for i, c in enumerate(CLASSES)},
                      label2id={c: i for i, c in enumerate(CLASSES)})
    model = YolosForObjectDetection(cfg)
    emb = model.vit.embeddings
    for p in (emb.cls_token, emb.detection_tokens, emb.position_embeddings):
        torch.nn.init.trunc_normal_(p, std=0.02)
    return model


def build_segformer(**overrides):
    """``SegformerForSemanticSegmentation`` from :data:`SEGFORMER`, random weights."""
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    names = ("background",) + CLASSES
    cfg = SegformerConfig(**{**SEGFORMER, **overrides}, id2label=dict(enumerate(names)),
                          label2id={c: i for i, c in enumerate(names)})
    return SegformerForSemanticSegmentation(cfg)


def write_preprocessor(folder: Path) -> None:
    """The ``preprocessor_config.json`` a user's folder has: size and the normalisation :func:`normalize` applies."""
    s = SCENE["size"]
    (Path(folder) / "preprocessor_config.json").write_text(json.dumps(
        {"image_mean": list(MEAN), "image_std": list(STD), "size": {"height": s, "width": s},
         "do_normalize": True, "do_rescale": True, "rescale_factor": 1 / 255, "resample": 2}, indent=1))


def coco_ground_truth(boxes: list[np.ndarray], classes: list[np.ndarray]) -> dict:
    """The scenes' boxes as a COCO ground-truth dict (image ids 0.., category ids 1..3, xywh pixels)."""
    s = SCENE["size"]
    anns = []
    for img_id, (bb, cc) in enumerate(zip(boxes, classes)):
        for b, c in zip(bb, cc):
            w, h = float(b[2] - b[0]), float(b[3] - b[1])
            anns.append({"id": len(anns) + 1, "image_id": img_id, "category_id": int(c) + 1, "iscrowd": 0,
                         "bbox": [float(b[0]), float(b[1]), w, h], "area": w * h})
    return {"images": [{"id": i, "width": s, "height": s} for i in range(len(boxes))], "annotations": anns,
            "categories": [{"id": i + 1, "name": c} for i, c in enumerate(CLASSES)]}


def label_arrays(d: dict, most: int) -> dict[str, np.ndarray]:
    """A split's labels as fixed-shape arrays: ``boxes`` [n, most, 4] (xyxy in 0..1), ``classes`` [n, most]
    (-1: no box), ``mask`` [n, S, S]."""
    n, s = len(d["boxes"]), d["mask"].shape[-1]
    boxes = np.zeros((n, most, 4), np.float32)
    classes = np.full((n, most), -1, np.int64)
    for i, (b, c) in enumerate(zip(d["boxes"], d["classes"])):
        boxes[i, : len(b)] = b / s
        classes[i, : len(c)] = c
    return {"boxes": boxes, "classes": classes, "mask": d["mask"].astype(np.uint8)}
