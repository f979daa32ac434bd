"""Helpers for the quantization tests: recipes with test defaults, model + data cases."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from vitexport.targets import Target, load_target

FAST = ["calibration.reuse=false"]


def target(name: str, *overrides: str) -> Target:
    """A registered target on its own recipe, with the test defaults (no table reuse) and overrides."""
    return load_target(name, [*FAST, *overrides])


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
