"""The three ways to hand vitexport's INT8 to RKNN, each as the ONNX file (and request) RKNN gets:

- ``rknn``: RKNN's own quantizer (``build(do_quantization=True)``) on vitexport's float graph, masks
  written full-shape.
- ``hybrid``: RKNN's quantizer in two steps with vitexport's calibrated ranges written into its
  quantization config between them (``hybrid_quantization_step1/2``).
- ``qdq``: vitexport's Q/DQ file in the layout RKNN runs as INT8 (:mod:`.rknn_graph`): Linears as
  Q/DQ'd 1x1 Convs with Q/DQ'd outputs, Convs (the patch embedding) in float, masks full-shape.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..graph.files import load_model, save_model
from .rknn import RknnQuantization
from .rknn_graph import (
    ConvsInFloat, FullShapeMasks, LinearsAsConv, PatchConvsAs1x1, linear_sites, output_ranges, patch_convs,
)

__all__ = ["ROUTES", "float_for_rknn", "qdq_for_rknn", "vitexport_ranges", "route_quantization"]

ROUTES = ("rknn", "hybrid", "qdq")


def float_for_rknn(fp32: str | Path, dst: str | Path) -> dict:
    """vitexport's float graph with its masks in the form RKNN compiles. Returns the pass's report."""
    model = load_model(fp32)
    rep = FullShapeMasks()(model).report
    save_model(model, dst)
    return {"masks": rep.changed}


def qdq_for_rknn(int8: str | Path, dst: str | Path, feeds: Sequence[Mapping[str, np.ndarray]]) -> dict:
    """vitexport's Q/DQ file in RKNN's INT8 layout; Linear output ranges measured on ``feeds``
    (calibration samples) with the Q/DQ model itself. Returns what each pass changed."""
    model = load_model(int8)
    masks = FullShapeMasks()(model).report
    sites, patches = linear_sites(model), patch_convs(model)
    ranges = output_ranges(model, feeds, [s.output.name for s in sites] + [c.outputs[0].name for c in patches])
    patch = PatchConvsAs1x1(ranges)(model).report
    convs = ConvsInFloat()(model).report  # any other Q/DQ'd Conv (RKNN's bias handling rejects them)
    lin = LinearsAsConv(ranges)(model).report
    save_model(model, dst)
    return {"masks": masks.changed, "patch_convs_as_1x1": patch.changed, "convs_in_float": convs.changed,
            "linears_as_conv": lin.changed, "skipped": {**patch.skipped, **lin.skipped}}


def vitexport_ranges(calibration_json: str | Path) -> dict[str, tuple[float, float]]:
    """vitexport's calibrated (range-searched) activation ranges, ONNX tensor name → (lo, hi)."""
    table = json.loads(Path(calibration_json).read_text())
    return {k: (float(v["lo"]), float(v["hi"])) for k, v in table.get("tensors", {}).items() if "lo" in v and "hi" in v}


def route_quantization(route: str, calib: list[dict[str, np.ndarray]], calibration_json: str | Path | None = None) -> RknnQuantization:
    """The request's quantization for a route (``qdq``: the file carries it, RKNN quantizes nothing)."""
    if route == "rknn":
        return RknnQuantization(mode="rknn", dataset=calib)
    if route == "hybrid":
        ranges = vitexport_ranges(calibration_json) if calibration_json else {}
        return RknnQuantization(mode="hybrid", dataset=calib, ranges=ranges)
    if route == "qdq":
        return RknnQuantization(mode="none")
    raise ValueError(f"unknown route {route!r}: one of {ROUTES}")
