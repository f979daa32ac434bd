"""The quantization tests' tiny ViT, for the TensorRT engine tests (the models live in tests/quantize/)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "quantize"))
from qcases import Case  # noqa: E402
from qmodels import export_onnx, tiny_vit  # noqa: E402

from vitexport.calibration import random_samples  # noqa: E402


@pytest.fixture(scope="session")
def vit17(tmp_path_factory) -> Case:
    """Plain tiny ViT (head 64, 17 tokens), opset 17 with LayerNormalization (tests/quantize/conftest.py's)."""
    ex = {"x": torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))}
    m = tiny_vit()
    path = export_onnx(m, ex, tmp_path_factory.mktemp("trt") / "vit17.onnx", 17)
    return Case(path, m, random_samples(ex, 48, seed=0), random_samples(ex, 24, seed=1))
