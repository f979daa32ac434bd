"""Attention adapters: how the passes recognise and rewrite each family's attention.

Built-in adapters (registered on import): timm ``Attention`` and Swin ``WindowAttention``, Hugging Face
ViT / DeiT / BERT self-attention, ``torch.nn.MultiheadAttention`` (torchvision ``EncoderBlock``).
Modules no adapter matches are traced (:mod:`.fx_pattern`); see :mod:`vitexport.passes` for how to
register your own adapter.
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
from .fx_pattern import TracedAttention, TraceFailure, analyse_module
from .hf_adapters import HFSelfAttentionAdapter
from .mha_adapter import MultiheadAttentionAdapter
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
from .sites import AttentionSite, find_attention_sites
from .timm_adapters import TimmAttentionAdapter, TimmWindowAttentionAdapter

__all__ = [
    "ATTENTION_ADAPTERS",
    "AttentionAdapter",
    "AttentionSite",
    "QKVLayout",
    "SiteUnsupported",
    "TracedAttention",
    "TraceFailure",
    "MASKED_AT_OR_BELOW",
    "adapter_for",
    "analyse_module",
    "bind_call",
    "find_attention_sites",
    "fuse_linears",
    "install_forward",
    "is_binary_additive",
    "keep_from_mask",
    "masked_value",
    "project_qkv",
    "register_attention_adapter",
    "unregister_attention_adapter",
    "where_logits",
    "HFSelfAttentionAdapter",
    "MultiheadAttentionAdapter",
    "TimmAttentionAdapter",
    "TimmWindowAttentionAdapter",
]

for _builtin in (TimmAttentionAdapter, TimmWindowAttentionAdapter, HFSelfAttentionAdapter, MultiheadAttentionAdapter):
    if _builtin.name not in ATTENTION_ADAPTERS:  # a re-import (importlib.reload) must not fail
        register_attention_adapter(_builtin)
