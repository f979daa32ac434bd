"""``torchvision:NAME`` — a torchvision classification model with random weights."""
from __future__ import annotations

import torch

from ..errors import BadInput, did_you_mean
from .base import Preprocess, seeded
from .head import HeadRequest, head_size, last_linear

__all__ = ["load_torchvision"]


def _head(name: str, head: HeadRequest | None) -> tuple[dict, str | None]:
    """``num_classes`` for the builder when the checkpoint's head says another size. torchvision
    names no classifier in a config: the head is the model's last Linear (``fc``, ``heads.head``,
    ``classifier.1``), read from a build on the meta device (no memory, no init time)."""
    import torchvision

    if head is None:
        return {}, None
    try:
        with torch.device("meta"):
            found = last_linear(torchvision.models.get_model(name, weights=None))
    except Exception:  # noqa: BLE001 - a builder that computes on tensors (regnet) cannot run on meta
        with seeded():
            found = last_linear(torchvision.models.get_model(name, weights=None))
    names, default = ((found[0],), found[1]) if found else ((), None)
    n, note = head_size(head, names, default, f"torchvision:{name}")
    return ({} if n is None else {"num_classes": n}), note


def load_torchvision(name: str, head: HeadRequest | None = None,
                     **kwargs) -> tuple[torch.nn.Module, tuple[int, int, int], Preprocess, list[str]]:
    """Build ``torchvision.models.get_model(name, weights=None, **kwargs)`` under a fixed seed.

    The input size is the model's ``image_size`` when it has one (ViT), else 224; preprocessing is
    torchvision's ImageNet recipe (resize 256 → crop 224, bilinear).
    Args:
        name: the torchvision model name.
        head: the checkpoint and/or ``num_classes`` that decide the classifier's size.
    Returns:
        (module, (C, H, W), preprocessing, notes: a head not built at its own size, and why).
    Raises:
        BadInput: unknown model name; a ``num_classes`` the checkpoint contradicts.
    """
    import torchvision  # torchvision loads for torchvision: URIs only

    names = torchvision.models.list_models()
    if name not in names:
        hint = did_you_mean(name, names) or "; torchvision.models.list_models() lists them"
        raise BadInput(f"unknown torchvision model '{name}'{hint}")
    extra, note = _head(name, head)
    with seeded():
        model = torchvision.models.get_model(name, weights=None, **{**extra, **kwargs})
    size = int(getattr(model, "image_size", 224))
    pre = Preprocess(input_size=(3, size, size), resize=int(round(size * 256 / 224)), crop=size,
                     origin="torchvision's ImageNet recipe (resize 256/224 of the crop, bilinear, ImageNet mean/std)")
    return model, (3, size, size), pre, [note] if note else []
