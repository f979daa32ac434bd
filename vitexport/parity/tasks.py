"""Task metrics: what a deployment reads for its kind of model, measured against the FP32 (golden) outputs.

Cosine says a stage's outputs point where the reference's do; a detector's user reads mAP, a
segmenter's mIoU, a depth model's AbsRel. Each stage's outputs are scored here with the reference's
outputs taken as ground truth, so the untouched model scores 1.0 (0.0 for AbsRel) by construction and
a gate's limit is the loss allowed:

- **detect** (DETR / YOLOS: ``logits`` [B, Q, C+1] whose last class is "no object", ``pred_boxes``
  [B, Q, 4] normalised cx, cy, w, h): the reference's queries whose best class probability reaches
  ``detect_score_min`` are the ground truth; every query of the stage is a scored detection, and
  COCO's evaluator (pycocotools' ``COCOeval``, not a hand-written one) gives mAP@[.5:.95] and AP50.
  A detector whose logits have no "no object" class (Deformable / Conditional DETR, RT-DETR: as many
  logits as ``config.num_labels``) scores each class by a sigmoid (``reference.meta["detect_scores"]``).
  Each reference detection is matched to the stage's query of highest IoU (greedy, as COCO matches):
  mean and worst box IoU, the share whose class agrees, the mean score difference. mAP is computed on
  the stages that gate it (the INT8 ones by default): COCOeval takes seconds per stage on 512 samples,
  and a float stage's ``max_abs`` gate bounds its boxes far tighter.
- **segment** (``logits`` [B, C, H, W]): pixel agreement and mIoU of the stage's argmax against the
  reference's (classes present in either, over all samples); the gates read their margin-gated forms,
  where a pixel whose reference classes nearly tie may flip (the top-1 gate's rule, per pixel).
- **depth** (``predicted_depth`` [B, H, W]): AbsRel and δ<1.25 over pixels of positive reference depth.
- **embed** (``image_embeds``, ``pooler_output``, a 2-D output, else token 0 of ``last_hidden_state``):
  recall@k agreement, the share of each sample's k nearest parity samples (cosine) by the reference's
  embeddings that the stage's embeddings also rank in their k nearest. Cosine per sample is the
  output gate's own.

Labels: a segmenter's parity ``.npz`` may carry label maps ``y`` [N, H, W] (255: unlabelled). Then the
stage's and the reference's mIoU and pixel accuracy against them are measured too (logits upsampled
bilinearly to the labels' size, as Hugging Face's SegFormer evaluation does), and the gate reads the
drop: what INT8 lost against the truth, beside what it changed against FP32. A detector's labels (boxes
and classes: :mod:`vitexport.calibration.boxes`, from an ``.npz`` or a COCO json) are read the same way: both
models' mAP against the labelled boxes, and the drop gated. Then the mAP against FP32's own detections is
reported but not gated by default: at COCO's strict IoU thresholds it counts every box that moved a pixel as
lost, true or not (a trained YOLOS: 0.983 against FP32 where it lost 0.4 points against the labels).
"""
from __future__ import annotations

import base64
import contextlib
import io
import math
import time
from typing import Mapping, Sequence

import numpy as np

from ..calibration.boxes import is_box_labels, per_sample
from ..errors import BadInput
from ..recipe import Task, Tolerance
from .data import Sparse, result
from .metrics import Check

__all__ = ["TaskMetrics", "TASK_METRICS", "task_outputs", "task_checks", "detection_metrics", "segmentation_metrics",
           "depth_metrics", "embedding_metrics", "coco_map", "labels_miou", "labels_map", "check_label_maps",
           "map_drop_spread", "miou_drop_spread", "DEFAULT_SCORE_MIN", "RECALL_K", "IGNORE_LABEL"]

#: DETR's and YOLOS's own post-processing threshold (``Tolerance.detect_score_min`` null)
DEFAULT_SCORE_MIN = 0.5
#: a failed labelled mAP gate's bootstrap: at most this many resamples, within about this many seconds
#: (COCOeval per resample: 0.24 s for 256 images of a 16-query, 3-class YOLOS; ~14 s for 512 of a COCO DETR)
SPREAD_RESAMPLES, SPREAD_SECONDS = 40, 20.0
#: neighbours compared per sample for recall@k (fewer when the parity set is small)
RECALL_K = 5
_BOX_SCALE = 1000.0  # normalised boxes scaled to a 1000-pixel image: COCO's area ranges read pixels
#: a task check's metric → (the TaskMetrics field it gates, the tolerance key of its limit, op)
TASK_METRICS: dict[str, tuple[str, str]] = {
    "map": ("map_min", ">="), "miou_gated": ("miou_min", ">="), "pixel_agreement_gated": ("pixel_agreement_min", ">="),
    "abs_rel": ("abs_rel_max", "<="), "delta1": ("delta1_min", ">="), "recall_at_k": ("recall_at_k_min", ">="),
    "miou_labels_drop": ("miou_labels_drop_max", "<="), "map_labels_drop": ("map_labels_drop_max", "<="),
}
#: a label map's value for a pixel nobody labelled (ADE20K's and Cityscapes' convention)
IGNORE_LABEL = 255


@result
class TaskMetrics(Sparse):
    """One stage's task metrics against the reference; ``None``: not measured for this task.

    Attributes:
        task: the task (``detect``...); ``outputs``: the outputs read; ``samples``: parity samples.
        map, ap50: COCO mAP@[.5:.95] and AP@.5 against the reference's detections (detect).
        detections: the reference's detections (the ground truth); ``matched``: those the stage has a
            query of IoU >= 0.5 and the same class for.
        box_iou_mean, box_iou_min: IoU of each reference detection with its matched query.
        class_agreement: share of reference detections whose matched query has the same class.
        score_mae: mean |score difference| of the matched pairs.
        miou, pixel_agreement, classes: segment (classes present in either argmax map); ``*_gated``:
            flips on the reference's near ties excused (what the gates check), ``near_ties`` the share
            of such pixels (:func:`segmentation_metrics`).
        miou_labels, pixel_accuracy_labels: segment, against the parity data's label maps; the
            ``reference_*`` forms are the FP32 model's, ``miou_labels_drop`` the difference (gated).
        map_labels, ap50_labels: detect, against the parity data's boxes; ``reference_*`` the FP32
            model's, ``map_labels_drop`` the difference (gated).
        abs_rel, delta1: depth.
        recall_at_k, k: embed.
        note: why a figure is missing (no confident detection, non-finite outputs).
        picture: what the report draws for one parity sample of a gated stage: its image (base64 RGB),
            the reference's and the stage's boxes ``[class, score, x0, y0, x1, y1]``, argmax maps or
            the depth and its relative error, at most 96 pixels a side.
    """

    task: str
    outputs: list[str]
    samples: int = 0
    map: float | None = None
    ap50: float | None = None
    detections: int | None = None
    matched: int | None = None
    box_iou_mean: float | None = None
    box_iou_min: float | None = None
    class_agreement: float | None = None
    score_mae: float | None = None
    miou: float | None = None
    pixel_agreement: float | None = None
    miou_gated: float | None = None
    pixel_agreement_gated: float | None = None
    near_ties: float | None = None
    classes: int | None = None
    miou_labels: float | None = None
    pixel_accuracy_labels: float | None = None
    reference_miou_labels: float | None = None
    reference_pixel_accuracy_labels: float | None = None
    miou_labels_drop: float | None = None
    miou_labels_drop_se: float | None = None
    map_labels: float | None = None
    ap50_labels: float | None = None
    reference_map_labels: float | None = None
    map_labels_drop: float | None = None
    map_labels_drop_se: float | None = None
    abs_rel: float | None = None
    delta1: float | None = None
    recall_at_k: float | None = None
    k: int | None = None
    note: str | None = None
    picture: dict | None = None

    def short(self) -> str:
        """The headline figures for a terminal line (`` map=0.9981 box_iou=0.987``)."""
        keys = {"detect": ("map", "box_iou_mean", "map_labels"), "segment": ("miou", "miou_gated", "miou_labels"),
                "depth": ("abs_rel", "delta1"), "embed": ("recall_at_k",)}.get(self.task, ())
        return "".join(f" {k.removesuffix('_mean')}={getattr(self, k):.4f}" for k in keys if getattr(self, k) is not None)


# --- which outputs a task reads ---------------------------------------------------------------------------
def _named(shapes: Mapping[str, Sequence[int]], names: Sequence[str], ndim: int) -> str | None:
    return next((n for n in names if n in shapes and len(shapes[n]) == ndim), None)


def task_outputs(task: Task | str, shapes: Mapping[str, Sequence[int]]) -> list[str]:
    """The outputs ``task``'s metrics read, by name first, else by shape.

    Args:
        task: the task.
        shapes: output name → shape, in the model's order (``output`` for a single one).
    Returns:
        detect: [logits, boxes]; segment / depth / embed: [the one output]; classify: [].
    Raises:
        ValueError: no output has the shape the task needs (the message says which).
    """
    task = Task(task)
    names = list(shapes)
    if task is Task.detect:
        boxes = _named(shapes, ("pred_boxes", "boxes"), 3) or next(
            (n for n in names if len(shapes[n]) == 3 and shapes[n][-1] == 4), None)
        logits = _named(shapes, ("logits", "output"), 3) or next(
            (n for n in names if n != boxes and len(shapes[n]) == 3), None)
        if boxes is None or logits is None or logits == boxes or shapes[logits][1] != shapes[boxes][1]:
            raise ValueError("detect needs class logits [B, Q, C+1] and boxes [B, Q, 4] (logits and pred_boxes)")
        return [logits, boxes]
    if task is Task.segment:
        found = _named(shapes, ("logits", "out", "output"), 4) or next((n for n in names if len(shapes[n]) == 4), None)
        if found is None or shapes[found][1] < 2:
            raise ValueError("segment needs class logits [B, C, H, W] with C >= 2")
        return [found]
    if task is Task.depth:
        found = _named(shapes, ("predicted_depth", "output"), 3) or _named(shapes, ("predicted_depth", "output"), 4) \
            or next((n for n in names if len(shapes[n]) in (3, 4)), None)
        if found is None or (len(shapes[found]) == 4 and shapes[found][1] != 1):
            raise ValueError("depth needs a depth map [B, H, W] (predicted_depth)")
        return [found]
    if task is Task.embed:
        found = _named(shapes, ("image_embeds", "text_embeds", "embeddings", "pooler_output", "output"), 2) or next(
            (n for n in names if len(shapes[n]) == 2), None) or next((n for n in names if len(shapes[n]) == 3), None)
        if found is None:
            raise ValueError("embed needs an embedding [B, D] (or tokens [B, T, D])")
        return [found]
    return []


# --- detection -------------------------------------------------------------------------------------------
def _detections(logits: np.ndarray, boxes: np.ndarray, scores: str = "softmax"
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(score, class, xyxy box) per query: softmax over classes, the last ("no object") left out
    (DETR, YOLOS); ``scores="sigmoid"``: each class on its own (Deformable DETR, RT-DETR: no such class)."""
    if scores == "sigmoid":
        p = 1.0 / (1.0 + np.exp(-logits))
    else:
        z = logits - logits.max(-1, keepdims=True)
        p = np.exp(z)
        p = (p / p.sum(-1, keepdims=True))[..., :-1]
    cx, cy, w, h = np.moveaxis(boxes, -1, 0)
    xyxy = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)
    return p.max(-1), p.argmax(-1), xyxy


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` [n, 4] with every box of ``b`` [m, 4] (xyxy)."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area = lambda x: np.clip(x[:, 2:] - x[:, :2], 0, None).prod(-1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


def _greedy(iou: np.ndarray) -> list[tuple[int, int]]:
    """Pairs (reference, stage) of highest IoU first, each box used once (COCO's matching, without scores)."""
    pairs, used_r, used_o = [], set(), set()
    for flat in np.argsort(-iou, axis=None, kind="stable"):
        r, o = divmod(int(flat), iou.shape[1])
        if r in used_r or o in used_o:
            continue
        pairs.append((r, o))
        used_r.add(r)
        used_o.add(o)
        if len(used_r) == iou.shape[0]:
            break
    return pairs


def _coco_box(b: np.ndarray) -> list[float]:
    x0, y0, x1, y1 = (float(v) * _BOX_SCALE for v in b)
    return [x0, y0, max(x1 - x0, 0.0), max(y1 - y0, 0.0)]


def coco_map(gt: Sequence[tuple[np.ndarray, np.ndarray]], dets: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
             num_classes: int) -> tuple[float, float] | None:
    """COCO mAP@[.5:.95] and AP@.5 by pycocotools' ``COCOeval``.

    Args:
        gt: per image, (classes [n], xyxy boxes [n, 4] in 0..1).
        dets: per image, (scores [m], classes [m], xyxy boxes [m, 4]).
        num_classes: the number of classes (ids 0..num_classes-1).
    Returns:
        (mAP, AP50), or None when there is no ground-truth box at all.
    """
    from pycocotools.coco import COCO  # loads when a detector is judged (its C extension: ~0.1 s)
    from pycocotools.cocoeval import COCOeval

    anns = [{"id": len_ + 1, "image_id": i, "category_id": int(c) + 1, "bbox": _coco_box(b), "iscrowd": 0}
            for len_, (i, c, b) in enumerate((i, c, b) for i, (cs, bs) in enumerate(gt) for c, b in zip(cs, bs))]
    if not anns:
        return None
    for a in anns:
        a["area"] = a["bbox"][2] * a["bbox"][3]
    results = [{"image_id": i, "category_id": int(c) + 1, "bbox": _coco_box(b), "score": float(s)}
               for i, (ss, cs, bs) in enumerate(dets) for s, c, b in zip(ss, cs, bs)]
    most = max([100] + [len(d[0]) for d in dets])
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
        truth = COCO()
        truth.dataset = {"images": [{"id": i} for i in range(len(gt))], "annotations": anns,
                         "categories": [{"id": c + 1} for c in range(num_classes)]}
        truth.createIndex()
        ev = COCOeval(truth, truth.loadRes(results), "bbox")
        ev.params.maxDets = [most]  # every query is a candidate, as DETR is evaluated
        # COCO's mean skips classes without ground truth, so only those with some are evaluated, and at
        # one area range ("all", what mAP reads): 4x fewer of COCOeval's Python loops, the same figures
        ev.params.catIds = sorted({a["category_id"] for a in anns})
        ev.params.areaRng, ev.params.areaRngLbl = [[0.0, 1e10]], ["all"]
        ev.evaluate()
        ev.accumulate()
    precision = ev.eval["precision"][:, :, :, 0, -1]  # [IoU threshold, recall, class]: summarize()'s stats[0/1]
    mean = lambda p: float(p[p > -1].mean()) if (p > -1).any() else 0.0  # noqa: E731
    return mean(precision), mean(precision[0])


def labels_map(logits: np.ndarray, boxes: np.ndarray, labels: np.ndarray, scores: str = "softmax") -> tuple[float, float] | None:
    """COCO mAP and AP50 of a detector's outputs (every query a scored detection) against box labels
    [N, M, 5] (:mod:`vitexport.calibration.boxes`); None when no sample has a labelled box."""
    s, c, b = _detections(np.asarray(logits, np.float64), np.asarray(boxes, np.float64), scores)
    classes = logits.shape[-1] - (1 if scores == "softmax" else 0)
    return coco_map(per_sample(labels), [(s[i], c[i], b[i]) for i in range(len(s))], classes)


def map_drop_spread(ref_logits: np.ndarray, ref_boxes: np.ndarray, logits: np.ndarray, boxes: np.ndarray,
                    labels: np.ndarray, scores: str = "softmax", resamples: int = SPREAD_RESAMPLES,
                    seconds: float = SPREAD_SECONDS, seed: int = 0) -> tuple[float, int] | None:
    """The standard error of the mAP drop against the labels (FP32's minus the stage's), by a paired bootstrap
    over the images: both models scored on the same images drawn with replacement, COCOeval each time.

    How far a few hundred images pin the drop down: the trained YOLOS of the bench lost 0.66 points on one 256-image
    split and nothing on another. Stops after ``seconds`` (COCOeval is slow on large detectors).

    Returns:
        (standard error, resamples made), or None when fewer than 8 fit in the time or the labels hold no box.
    """
    n = len(labels)
    gt = per_sample(labels)
    mine = _detections(np.asarray(logits, np.float64), np.asarray(boxes, np.float64), scores)
    theirs = _detections(np.asarray(ref_logits, np.float64), np.asarray(ref_boxes, np.float64), scores)
    classes = logits.shape[-1] - (1 if scores == "softmax" else 0)
    rng, drops, t0 = np.random.default_rng(seed), [], time.perf_counter()
    for _ in range(resamples):
        idx = rng.integers(0, n, n)
        g = [gt[i] for i in idx]
        a = coco_map(g, [(theirs[0][i], theirs[1][i], theirs[2][i]) for i in idx], classes)
        b = coco_map(g, [(mine[0][i], mine[1][i], mine[2][i]) for i in idx], classes)
        if a is not None and b is not None:
            drops.append(a[0] - b[0])
        if time.perf_counter() - t0 > seconds:
            break
    return (float(np.std(drops, ddof=1)), len(drops)) if len(drops) >= 8 else None


def detection_metrics(ref_logits: np.ndarray, ref_boxes: np.ndarray, logits: np.ndarray, boxes: np.ndarray,
                      score_min: float = DEFAULT_SCORE_MIN, scores: str = "softmax", with_map: bool = True,
                      labels: np.ndarray | None = None) -> TaskMetrics:
    """The stage's detections scored against the reference's (module docstring); ``scores``: how the
    logits become class probabilities (``softmax`` with a last "no object" class, or ``sigmoid``);
    ``with_map=False`` leaves out COCOeval (measured: 14 s for 512 samples of a 100-query, 91-class
    detector on a loaded 2-core machine; the matching alone takes a second). With ``labels`` (box labels
    [N, M, 5]) and ``with_map``, both models' mAP against them and the drop."""
    rs, rc, rb = _detections(np.asarray(ref_logits, np.float64), np.asarray(ref_boxes, np.float64), scores)
    os_, oc, ob = _detections(np.asarray(logits, np.float64), np.asarray(boxes, np.float64), scores)
    m = TaskMetrics("detect", [], samples=int(rs.shape[0]))
    if labels is not None and with_map:
        mine, theirs = labels_map(logits, boxes, labels, scores), labels_map(ref_logits, ref_boxes, labels, scores)
        if mine is None or theirs is None:
            m.note = "the box labels hold no box: nothing measured against them"
        else:
            (m.map_labels, m.ap50_labels), (m.reference_map_labels, _) = mine, theirs
            m.map_labels_drop = m.reference_map_labels - m.map_labels
    gt, ious, same, dscore = [], [], [], []
    for i in range(rs.shape[0]):
        keep = rs[i] >= score_min
        gt.append((rc[i][keep], rb[i][keep]))
        if not keep.any():
            continue
        iou = _iou(rb[i][keep], ob[i])
        for r, o in _greedy(iou):
            ious.append(iou[r, o])
            same.append(rc[i][keep][r] == oc[i][o])
            dscore.append(abs(rs[i][keep][r] - os_[i][o]))
    m.detections = len(ious)
    if not ious:
        m.note = f"no reference query scored >= {score_min:g}: nothing to match (detect_score_min sets the threshold)"
        return m
    ious_a, same_a = np.asarray(ious), np.asarray(same)
    m.matched = int(((ious_a >= 0.5) & same_a).sum())
    m.box_iou_mean, m.box_iou_min = float(ious_a.mean()), float(ious_a.min())
    m.class_agreement, m.score_mae = float(same_a.mean()), float(np.mean(dscore))
    if with_map:
        m.map, m.ap50 = coco_map(gt, [(os_[i], oc[i], ob[i]) for i in range(rs.shape[0])], ref_logits.shape[-1])
    return m


# --- segmentation, depth, embeddings ---------------------------------------------------------------------
def _miou(r: np.ndarray, o: np.ndarray, c: int) -> tuple[float, int]:
    """Mean IoU over the classes present in either map, and how many are."""
    conf = np.bincount((r.astype(np.int64) * c + o).ravel(), minlength=c * c).reshape(c, c)
    inter = np.diag(conf).astype(np.float64)
    union = conf.sum(0) + conf.sum(1) - inter
    present = union > 0
    return float((inter[present] / union[present]).mean()), int(present.sum())


def labels_miou(logits: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """mIoU (classes present in the labels or the prediction) and pixel accuracy of ``logits``
    [N, C, h, w] against label maps [N, H, W], over labelled pixels (not :data:`IGNORE_LABEL`).

    Logits of another size than the labels are upsampled bilinearly first (Hugging Face's SegFormer
    evaluation; a decoder at 1/4 resolution is scored at the labels' own).
    Raises:
        BadInput: a label outside the model's classes, or label maps of another sample count.
    """
    logits, labels = np.asarray(logits), np.asarray(labels)
    c = logits.shape[1]
    if labels.shape[0] != logits.shape[0]:
        raise BadInput(f"{labels.shape[0]} label maps for {logits.shape[0]} samples")
    known = labels != IGNORE_LABEL
    if known.any() and int(labels[known].max()) >= c:
        raise BadInput(f"label maps hold class {int(labels[known].max())}, but the logits have {c} classes")
    pred = _label_predictions(logits, labels)
    if not known.any():
        return float("nan"), float("nan")
    miou, _ = _miou(labels[known], pred[known], c)
    return miou, float((labels[known] == pred[known]).mean())


def _label_predictions(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The argmax class per label pixel: logits upsampled bilinearly to the labels' size first where it differs."""
    if logits.shape[-2:] != labels.shape[-2:]:
        import torch  # noqa: PLC0415 - only a segmenter's labels of another size need it

        up = torch.nn.functional.interpolate(torch.from_numpy(np.ascontiguousarray(logits, np.float32)),
                                             size=labels.shape[-2:], mode="bilinear", align_corners=False)
        return up.argmax(1).numpy()
    return logits.argmax(1)


def miou_drop_spread(ref: np.ndarray, out: np.ndarray, labels: np.ndarray, resamples: int = 200,
                     seed: int = 0) -> tuple[float, int] | None:
    """The standard error of the mIoU drop against label maps (FP32's minus the stage's), by a paired bootstrap
    over the images (per-image confusion matrices summed over each resample: no model runs again).

    Returns:
        (standard error, resamples), or None when no pixel is labelled.
    """
    labels = np.asarray(labels)
    c, known = ref.shape[1], labels != IGNORE_LABEL
    if not known.any():
        return None

    def confusions(logits: np.ndarray) -> np.ndarray:
        pred = _label_predictions(np.asarray(logits), labels)
        return np.stack([np.bincount(labels[i][known[i]].astype(np.int64) * c + pred[i][known[i]], minlength=c * c)
                         for i in range(len(labels))])

    def miou(conf: np.ndarray) -> float:
        conf = conf.reshape(c, c)
        inter = np.diag(conf).astype(np.float64)
        union = conf.sum(0) + conf.sum(1) - inter
        return float((inter[union > 0] / union[union > 0]).mean())

    a, b = confusions(ref), confusions(out)
    rng = np.random.default_rng(seed)
    drops = [miou(a[idx].sum(0)) - miou(b[idx].sum(0)) for idx in (rng.integers(0, len(labels), len(labels))
                                                                   for _ in range(resamples))]
    return float(np.std(drops, ddof=1)), resamples


def _check_box_labels(task: Task, outputs: Mapping[str, np.ndarray], labels: np.ndarray, scores: str) -> None:
    if task is not Task.detect:
        raise BadInput(f"parity data holds box labels ('y' beside 'y_boxes', or a COCO json), but the model's task is "
                       f"{task.value}: boxes are a detector's (give one class index per sample, or --task detect)")
    try:
        name = task_outputs(Task.detect, {k: v.shape for k, v in outputs.items()})[0]
    except ValueError as exc:
        raise BadInput(f"parity data holds box labels, but {exc}") from None
    c = outputs[name].shape[-1] - (1 if scores == "softmax" else 0)
    top = int(labels[..., 0].max()) if labels.size else -1
    if top >= c:
        raise BadInput(f"parity data's box labels hold class {top}, but the model detects {c} classes (0..{c - 1}; its "
                       "last logit is 'no object'): a box's class is the model's class index (a COCO json's category_id)")


def check_label_maps(task: Task | str, outputs: Mapping[str, np.ndarray], labels: np.ndarray,
                     scores: str = "softmax") -> None:
    """Refuse labels the model cannot be scored against, before any stage runs: label maps [N, H, W] or
    box labels [N, M, 5] (``scores``: a detector's class scores, as :func:`task_checks` takes them).

    Raises:
        BadInput: the task is not ``segment`` (``detect`` for boxes), or a label is outside the model's classes.
    """
    if is_box_labels(labels):
        return _check_box_labels(Task(task), outputs, labels, scores)
    if Task(task) is not Task.segment:
        raise BadInput(f"parity data 'y' holds label maps {list(labels.shape)}, but the model's task is {Task(task).value}: "
                       "label maps are a segmenter's (give one class index per sample, or --task segment)")
    try:
        name = task_outputs(Task.segment, {k: v.shape for k, v in outputs.items()})[0]
    except ValueError as exc:
        raise BadInput(f"parity data 'y' holds label maps, but {exc}") from None
    c, known = outputs[name].shape[1], labels != IGNORE_LABEL
    if known.any() and int(labels[known].max()) >= c:
        raise BadInput(f"parity data 'y' holds class {int(labels[known].max())}, but the model segments {c} classes "
                       f"(0..{c - 1}; {IGNORE_LABEL} marks an unlabelled pixel): check the label maps match the model")


def segmentation_metrics(ref: np.ndarray, out: np.ndarray, z: float | None = None,
                         labels: np.ndarray | None = None) -> TaskMetrics:
    """Pixel agreement and mIoU of ``out``'s argmax over axis 1 against ``ref``'s.

    With ``z`` (``Tolerance.top1_margin_z``), also their *gated* forms: a pixel's flip counts only where
    the reference's top-1/top-2 logit margin exceeds ``z * sqrt(2) * sigma``, sigma the sample's RMS output
    error: the top-1 gate's rule (:mod:`.metrics`) per pixel. A boundary pixel whose classes FP32 itself
    nearly ties flips on any error at all; counting those gates on noise, not on what INT8 broke.
    With ``labels`` (label maps [N, H, W]), also both maps' mIoU and pixel accuracy against them
    (:func:`labels_miou`) and the mIoU drop.
    """
    c = ref.shape[1]
    ref, out = np.asarray(ref), np.asarray(out)
    r, o = ref.argmax(1), out.argmax(1)
    miou, classes = _miou(r, o, c)
    m = TaskMetrics("segment", [], samples=int(r.shape[0]), pixel_agreement=float((r == o).mean()), miou=miou,
                    classes=classes)
    if z is not None:
        top2 = np.partition(ref, c - 2, axis=1)[:, -2:]
        margin = top2[:, 1] - top2[:, 0]
        diff = (out.astype(np.float64) - ref).reshape(ref.shape[0], -1)
        sigma = np.sqrt(np.mean(diff ** 2, axis=1)).reshape(-1, *(1,) * (margin.ndim - 1))
        near = margin <= z * math.sqrt(2.0) * sigma
        gated = np.where(near, r, o)
        m.miou_gated, _ = _miou(r, gated, c)
        m.pixel_agreement_gated, m.near_ties = float((r == gated).mean()), float(near.mean())
    if labels is not None:
        m.miou_labels, m.pixel_accuracy_labels = labels_miou(out, labels)
        m.reference_miou_labels, m.reference_pixel_accuracy_labels = labels_miou(ref, labels)
        if math.isnan(m.miou_labels):
            m.note = "the label maps mark every pixel unlabelled (255): nothing measured against them"
        else:
            m.miou_labels_drop = m.reference_miou_labels - m.miou_labels
    return m


def depth_metrics(ref: np.ndarray, out: np.ndarray) -> TaskMetrics:
    """AbsRel and δ<1.25 of ``out`` against ``ref`` over pixels of positive reference depth."""
    r, o = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    valid = r > 1e-6 * max(float(np.abs(r).max()) if r.size else 0.0, 1e-12)
    m = TaskMetrics("depth", [], samples=int(r.shape[0]))
    if not valid.any():
        m.note = "the reference depth is nowhere positive: AbsRel and δ1 undefined"
        return m
    rv, ov = r[valid], o[valid]
    ratio = np.where(ov > 0, np.maximum(ov / rv, rv / np.maximum(ov, 1e-300)), np.inf)
    m.abs_rel, m.delta1 = float(np.mean(np.abs(ov - rv) / rv)), float(np.mean(ratio < 1.25))
    return m


def embedding_metrics(ref: np.ndarray, out: np.ndarray, k: int = RECALL_K) -> TaskMetrics:
    """Recall@k agreement of the nearest parity samples by ``ref`` and by ``out`` embeddings (token 0 of
    a [B, T, D] output)."""
    r, o = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    if r.ndim == 3:
        r, o = r[:, 0], o[:, 0]
    r, o = r.reshape(r.shape[0], -1), o.reshape(o.shape[0], -1)
    n = r.shape[0]
    m = TaskMetrics("embed", [], samples=n)
    k = min(k, n - 1)
    if k < 1:
        m.note = "recall@k needs at least 2 parity samples"
        return m

    def neighbours(e: np.ndarray) -> np.ndarray:
        e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-300)
        sim = e @ e.T
        np.fill_diagonal(sim, -np.inf)
        return np.argsort(-sim, axis=1, kind="stable")[:, :k]

    a, b = neighbours(r), neighbours(o)
    m.k, m.recall_at_k = k, float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a, b)]))
    return m


# --- the report's picture --------------------------------------------------------------------------------
_SIDE = 96  # pixels a side of a picture's maps: enough to see, small in parity.json


def _thumb(a: np.ndarray, floats: bool = False) -> list:
    """A 2-D map cut to at most ``_SIDE`` pixels a side (nearest), as nested lists for parity.json;
    floats kept to 4 significant digits (a depth map may be metres or 1e-7)."""
    a = np.asarray(a)
    step = max(1, math.ceil(max(a.shape[:2]) / _SIDE))
    a = a[::step, ::step]
    return [[float(f"{v:.4g}") for v in row] for row in a.tolist()] if floats else a.tolist()


def _image(feed: np.ndarray | None, i: int) -> dict | None:
    """Parity sample ``i`` of an image input [N, C, H, W] (C 1 or 3) as base64 RGB bytes, each channel
    stretched to 0..255 (the input is normalised; the picture only has to be recognisable)."""
    if feed is None or feed.ndim != 4 or feed.shape[1] not in (1, 3):
        return None
    x = np.moveaxis(np.asarray(feed[i], np.float64), 0, -1)
    lo, hi = x.min(axis=(0, 1)), x.max(axis=(0, 1))
    x = np.repeat((x - lo) / np.where(hi > lo, hi - lo, 1.0), 3 // x.shape[-1], axis=-1)
    step = max(1, math.ceil(max(x.shape[:2]) / (2 * _SIDE)))
    img = np.ascontiguousarray((x[::step, ::step] * 255).round().astype(np.uint8))
    return {"shape": list(img.shape), "rgb": base64.b64encode(img.tobytes()).decode("ascii")}


def _picture(task: Task, ref: list[np.ndarray], out: list[np.ndarray], image: np.ndarray | None,
             score_min: float, scores: str, labels: np.ndarray | None = None) -> dict | None:
    """What the report draws for one parity sample (a detector's: the one with most reference detections,
    with its labelled boxes, score 1, where the data has them)."""
    if task is Task.detect:
        rs, rc, rb = _detections(np.asarray(ref[0], np.float64), np.asarray(ref[1], np.float64), scores)
        os_, oc, ob = _detections(np.asarray(out[0], np.float64), np.asarray(out[1], np.float64), scores)
        i = int(np.argmax((rs >= score_min).sum(1)))
        boxes = lambda s, c, b: [[int(c[q]), round(float(s[q]), 4), *(round(float(v), 5) for v in b[q])]  # noqa: E731
                                 for q in range(len(s)) if s[q] >= score_min]
        pic = {"ref": boxes(rs[i], rc[i], rb[i]), "out": boxes(os_[i], oc[i], ob[i])}
        if labels is not None and is_box_labels(labels):
            lc, lb = per_sample(labels[i : i + 1])[0]
            pic["labels"] = boxes(np.ones(len(lc)), lc, lb)
    elif task is Task.segment:
        i = 0
        pic = {"ref": _thumb(ref[0][i].argmax(0)), "out": _thumb(out[0][i].argmax(0)), "classes": int(ref[0].shape[1])}
    elif task is Task.depth:
        i = 0
        r, o = (np.asarray(a[i], np.float64).reshape(a.shape[-2:]) for a in (ref[0], out[0]))
        err = np.where(r > 0, np.abs(o - r) / np.where(r > 0, r, 1.0), 0.0)
        pic = {"ref": _thumb(r, True), "rel_err": _thumb(err, True)}
    else:
        return None
    return {"sample": i, "image": _image(image, i), **pic}


# --- the stage's task checks -----------------------------------------------------------------------------
def _measure(task: Task, ref: list[np.ndarray], out: list[np.ndarray], tolerance: Tolerance, scores: str,
             labels: np.ndarray | None) -> TaskMetrics:
    if task is Task.detect:
        score = tolerance.detect_score_min if tolerance.detect_score_min is not None else DEFAULT_SCORE_MIN
        drop = tolerance.task_limit("map_labels_drop_max")
        # COCOeval costs seconds: where a gate reads it
        gated = (_map_limit(tolerance, labels) or 0.0) > 0 or (labels is not None and drop is not None and not math.isinf(drop))
        return detection_metrics(ref[0], ref[1], out[0], out[1], score, scores, with_map=gated, labels=labels)
    if task is Task.segment:
        return segmentation_metrics(ref[0], out[0], tolerance.top1_margin_z, labels)
    if task is Task.depth:
        return depth_metrics(ref[0], out[0])
    return embedding_metrics(ref[0], out[0])


def _map_limit(tolerance: Tolerance, labels: np.ndarray | None) -> float | None:
    """``map_min``'s limit: the recipe's value, else the stage's default unless box labels gate the drop
    against the truth instead (module docstring)."""
    return tolerance.map_min if labels is not None else tolerance.task_limit("map_min")


def task_checks(task: Task | str | None, reference: Mapping[str, np.ndarray], outs: Mapping[str, np.ndarray],
                tolerance: Tolerance, image: np.ndarray | None = None, scores: str = "softmax",
                labels: np.ndarray | None = None, explain: bool = False) -> tuple[TaskMetrics | None, list[Check], list[str]]:
    """Measure ``task``'s metrics of one stage's outputs and gate them.

    Args:
        task: the model's task (None or ``classify``: nothing to add, top-1 is the output gate's).
        reference: the golden outputs by name; ``outs``: the stage's (same names and shapes).
        tolerance: the stage's contract (:meth:`~vitexport.recipe.Tolerance.task_limit` gives each limit).
        image: the parity samples' image input [N, C, H, W], drawn under a gated stage's picture.
        scores: a detector's class scores, ``softmax`` (a last "no object" class) or ``sigmoid``.
        labels: the parity data's label maps [N, H, W] (a segmenter's) or box labels [N, M, 5] (a
            detector's), else None.
        explain: a failed labelled mAP gate measures how far its images pin the drop down
            (:func:`map_drop_spread`, seconds of COCOeval) and says so in the check's ``why``: a stage's
            check does, the fallback's many verdicts do not.
    Returns:
        (metrics or None, checks named ``map[logits,pred_boxes]`` where the model has several outputs
        (``miou`` where one), notes saying why nothing was measured).
    """
    if task is None or Task(task) is Task.classify:
        return None, [], []
    task = Task(task)
    try:
        names = task_outputs(task, {k: v.shape for k, v in reference.items()})
    except ValueError as exc:
        return None, [], [f"task {task}: not measured: {exc}; the outputs are {', '.join(reference)}"]
    if any(n not in outs or outs[n].shape != reference[n].shape for n in names):
        return None, [], []  # the output gate failed already (output_shape)
    if not all(np.isfinite(outs[n]).all() for n in names):
        return None, [], [f"task {task}: not measured: the outputs hold NaN/Inf"]
    notes = []
    if labels is not None and task is not (Task.detect if is_box_labels(labels) else Task.segment):
        kind = "box labels are read by detectors" if is_box_labels(labels) else "label maps are read by segmenters"
        notes.append(f"task {task}: the parity data's {kind} only; not used")
        labels = None
    m = _measure(task, [reference[n] for n in names], [outs[n] for n in names], tolerance, scores, labels)
    m.outputs = names
    tag = f"[{','.join(names)}]" if len(reference) > 1 else ""
    checks = []
    for metric, (key, op) in TASK_METRICS.items():
        value, limit = getattr(m, metric), (_map_limit(tolerance, labels) if key == "map_min" else tolerance.task_limit(key))
        if value is None or limit is None or (op == ">=" and limit <= 0) or (op == "<=" and math.isinf(limit)):
            continue
        checks.append(Check(f"{metric}{tag}", value, limit, op, value >= limit if op == ">=" else value <= limit))
        if metric in ("map_labels_drop", "miou_labels_drop") and explain and not checks[-1].passed:
            spread = (map_drop_spread(*[reference[n] for n in names], *[outs[n] for n in names], labels, scores)
                      if metric == "map_labels_drop" else miou_drop_spread(reference[names[0]], outs[names[0]], labels))
            if spread is not None:
                setattr(m, f"{metric}_se", spread[0])
                checks[-1].why = (f"{100 * value:.2f} points of {'mAP' if metric == 'map_labels_drop' else 'mIoU'} lost "
                                  f"against the labels, ± {100 * spread[0]:.2f} (paired bootstrap standard error over "
                                  f"the {len(labels)} parity images, {spread[1]} resamples): more labelled images "
                                  "measure it closer")
    if checks:  # a gated stage (INT8, an engine) is pictured; the float ones match the reference anyway
        score = tolerance.detect_score_min if tolerance.detect_score_min is not None else DEFAULT_SCORE_MIN
        m.picture = _picture(task, [reference[n] for n in names], [outs[n] for n in names], image, score, scores, labels)
    return m, checks, notes + ([f"task {task}: {m.note}"] if m.note else [])
