"""``torchvision:NAME`` — a torchvision classification model with random weights."""
from __future__ import annotations

import torch

from ..errors import BadInput, did_you_mean
from .base import Preprocess, seeded

__all__ = ["load_torchvision"]


def load_torchvision(name: str, **kwargs) -> tuple[torch.nn.Module, tuple[int, int, int], Preprocess]:
    """Build ``torchvision.models.get_model(name, weights=None, **kwargs)`` under a fixed seed.

    The input size is the model's ``image_size`` when it has one (ViT), else 224; preprocessing is
    torchvision's ImageNet recipe (resize 256 → crop 224, bilinear).
    Raises:
        BadInput: unknown model name.
    """
    import torchvision  # torchvision loads for torchvision: URIs only

    names = torchvision.models.list_models()
    if name not in names:
        hint = did_you_mean(name, names) or "; torchvision.models.list_models() lists them"
        raise BadInput(f"unknown torchvision model '{name}'{hint}")
    with seeded():
        model = torchvision.models.get_model(name, weights=None, **kwargs)
    size = int(getattr(model, "image_size", 224))
    pre = Preprocess(input_size=(3, size, size), resize=int(round(size * 256 / 224)), crop=size,
                     origin="torchvision's ImageNet recipe (resize 256/224 of the crop, bilinear, ImageNet mean/std)")
    return model, (3, size, size), pre
