"""``mask_to_where``: attention masks become control flow, ``torch.where(keep, logits, finfo.min)``.

A float mask added to the logits is calibrated like data by a quantizer (a -1e9 in int8 destroys the
mask); a boolean ``Where`` is not. A **mask** is boolean, or holds only 0 and very negative values, and
comes from the inputs or from constants: padding masks (a text encoder's ``attention_mask``), causal
masks, shifted-window masks (Swin), however the model applies them (an add, ``masked_fill``,
``scaled_dot_product_attention``'s ``attn_mask`` / ``is_causal``, ``nn.MultiheadAttention``'s masks).
A **bias** (a relative position table, anything a parameter feeds) is not a mask: it stays an add,
and the report counts it. A mask already added to a learned bias is separated from it: the bias is
still added where the mask keeps.

Masked logits get the dtype's minimum, never -inf, so a fully masked row softmaxes to a uniform row
instead of NaN. Unmasked positions are computed exactly as before. Hugging Face models switch to the
``"vitexport"`` attention implementation (transformers' attention registry), whose masks are
booleans built from the inputs.

A site is an attention that receives (or holds) a mask on the example inputs; unmasked attention is
not a site (``stats`` counts every attention, masks and biases).
"""
from __future__ import annotations

import torch
from torch import nn

from ..recipe import StageToggle
from .attention import SiteUnsupported, find_attention_sites
from .attention.sites import AttentionSite
from .base import PassReport, maybe_copy, register_pass, set_submodule
from .selfcheck import self_check_note
from ._probe import probe_inputs

__all__ = ["mask_to_where"]


def _bias_note(sites: list[AttentionSite]) -> str | None:
    biased = [(s.name, t) for s in sites for t in s.biases]
    if not biased:
        return None
    kinds = sorted({t.describe() for _, t in biased})
    names = sorted({n for n, _ in biased})
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return f"{len(biased)} bias(es) kept as adds, not masks: {'; '.join(kinds)} at {shown}"


def _rewrite(model: nn.Module, sites: list[AttentionSite], report: PassReport) -> list[str]:
    rewritten: dict[object, tuple[object, list[tuple[str, nn.Module]]]] = {}
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
        group = getattr(site.adapter, "group", None) or id(site.adapter)
        rewritten.setdefault(group, (site.adapter, []))[1].append((site.name, new))
        report.change(site.name, "where", f"{site.adapter.name}: {site.describe_mask()}")
    notes = []
    for adapter, mods in rewritten.values():
        notes.extend(adapter.finalize(model, mods))  # type: ignore[attr-defined]
    return notes


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
        (model, report): found = masked attention sites; changed = rewritten to ``where``;
        ``stats``: ``attention_sites``, ``masks``, ``biases``.
    """
    report = PassReport("mask_to_where")
    if spec is not None and not spec.enabled:
        report.notes.append("disabled by the recipe")
        return model, report
    model = maybe_copy(model, inplace)
    sites, notes, reference = find_attention_sites(model, example_inputs)
    report.notes.extend(notes)
    report.notes.extend(_rewrite(model, sites, report))
    report.stats = {
        "attention_sites": len(sites), "masks": report.found, "biases": sum(len(s.biases) for s in sites),
    }
    bias = _bias_note(sites)
    if bias:
        report.notes.append(bias)
    if report.found == 0:
        report.notes.append(
            f"{len(sites)} attention module(s) recognised, none receives a mask" if sites else "no attention module recognised"
        )
    elif report.changed:
        report.notes.append(self_check_note(model, probe_inputs(example_inputs), reference))
    return model, report
