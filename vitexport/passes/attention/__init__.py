"""How the passes recognise and rewrite attention, in every family, without per-family code.

The model runs once under observation (:mod:`.observation`); attention is recognised by its shape in that
run (:mod:`.patterns`: softmax between two products of projections, or
``scaled_dot_product_attention``), and each mask term is told apart from a bias. Rewrites use the
hook each module offers: transformers' attention registry for Hugging Face models
(:mod:`.hf_interface`), a scoped ``TorchFunctionMode`` for any other module (:mod:`.runtime`), and
slices of one fused Linear for q/k/v fusion (:mod:`.fused`).

Registered adapters (:class:`AttentionAdapter`) take precedence for the modules they match: the
built-in one for ``torch.nn.MultiheadAttention`` (its math happens inside one opaque call), and any a
user registers; see :mod:`vitexport.passes` for how.
"""
from __future__ import annotations

from .base import (
    ATTENTION_ADAPTERS,
    AttentionAdapter,
    QKVLayout,
    SiteUnsupported,
    adapter_for,
    install_forward,
    register_attention_adapter,
    unregister_attention_adapter,
)
from .fused import FusedProjection, ProjectionSlice, fuse_projections
from .mha_adapter import MultiheadAttentionAdapter
from .observed_adapter import ObservedAttention
from .ops import (
    MASKED_AT_OR_BELOW,
    bind_call,
    fuse_linears,
    is_binary_additive,
    keep_from_mask,
    masked_value,
    project_qkv,
    where_logits,
)
from .patterns import MaskTerm, Pattern, find_patterns
from .sites import AttentionSite, find_attention_sites

__all__ = [
    "ATTENTION_ADAPTERS",
    "AttentionAdapter",
    "AttentionSite",
    "QKVLayout",
    "SiteUnsupported",
    "ObservedAttention",
    "MaskTerm",
    "Pattern",
    "FusedProjection",
    "ProjectionSlice",
    "MASKED_AT_OR_BELOW",
    "adapter_for",
    "bind_call",
    "find_attention_sites",
    "find_patterns",
    "fuse_linears",
    "fuse_projections",
    "install_forward",
    "is_binary_additive",
    "keep_from_mask",
    "masked_value",
    "project_qkv",
    "register_attention_adapter",
    "unregister_attention_adapter",
    "where_logits",
    "MultiheadAttentionAdapter",
]

if MultiheadAttentionAdapter.name not in ATTENTION_ADAPTERS:  # a re-import (importlib.reload) must not fail
    register_attention_adapter(MultiheadAttentionAdapter)
