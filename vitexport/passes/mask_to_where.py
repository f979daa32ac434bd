"""``mask_to_where``: attention masks become control flow, ``torch.where(keep, logits, finfo.min)``.

A float mask added to the logits is calibrated like data by a quantizer (a -1e9 in int8 destroys the
mask); a boolean ``Where`` is not. Handled: additive float masks (0 / -inf, 0 / -1e9, finfo.min, Swin's
0 / -100; a buffer, an argument, or computed in forward), boolean masks (``masked_fill``, the
``attn_mask`` of ``scaled_dot_product_attention``), ``nn.MultiheadAttention``'s ``attn_mask`` /
``key_padding_mask``, and padding masks that are model inputs (a text encoder's ``attention_mask``:
the where reads the boolean built from it). Masked logits get the dtype's minimum, never -inf, so a
fully masked row softmaxes to a uniform row instead of NaN. Unmasked positions are computed exactly as
before.

A site is an attention module that receives (or holds) a mask on the example inputs; unmasked
attention is not a site.
"""
from __future__ import annotations

import torch
from torch import nn

from ..recipe import StageToggle
from .attention import SiteUnsupported, find_attention_sites
from .base import PassReport, maybe_copy, register_pass, set_submodule
from .selfcheck import self_check_note
from ._probe import probe_inputs

__all__ = ["mask_to_where"]


@register_pass("mask_to_where")
def mask_to_where(
    model: nn.Module,
    example_inputs: dict[str, torch.Tensor],
    spec: StageToggle | None = None,
    *,
    inplace: bool = False,
) -> tuple[nn.Module, PassReport]:
    """Rewrite every masked attention to apply its mask with ``torch.where``.

    Args:
        model: the model (usually an ``OutputAdapter``); ``model(**example_inputs)`` runs it.
        example_inputs: inputs for the run that finds which attention receives a mask (2-D integer
            ``*mask*`` inputs get their last column flipped for that run so the mask path runs).
        spec: ``enabled`` toggle from the recipe.
        inplace: rewrite ``model`` itself instead of a copy.
    Returns:
        (model, report): found = masked attention sites; changed = rewritten to ``where``.
    """
    report = PassReport("mask_to_where")
    if spec is not None and not spec.enabled:
        report.notes.append("disabled by the recipe")
        return model, report
    model = maybe_copy(model, inplace)
    sites, notes, reference = find_attention_sites(model, example_inputs)
    report.notes.extend(notes)
    rewritten: dict[int, tuple[object, list[tuple[str, nn.Module]]]] = {}
    for site in sites:
        if not site.has_mask:
            continue
        report.found += 1
        if site.is_where:
            report.skip(site.name, "already applies its mask with torch.where")
            continue
        if not site.name:
            report.skip(site.name, "the model itself is the attention module; wrap it to rewrite it")
            continue
        try:
            new = site.adapter.to_where(site.module, mask_bias=site.mask_bias)
        except SiteUnsupported as exc:
            report.skip(site.name, str(exc))
            continue
        if new is not site.module:
            set_submodule(model, site.name, new)
        rewritten.setdefault(id(site.adapter), (site.adapter, []))[1].append((site.name, new))
        report.change(site.name, "where", f"{site.adapter.name}: {site.describe_mask()}")
    for adapter, mods in rewritten.values():
        report.notes.extend(adapter.finalize(model, mods))  # type: ignore[attr-defined]
    if report.found == 0:
        report.notes.append(
            f"{len(sites)} attention module(s) recognised, none receives a mask" if sites else "no attention module recognised"
        )
    elif report.changed:
        report.notes.append(self_check_note(model, probe_inputs(example_inputs), reference))
    return model, report
