"""Parity: every stage gated against one golden reference, per-layer localisation, reports.

The flow: :func:`capture_reference` runs the untouched model once, first; :func:`check_stage` runs a
stage's artifact on the same inputs and returns a :class:`StageResult` (data with ``__bool__``);
:func:`localize_layers` / :func:`localize_onnx` say which block diverged; a :class:`ParityRun`
collects the stages and :func:`write_reports` renders ``parity.json`` / ``.md`` / ``.html`` from it.
"""
from .layers import (
    LayerBudget,
    LayerProbe,
    LayerReport,
    LayerResult,
    OnnxLayerProbe,
    TorchLayerProbe,
    block_names,
    compare_layers,
    localize_layers,
    localize_onnx,
)
from .metrics import Check, CompareResult, Metrics, compare, compute_metrics, error_histogram
from .nonfinite import NonFiniteSource, find_nonfinite, first_nonfinite_module, first_nonfinite_op
from .pairwise import compare_models
from .reference import GoldenReference, capture_reference
from .report import load_run, render_html, render_markdown, render_reports, write_reports
from .stage import ParityRun, StageResult, check_stage

__all__ = [
    # reference and gate
    "GoldenReference",
    "capture_reference",
    "StageResult",
    "ParityRun",
    "check_stage",
    # metrics
    "Metrics",
    "Check",
    "CompareResult",
    "compute_metrics",
    "compare",
    "error_histogram",
    # layers
    "LayerBudget",
    "LayerResult",
    "LayerReport",
    "LayerProbe",
    "TorchLayerProbe",
    "OnnxLayerProbe",
    "block_names",
    "compare_layers",
    "localize_layers",
    "localize_onnx",
    # NaN / Inf
    "NonFiniteSource",
    "find_nonfinite",
    "first_nonfinite_op",
    "first_nonfinite_module",
    # two models
    "compare_models",
    # reports
    "write_reports",
    "render_reports",
    "load_run",
    "render_markdown",
    "render_html",
]
