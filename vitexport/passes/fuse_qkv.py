"""``fuse_qkv``: separate Linears reading the same input and feeding one attention become one Linear.

Found by structure in the observed run, not by attribute names: Hugging Face ``q_proj/k_proj/v_proj``
or ``query/key/value``, DistilBERT's ``q_lin/k_lin/v_lin``, ConViT's ``qk`` + ``v``, hand-written
``q/k/v`` all get one projection (one MatMul/Gemm in the exported graph), weights stacked in q, k, v
order; the old attributes become slices of it (:mod:`.attention.fused`), so the module's own code
runs unchanged. Already fused layouts (timm ``qkv``, ``nn.MultiheadAttention``'s ``in_proj``),
cross-attention and convolution projections are reported unchanged, with the reason.
"""
from __future__ import annotations

import torch
from torch import nn

from ..recipe import StageToggle
from .attention import SiteUnsupported, find_attention_sites
from .base import PassReport, maybe_copy, register_pass, set_submodule
from .selfcheck import self_check_note
from ._probe import probe_inputs

__all__ = ["fuse_qkv"]


@register_pass("fuse_qkv")
def fuse_qkv(
    model: nn.Module,
    example_inputs: dict[str, torch.Tensor],
    spec: StageToggle | None = None,
    *,
    inplace: bool = False,
) -> tuple[nn.Module, PassReport]:
    """Fuse separate q/k/v projections of every recognised attention.

    Args:
        model: the model (usually an ``OutputAdapter``); ``model(**example_inputs)`` runs it.
        example_inputs: inputs for the run that records how each attention is called.
        spec: ``enabled`` toggle from the recipe.
        inplace: rewrite ``model`` itself instead of a copy.
    Returns:
        (model, report): found = attention sites; changed = fused; already fused or unsupported
        layouts are skipped with the reason; ``stats["already_fused"]`` counts the former.
    """
    report = PassReport("fuse_qkv")
    if spec is not None and not spec.enabled:
        report.notes.append("disabled by the recipe")
        return model, report
    model = maybe_copy(model, inplace)
    sites, notes, reference = find_attention_sites(model, example_inputs)
    report.notes.extend(notes)
    report.stats = {"already_fused": 0}
    for site in sites:
        report.found += 1
        layout = site.layout
        if layout.kind == "fused":
            report.stats["already_fused"] += 1
            report.skip(site.name, f"already fused: {layout.reason}")
            continue
        if layout.kind != "separate":
            report.skip(site.name, layout.reason)
            continue
        if not site.name:
            report.skip(site.name, "the model itself is the attention module; wrap it to rewrite it")
            continue
        try:
            new = site.adapter.fuse_qkv(site.module)
        except SiteUnsupported as exc:
            report.skip(site.name, str(exc))
            continue
        if new is not site.module:
            set_submodule(model, site.name, new)
        report.change(site.name, "fuse", f"{site.adapter.name}: {'/'.join(layout.names)} -> one Linear")
    if report.found == 0:
        report.notes.append("no attention module recognised")
    elif report.changed:
        report.notes.append(self_check_note(model, probe_inputs(example_inputs), reference))
    return model, report
