"""A pass's own sanity number: how far the rewritten model moved on the probe inputs.

It is a note in the report, not the parity gate (the pipeline gates each stage against the untouched
model with the recipe's tolerance).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..runners.torch_runner import primary_output
from ._probe import run_model

__all__ = ["output_deviation", "self_check_note"]


def output_deviation(model: nn.Module, inputs: dict[str, torch.Tensor], reference: Any) -> float:
    """max |out - ref| / max |ref| of the primary outputs; inf when shapes differ or NaN appears."""
    ref = primary_output(reference).detach().double()
    out = primary_output(run_model(model, inputs)).detach().double()
    if out.shape != ref.shape or not torch.isfinite(out).all():
        return float("inf")
    scale = float(ref.abs().max()) if ref.numel() else 1.0
    return float((out - ref).abs().max()) / max(scale, 1e-12) if ref.numel() else 0.0


def self_check_note(model: nn.Module, inputs: dict[str, torch.Tensor], reference: Any) -> str:
    """The report line for :func:`output_deviation`."""
    return f"self-check on the example inputs: max |out - ref| / max |ref| = {output_deviation(model, inputs, reference):.1e}"
