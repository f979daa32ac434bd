"""``timm:NAME`` — a timm model built with random weights (no hub download); ``--weights`` fills it."""
from __future__ import annotations

import torch

from ..errors import BadInput, closest
from .base import Preprocess, built_input_size, seeded

__all__ = ["load_timm"]


def _suggestion(name: str, known: list[str]) -> str:
    """``"; did you mean 'NAME'?"`` for the nearest architecture (a ``.tag`` kept as given), or how to list them."""
    arch, dot, tag = name.partition(".")
    hit = closest(arch, known)
    if hit is not None:
        return f"; did you mean '{hit}{dot}{tag}'?"
    return f"; no timm model has a close name (timm.list_models('{arch.split('_')[0]}*') lists a family)"


def load_timm(name: str, **kwargs) -> tuple[torch.nn.Module, tuple[int, int, int], Preprocess]:
    """Build ``timm.create_model(name, pretrained=False, **kwargs)`` under a fixed seed.

    Returns:
        (module, (C, H, W) of the module as built, preprocessing from the pretrained config).
    Raises:
        BadInput: unknown model name.
    """
    import timm  # timm loads for timm: URIs only (its model zoo: seconds)
    from timm.data import resolve_data_config

    if not timm.is_model(name):
        raise BadInput(f"unknown timm model '{name}'{_suggestion(name, timm.list_models())}")
    with seeded():
        model = timm.create_model(name, pretrained=False, **kwargs)
    cfg = resolve_data_config({}, model=model)
    # the module as built decides the input size: a model built with img_size=224 whose pretrained
    # config says 518 (dinov2) takes 224
    c, h, w = built_input_size(model) or cfg["input_size"]
    crop_pct = float(cfg.get("crop_pct", 1.0) or 1.0)
    pre = Preprocess(
        input_size=(c, h, w),
        resize=int(round(h / crop_pct)),
        crop=h,
        interpolation=str(cfg.get("interpolation", "bicubic")),
        mean=tuple(float(v) for v in cfg["mean"]),
        std=tuple(float(v) for v in cfg["std"]),
        origin=f"timm's pretrained_cfg of {name} (crop_pct {crop_pct:g})",
    )
    return model, (c, h, w), pre
