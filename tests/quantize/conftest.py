"""Tiny float ONNX models for the quantization tests, exported once per session."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from qcases import Case  # noqa: E402
from qmodels import bert_samples, export_onnx, plant_outliers, tiny_bert, tiny_vit  # noqa: E402

from vitexport.calibration import NpzSamples, random_samples  # noqa: E402


def _vit_case(tmp: Path, name: str, opset: int, outliers: bool, **kw) -> Case:
    m = tiny_vit(**kw)
    if outliers:
        plant_outliers(m)
    img = kw.get("img", 32)
    ex = {"x": torch.randn(1, 3, img, img, generator=torch.Generator().manual_seed(0))}
    path = export_onnx(m, ex, tmp / f"{name}.onnx", opset)
    return Case(path, m, random_samples(ex, 48, seed=0), random_samples(ex, 24, seed=1))


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("qmodels")


@pytest.fixture(scope="session")
def vit17(models_dir) -> Case:
    """Plain tiny ViT (head 64, 17 tokens), opset 17 with LayerNormalization."""
    return _vit_case(models_dir, "vit17", 17, False)


@pytest.fixture(scope="session")
def outlier_vit(models_dir) -> Case:
    """Tiny ViT whose LayerNorms have outlier channels (|x| in the 100s), opset 17."""
    return _vit_case(models_dir, "outlier17", 17, True)


@pytest.fixture(scope="session")
def outlier_vit13(models_dir) -> Case:
    """The same outlier ViT at opset 13 (LayerNorm decomposed), for the NPU recipe."""
    return _vit_case(models_dir, "outlier13", 13, True)


@pytest.fixture(scope="session")
def vit_head48(models_dir) -> Case:
    """Head size 48: TensorRT has no fused INT8 attention for it."""
    return _vit_case(models_dir, "vit_h48", 17, False, heads=4)


@pytest.fixture(scope="session")
def bert(models_dir) -> Case:
    """A BERT-style masked encoder (token ids + padding mask), random weights, opset 17."""
    module, ex = tiny_bert()
    path = export_onnx(module, ex, models_dir / "bert.onnx", 17)
    return Case(path, module, NpzSamples(bert_samples(48, 32, 500, 0)), NpzSamples(bert_samples(16, 32, 500, 1)))
