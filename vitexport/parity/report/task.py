"""The report's task section: a detector's mAP, a segmenter's mIoU, a depth model's AbsRel per stage
(:mod:`vitexport.parity.tasks`), and in ``parity.html`` the picture people look at rather than read:
FP32 and INT8 boxes drawn on a parity image, the two segmentation maps side by side, the depth error map.
A classifier has no section: its report reads as before tasks were measured.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .common import _num, _verdict
from .plots import _figure, _png

__all__ = ["TaskSection", "task_section", "plot_task"]

#: per task: (column, TaskMetrics key, number kind)
_COLUMNS: dict[str, list[tuple[str, str, str]]] = {
    "detect": [("mAP", "map", "g"), ("AP50", "ap50", "g"), ("box IoU mean", "box_iou_mean", "g"),
               ("box IoU min", "box_iou_min", "g"), ("class agreement", "class_agreement", "pct"),
               ("score MAE", "score_mae", "g"), ("FP32 detections", "detections", "g"), ("matched", "matched", "g"),
               ("mAP vs labels", "map_labels", "g"), ("FP32 mAP vs labels", "reference_map_labels", "g"),
               ("drop's standard error", "map_labels_drop_se", "g")],
    "segment": [("mIoU", "miou", "g"), ("pixel agreement", "pixel_agreement", "pct"), ("gated mIoU", "miou_gated", "g"),
                ("gated pixel agreement", "pixel_agreement_gated", "pct"), ("near ties", "near_ties", "pct"),
                ("classes", "classes", "g"), ("mIoU vs labels", "miou_labels", "g"),
                ("FP32 mIoU vs labels", "reference_miou_labels", "g"), ("pixel accuracy vs labels", "pixel_accuracy_labels", "pct"),
                ("drop's standard error", "miou_labels_drop_se", "g")],
    "depth": [("AbsRel", "abs_rel", "g"), ("δ<1.25", "delta1", "pct")],
    "embed": [("recall@k", "recall_at_k", "pct"), ("k", "k", "g")],
}
_HOW = {
    "detect": "the FP32 model's queries scoring at least the detection threshold are the ground truth, every query of "
              "the stage a scored detection; mAP is COCO's mAP@[.5:.95] (pycocotools), computed on the stages that "
              "gate it; box IoU is each FP32 detection's with its best-matching query; with box labels in the parity "
              "data, mAP vs labels is each model's against them, and the gate reads the drop from FP32's",
    "segment": "each stage's argmax map against the FP32 argmax: mIoU over the classes present in either; the gated "
               "forms excuse flips on near ties, pixels whose FP32 top-1/top-2 margin is within the error's reach "
               "(the top-1 gate's rule), and are what the gates check",
    "depth": "each stage's depth against the FP32 depth over pixels where it is positive: AbsRel = mean |d - d_fp32| / "
             "d_fp32, δ<1.25 the share of pixels within a factor 1.25",
    "embed": "recall@k: the share of each parity sample's k nearest parity samples (cosine) by FP32 embeddings that the "
             "stage's embeddings also rank among their k nearest",
}


@dataclass(frozen=True)
class TaskSection:
    """What both renderers show: the task and who said it, how it is measured, one row per stage, notes."""

    title: str
    lines: list[str]
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)


def task_section(data: Mapping[str, Any]) -> TaskSection | None:
    """The section for ``data`` (a ``parity.json`` dict); None for a classifier or an older file."""
    task = data.get("task")
    if task not in _COLUMNS:
        return None
    measured = [s["task_metrics"] for s in data.get("stages", []) if s.get("task_metrics")]
    # a column no stage measured (against labels the data did not carry) is left out
    cols = [c for c in _COLUMNS[task] if any(tm.get(c[1]) is not None for tm in measured)] or _COLUMNS[task]
    rows, outputs = [], []
    for s in data.get("stages", []):
        tm = s.get("task_metrics")
        if not tm:
            continue
        outputs = tm.get("outputs") or outputs
        rows.append([str(s["stage"]), str(s.get("engine", ""))] + [_num(tm.get(k), kind) for _, k, kind in cols]
                    + [_verdict(s.get("passed", True))])
    lines = [f"task: {task}" + (f" (from {data['task_source']})" if data.get("task_source") else "")
             + (f", read from the outputs {', '.join(outputs)}" if outputs else ""),
             f"measured against the FP32 model's outputs, which score 1 against themselves: {_HOW[task]}; the INT8 "
             "stages gate it (the checks above)"]
    notes = {n for s in data.get("stages", []) for n in s.get("notes", []) if str(n).startswith(f"task {task}:")}
    lines += sorted(notes)
    return TaskSection(f"Task: {task}", lines, ["stage", "engine"] + [c for c, _, _ in cols] + ["result"], rows)


def _rgb(image: Mapping[str, Any] | None) -> np.ndarray | None:
    if not image:
        return None
    return np.frombuffer(base64.b64decode(image["rgb"]), np.uint8).reshape(image["shape"])


def _draw_boxes(ax, boxes: list, w: int, h: int, color: str, style: str, label: str) -> None:
    for i, (c, score, x0, y0, x1, y1) in enumerate(boxes):
        ax.add_patch(_rectangle((x0 * w, y0 * h), (x1 - x0) * w, (y1 - y0) * h, color, style, label if i == 0 else None))
        ax.annotate(f"{c}:{score:.2f}", (x0 * w, y0 * h), color=color, fontsize=6, va="bottom")


def _rectangle(xy, width, height, color, style, label):
    from matplotlib.patches import Rectangle  # with the figure (matplotlib loads when a report draws)

    return Rectangle(xy, width, height, fill=False, edgecolor=color, linestyle=style, linewidth=1.2, label=label)


def _detect(fig, pic: Mapping[str, Any], stage: str) -> None:
    ax = fig.subplots()
    img = _rgb(pic.get("image"))
    h, w = (img.shape[:2] if img is not None else (100, 100))
    if img is not None:
        ax.imshow(img)
    ax.set_xlim(0, w)
    ax.set_ylim(h, 0)
    _draw_boxes(ax, pic.get("labels", []), w, h, "#1565c0", ":", "labels")
    _draw_boxes(ax, pic.get("ref", []), w, h, "#2e7d32", "-", "FP32")
    _draw_boxes(ax, pic.get("out", []), w, h, "#c62828", "--", stage)
    truth = ", labels (blue dotted)" if pic.get("labels") else ""
    ax.set_title(f"parity sample {pic.get('sample', 0)}: FP32 (green), {stage} (red dashed){truth}\n"
                 "boxes marked class:score", fontsize=8)
    if pic.get("ref") or pic.get("out") or pic.get("labels"):
        ax.legend(fontsize=7, loc="lower right")
    ax.axis("off")


def _panels(fig, pic: Mapping[str, Any], maps: list[tuple[str, np.ndarray, dict]]) -> None:
    img = _rgb(pic.get("image"))
    shown = ([("input", img, {})] if img is not None else []) + maps
    axes = fig.subplots(1, len(shown))
    for ax, (title, a, kw) in zip(np.atleast_1d(axes), shown):
        im = ax.imshow(a, **kw)
        ax.set_title(title, fontsize=8)
        ax.axis("off")
        if kw.get("cmap") in ("viridis", "magma"):
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)


def plot_task(data: Mapping[str, Any]) -> str | None:
    """The last gated stage's picture as base64 PNG: boxes on the image (detect), FP32 and stage maps with
    their disagreement (segment), FP32 depth and relative error (depth); None when no stage has one."""
    stage = next((s for s in reversed(data.get("stages", [])) if (s.get("task_metrics") or {}).get("picture")), None)
    if stage is None:
        return None
    pic, name, task = stage["task_metrics"]["picture"], str(stage["stage"]), data.get("task")
    if task == "detect":
        fig = _figure(5.0, 5.0)
        _detect(fig, pic, name)
        return _png(fig)
    if task == "segment":
        ref, out = np.asarray(pic["ref"]), np.asarray(pic["out"])
        kw = {"cmap": "tab20", "vmin": 0, "vmax": max(int(pic.get("classes", 20)) - 1, 1), "interpolation": "nearest"}
        maps = [("FP32 argmax", ref, kw), (f"{name} argmax", out, kw),
                (f"disagreement ({100 * float((ref != out).mean()):.1f}% of pixels)", (ref != out).astype(float),
                 {"cmap": "Reds", "vmin": 0, "vmax": 1, "interpolation": "nearest"})]
    elif task == "depth":
        maps = [("FP32 depth", np.asarray(pic["ref"]), {"cmap": "viridis"}),
                (f"{name}: |d - d_fp32| / d_fp32", np.asarray(pic["rel_err"]), {"cmap": "magma"})]
    else:
        return None
    fig = _figure(3.0 * (len(maps) + (1 if pic.get("image") else 0)), 3.0)
    _panels(fig, pic, maps)
    fig.suptitle(f"parity sample {pic.get('sample', 0)}", fontsize=9)
    return _png(fig)
