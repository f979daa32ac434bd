"""Helpers for the quantization tests: recipes with test defaults, model + data cases."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from vitexport.recipe import load_recipe

FAST = ["quantization.measure_latency=false", "calibration.reuse=false"]


def recipe(name: str, *overrides: str):
    """A shipped recipe with the test defaults (no latency timing, no table reuse) and overrides."""
    return load_recipe(name, [*FAST, *overrides])


class Case:
    """A float ONNX model plus its calibration set, parity feeds and torch reference."""

    def __init__(self, path: Path, module: torch.nn.Module, calib, parity):
        self.path = path
        self.module = module
        self.calib = calib
        self.feeds = list(parity.batches(1))
        with torch.no_grad():
            self.reference = np.concatenate(
                [module(*[torch.from_numpy(v) for v in f.values()]).numpy() for f in self.feeds]
            )
