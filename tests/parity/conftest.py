"""Fixtures for the parity tests: tiny models, their golden references and exports, built once."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from parity_models import TinyTextEncoder, export, image_batches, text_batches, tiny_vit
from vitexport.runners import TorchRunner
from vitexport.parity import capture_reference


@pytest.fixture(scope="session")
def vit():
    """4-block ViT with a low-variance residual stream (LayerScale 0.01): LayerNorm eps matters."""
    return tiny_vit(token_scale=0.01, init_values=0.01)


@pytest.fixture(scope="session")
def vit_feeds():
    return image_batches(n=8, batch=4)


@pytest.fixture(scope="session")
def vit_example(vit_feeds):
    return {"x": torch.from_numpy(vit_feeds[0]["x"])}


@pytest.fixture(scope="session")
def vit_reference(vit, vit_feeds, vit_example):
    """Captured first, with per-block activations, as the pipeline does."""
    with TorchRunner(vit, vit_example) as runner:
        return capture_reference(runner, vit_feeds, labels=np.arange(8) % 10, source="untouched torch model",
                                 layers=True)


@pytest.fixture(scope="session")
def vit_onnx(vit, vit_feeds, tmp_path_factory):
    return export(vit, vit_feeds[0], tmp_path_factory.mktemp("vit") / "vit.onnx")


@pytest.fixture(scope="session")
def text_model():
    return TinyTextEncoder()


@pytest.fixture(scope="session")
def text_feeds():
    return text_batches(n=8, batch=4)


@pytest.fixture(scope="session")
def text_example(text_feeds):
    return {k: torch.from_numpy(v) for k, v in text_feeds[0].items()}


@pytest.fixture(scope="session")
def text_reference(text_model, text_feeds, text_example):
    with TorchRunner(text_model, text_example) as runner:
        return capture_reference(runner, text_feeds, source="untouched torch model", layers=True)
