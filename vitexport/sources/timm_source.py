"""``timm:NAME`` — a timm model built with random weights (no hub download); ``--weights`` fills it,
after its head (``num_classes``) and a ViT's ``pos_embed`` grid (``img_size``) have sized the model."""
from __future__ import annotations

import math
from pathlib import Path

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


def _img_size(name: str, head: HeadRequest | None) -> tuple[dict, str | None]:
    """``img_size`` for ``create_model`` when the checkpoint's ``pos_embed`` holds another square
    grid than the model's own (a ViT fine-tuned at another resolution). The model's patch size and
    prefix tokens are read from a build on the meta device (no memory, no init time); a model that
    cannot be built there, or has no ``pos_embed``, is left as it is."""
    import timm

    pos = head.state.get("pos_embed") if head is not None and head.state is not None else None
    if not isinstance(pos, torch.Tensor) or pos.ndim != 3:
        return {}, None
    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False)
        own = tuple(model.pos_embed.shape)
        patch = model.patch_embed.patch_size
    except Exception:  # noqa: BLE001 - no pos_embed / patch_embed, or a builder that computes on tensors
        return {}, None
    prefix = 0 if getattr(model, "no_embed_class", False) else int(getattr(model, "num_prefix_tokens", 0))
    grid = math.isqrt(max(pos.shape[1] - prefix, 0))
    if own == tuple(pos.shape) or grid * grid != pos.shape[1] - prefix or pos.shape[2] != own[2]:
        return {}, None
    size = (grid * patch[0], grid * patch[1])
    img = size[0] if size[0] == size[1] else size
    return {"img_size": img}, (f"timm:{name} built with img_size={img} (from pos_embed {tuple(pos.shape)} in "
                               f"{Path(str(head.weights)).name}, a {grid}x{grid} grid)")


def load_timm(name: str, head: HeadRequest | None = None,
              **kwargs) -> tuple[torch.nn.Module, tuple[int, int, int], Preprocess, list[str]]:
    """Build ``timm.create_model(name, pretrained=False, **kwargs)`` under a fixed seed.

    Args:
        name: the timm model name (a ``.tag`` allowed).
        head: the checkpoint and/or ``num_classes`` that decide the classifier's size (see
            :mod:`vitexport.sources.head`); a checkpoint's ``pos_embed`` the ``img_size``.
    Returns:
        (module, (C, H, W) of the module as built, preprocessing from the pretrained config, notes:
        a head or an ``img_size`` not the model's own, and where it came from).
    Raises:
        BadInput: unknown model name; a ``num_classes`` the checkpoint contradicts.
    """
    import timm  # timm loads for timm: URIs only (its model zoo: seconds)
    from timm.data import resolve_data_config

    if not timm.is_model(name):
        raise BadInput(f"unknown timm model '{name}'{_suggestion(name, timm.list_models())}")
    extra, note = _head(name, head)
    sized, size_note = _img_size(name, head)
    kwargs = {**extra, **sized, **kwargs}
    notes = [n for n in (note, size_note) if n]
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
    return model, (c, h, w), pre, notes
