"""The three ways to hand vitexport's INT8 to RKNN, each as the ONNX file (and quantization) RKNN gets:

- ``rknn``: RKNN's own quantizer (``build(do_quantization=True)``) on vitexport's float graph in the
  forms RKNN compiles (:mod:`.graph`: masks full-shape, Transposes of at most 4 axes).
- ``hybrid``: RKNN's quantizer in two steps with vitexport's calibrated ranges written into its
  quantization config between them (``hybrid_quantization_step1/2``).
- ``qdq``: vitexport's Q/DQ file in the layout RKNN runs as INT8 (:mod:`.qdq`): Linears as
  Q/DQ'd 1x1 Convs (outlier output channels scaled into the output range, :mod:`.outliers`),
  patch convs split to ≤ 4x4 and convs of stride > 7 split, Q·Kᵀ scores Q/DQ'd before their scale,
  every quantized Conv's output Q/DQ'd (after a Relu/Clip it fuses), the pairs' ranges measured on calibration
  samples (:mod:`.ranges`: a SiLU's or GELU's input keeps its levels for the side the activation passes); the float
  forms of the ``rknn``
  route too (full-shape masks, 4-D Transposes, padded AveragePools that count their padding).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from ...graph.files import load_model, save_model
from ...graph.passes import GraphPass
from .client import RknnQuantization
from .crash import CrashForms
from .graph import (
    CollapseTransposes, FullShapeMasks, HalvedGelus, Hazard, PaddedAvgPools, activation_zp_dtype, patch_convs, rknn_hazards, strided_convs,
)
from .outliers import ScaledLinearOutputs
from .ranges import measure_layout_ranges
from .qdq import (
    BatchedProbsInFloat, ConvOutputsQdq, ConvsInFloat, CpuQuantizesInFloat, LinearsAsConv, MoveScoreScales, OutputQdq, PatchConvsInInt8,
    conv_outputs_to_measure, linear_sites, score_matmuls,
)

__all__ = ["ROUTES", "Route", "float_for_rknn", "qdq_layout", "qdq_for_rknn", "layout_hazards", "rknn_input", "float_cpu_quantizes", "vitexport_ranges", "route_quantization"]

Route = Literal["qdq", "rknn", "hybrid"]
ROUTES: tuple[Route, ...] = ("rknn", "hybrid", "qdq")


def _apply(model: ir.Model, passes: Sequence[GraphPass]) -> dict:
    """Run ``passes`` in order; their reports as {name: changed} plus whatever they skipped, and why."""
    out: dict = {"skipped": {}}
    for p in passes:
        rep = p(model).report
        out[rep.name] = rep.changed
        out["skipped"].update(rep.skipped)
    return out


def _float_forms(model: ir.Model) -> dict:
    return _apply(model, [FullShapeMasks(), CollapseTransposes(), PaddedAvgPools(), HalvedGelus()])


def float_for_rknn(fp32: str | Path, dst: str | Path) -> dict:
    """vitexport's float graph in the forms RKNN compiles. Returns what each pass changed."""
    model = load_model(fp32)
    report = _float_forms(model)
    save_model(model, dst)
    return report


#: metadata key a file in RKNN's Q/DQ layout carries (``model.rknn.onnx``): rewriting it again would add
#: its output Q/DQ pairs a second time
LAYOUT_KEY = "vitexport.rknn_layout"


def qdq_layout(model: ir.Model, feeds: Sequence[Mapping[str, np.ndarray]] | None = None) -> dict:
    """Rewrite a Q/DQ model into RKNN's INT8 layout, in place; the output ranges of the ops it adds
    Q/DQ to are measured on ``feeds`` (calibration samples) with the Q/DQ model itself (None: unit
    ranges, for checking the layout's structure only). Returns what each pass changed."""
    report = {**_float_forms(model), **_apply(model, [MoveScoreScales(), BatchedProbsInFloat()])}
    # a Q/DQ right before Softmax crashes RKNN: scores still read by it directly stay float16
    scores = [m.outputs[0].name for m in score_matmuls(model) if next(iter(m.outputs[0].uses()))[0].op_type != "Softmax"]
    linears = [s.output.name for s in linear_sites(model)]
    names = linears + [c.outputs[0].name for c in patch_convs(model) + strided_convs(model)] + scores
    names = list(dict.fromkeys(names + conv_outputs_to_measure(model)))
    # one pass over the calibration feeds: last-axis ranges, whose extremes are the tensors' ranges (the low end
    # cut where an activation reading the tensor flattens it, .ranges); a Linear's outlier output channels are
    # scaled into its output Q/DQ's range (ScaledLinearOutputs)
    zp = activation_zp_dtype(model)
    measured = measure_layout_ranges(model, feeds, names, zp) if feeds is not None else None
    ranges = measured.ranges if measured is not None else {n: (-1.0, 1.0) for n in names}
    per_channel = {k: measured.per_channel[k] for k in linears if k in measured.per_channel} if measured else {}
    later = _apply(model, [ScaledLinearOutputs(per_channel, ranges), PatchConvsInInt8(ranges), ConvOutputsQdq(ranges, zp),
                           ConvsInFloat(), LinearsAsConv(ranges), OutputQdq({k: ranges[k] for k in scores}, zp)])
    later["skipped"].update(report["skipped"])
    later["rknn_activation_low_ends"] = len(measured.cut) if measured is not None else 0
    model.metadata_props[LAYOUT_KEY] = "qdq"  # a laid-out file is not laid out twice (layout_hazards)
    return {**report, **later}


def qdq_for_rknn(int8: str | Path, dst: str | Path, feeds: Sequence[Mapping[str, np.ndarray]]) -> dict:
    """vitexport's Q/DQ file in RKNN's INT8 layout (:func:`qdq_layout`), written to ``dst``."""
    model = load_model(int8)
    report = qdq_layout(model, feeds)
    save_model(model, dst)
    return report


def layout_hazards(model: ir.Model) -> list[Hazard]:
    """What RKNN would crash on, hang on or run on the CPU in ``model`` once laid out for it (a copy:
    the Q/DQ layout when the model has Q/DQ, the float forms otherwise)."""
    copy = model.clone()  # initializers shared, external ones still read from their own folder
    if copy.metadata_props.get(LAYOUT_KEY):
        pass  # already what RKNN compiles (model.rknn.onnx): its hazards as it stands
    elif any(n.op_type == "DequantizeLinear" for n in copy.graph):
        qdq_layout(copy)
    else:
        _float_forms(copy)
    return rknn_hazards(copy)


def rknn_input(route: Route, fp32: Path, int8: Path, dst: Path, feeds: Sequence[Mapping[str, np.ndarray]]) -> dict:
    """The ONNX file RKNN compiles for ``route`` (the Q/DQ file's layout for ``qdq``, the float graph's
    forms otherwise), written to ``dst``. Returns the layout passes' report."""
    return qdq_for_rknn(int8, dst, feeds) if route == "qdq" else float_for_rknn(fp32, dst)


def float_cpu_quantizes(path: Path, quantizes: set[str], layout: dict) -> int:
    """The laid-out file at ``path`` without the Q/DQ pairs whose QuantizeLinear RKNN placed on the CPU
    (:class:`~.qdq.CpuQuantizesInFloat`), rewritten in place; ``layout`` (the layout passes' report)
    gains the pass's count and reasons. Returns how many pairs came off."""
    return _rewrite_laid_out(path, CpuQuantizesInFloat(quantizes), layout)


def crash_forms(path: Path, layout: dict) -> int:
    """The laid-out file at ``path`` in the forms RKNN 2.5.0 compiled where it crashed (:class:`~.crash.CrashForms`),
    rewritten in place; ``layout`` gains the pass's count and reasons. Returns how many nodes changed."""
    return _rewrite_laid_out(path, CrashForms(), layout)


def _rewrite_laid_out(path: Path, graph_pass: GraphPass, layout: dict) -> int:
    model = load_model(path)
    report = _apply(model, [graph_pass])
    layout["skipped"].update(report.pop("skipped"))
    layout.update(report)
    save_model(model, path)
    return next(iter(report.values()))


def vitexport_ranges(calibration_json: str | Path) -> dict[str, tuple[float, float]]:
    """vitexport's calibrated (range-searched) activation ranges, ONNX tensor name → (lo, hi)."""
    table = json.loads(Path(calibration_json).read_text())
    return {k: (float(v["lo"]), float(v["hi"])) for k, v in table.get("tensors", {}).items() if "lo" in v and "hi" in v}


def route_quantization(route: Route, calib: list[dict[str, np.ndarray]], calibration_json: str | Path | None = None) -> RknnQuantization:
    """The request's quantization for a route (``qdq``: the file carries it, RKNN quantizes nothing)."""
    if route == "rknn":
        return RknnQuantization(mode="rknn", dataset=calib)
    if route == "hybrid":
        ranges = vitexport_ranges(calibration_json) if calibration_json else {}
        return RknnQuantization(mode="hybrid", dataset=calib, ranges=ranges)
    if route == "qdq":
        return RknnQuantization(mode="none")
    raise ValueError(f"unknown route {route!r}: one of {ROUTES}")
