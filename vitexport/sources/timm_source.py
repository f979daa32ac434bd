"""``timm:NAME`` — a timm model built with random weights (no hub download); ``--weights`` fills it."""
from __future__ import annotations

import torch

from ..errors import BadInput, closest
from .base import Preprocess, built_input_size, seeded
from .head import HeadRequest, head_size

__all__ = ["load_timm"]


def _suggestion(name: str, known: list[str]) -> str:
    """``"; did you mean 'NAME'?"`` for the nearest architecture (a ``.tag`` kept as given), or how to list them."""
    arch, dot, tag = name.partition(".")
    hit = closest(arch, known)
    if hit is not None:
        return f"; did you mean '{hit}{dot}{tag}'?"
    return f"; no timm model has a close name (timm.list_models('{arch.split('_')[0]}*') lists a family)"


def _head(name: str, head: HeadRequest | None) -> tuple[dict, str | None]:
    """``num_classes`` for ``create_model`` when the checkpoint's head (found by the name timm's
    pretrained_cfg gives the classifier: ``head``, ``head.fc``, ``('head', 'head_dist')``) or
    ``head.num_classes`` says another size than the model's own."""
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(name)
    names = getattr(cfg, "classifier", None) or ()
    names = (names,) if isinstance(names, str) else tuple(names)
    n, note = head_size(head, names, getattr(cfg, "num_classes", None), f"timm:{name}")
    return ({} if n is None else {"num_classes": n}), note


def load_timm(name: str, head: HeadRequest | None = None,
              **kwargs) -> tuple[torch.nn.Module, tuple[int, int, int], Preprocess, str | None]:
    """Build ``timm.create_model(name, pretrained=False, **kwargs)`` under a fixed seed.

    Args:
        name: the timm model name (a ``.tag`` allowed).
        head: the checkpoint and/or ``num_classes`` that decide the classifier's size (see
            :mod:`vitexport.sources.head`).
    Returns:
        (module, (C, H, W) of the module as built, preprocessing from the pretrained config, a note
        when the head was not built at the model's own size).
    Raises:
        BadInput: unknown model name; a ``num_classes`` the checkpoint contradicts.
    """
    import timm  # timm loads for timm: URIs only (its model zoo: seconds)
    from timm.data import resolve_data_config

    if not timm.is_model(name):
        raise BadInput(f"unknown timm model '{name}'{_suggestion(name, timm.list_models())}")
    extra, note = _head(name, head)
    kwargs = {**extra, **kwargs}
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
    return model, (c, h, w), pre, note
