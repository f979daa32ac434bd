"""ONNX export, simplification and the target contract (stage 3 of model → passes → export → quantize).

``export_onnx`` writes a static-shape graph at the recipe's opset (TorchScript first, dynamo as
fallback, with export-time rewrites for LayerNorm, attention, einsum and GELU); ``simplify_onnx``
runs onnxsim and checks the recipe's contract before writing ``model.fp32.onnx``;
``check_contract`` checks any ONNX model against a recipe (the rules live in :mod:`vitexport.check`).
"""
from __future__ import annotations

from ..check import OP_HINTS, Violation, contract_violations
from .contract import check_contract
from .export import OUTPUT_NAME, ExportAttempt, ExportReport, export_onnx
from .rewrites import ExportRewrites
from .simplify import SimplifyReport, simplify_onnx

__all__ = [
    "export_onnx",
    "ExportReport",
    "ExportAttempt",
    "OUTPUT_NAME",
    "simplify_onnx",
    "SimplifyReport",
    "check_contract",
    "contract_violations",
    "Violation",
    "OP_HINTS",
    "ExportRewrites",
]
