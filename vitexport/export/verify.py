"""Parity of an exported graph against the torch model it came from (ONNX Runtime, CPU).

The pipeline gates each stage against its golden reference itself; this is the same comparison for
callers and tests that hold a module and a file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
import torch

from ..runners.ort_runner import OnnxRuntimeRunner
from ..runners.torch_runner import TorchRunner
from ..parity.metrics import CompareResult, compare
from ..recipe import Tolerance

__all__ = ["onnx_parity"]


def onnx_parity(
    model: torch.nn.Module,
    example_inputs: dict[str, torch.Tensor],
    onnx_path: str | Path,
    tolerance: Tolerance,
    feeds: Iterable[Mapping[str, np.ndarray]] | None = None,
) -> CompareResult:
    """Run ``model`` (torch) and ``onnx_path`` (ONNX Runtime) on the same feeds and compare.

    Args:
        model: the reference module, called with keyword inputs named as in ``example_inputs``.
        example_inputs: name → tensor; the default feed, and the input names and dtypes.
        onnx_path: the exported or simplified graph.
        tolerance: the stage's parity contract (``recipe.tolerance('export_onnx')``).
        feeds: batches of name → array at the exported batch size (default: the example inputs).
    Returns:
        The :class:`~vitexport.parity.metrics.CompareResult`; ``bool(result)`` is the verdict.
    """
    batches = list(feeds) if feeds is not None else [{k: v.detach().cpu().numpy() for k, v in example_inputs.items()}]
    with TorchRunner(model, example_inputs, name="torch") as ref_runner:
        ref = ref_runner.infer_batches(batches)["output"]
    with OnnxRuntimeRunner(Path(onnx_path), name="onnxruntime") as ort_runner:
        out = ort_runner.infer_batches(batches)["output"]
    return compare(ref, out, tolerance)
