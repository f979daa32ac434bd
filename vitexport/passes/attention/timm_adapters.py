"""timm: ``timm.layers.Attention`` (ViT, DeiT; fused-SDPA or explicit path) and Swin's ``WindowAttention``.

Both already project q, k, v with one Linear (``qkv``), so ``fuse_qkv`` reports them unchanged. For
``mask_to_where`` the copied instance gets an explicit softmax forward (never SDPA: SDPA takes the mask
as an additive input) that applies the mask with :func:`~.ops.where_logits`.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .base import AttentionAdapter, QKVLayout, SiteUnsupported, install_forward
from .ops import bind_call, where_logits

__all__ = ["TimmAttentionAdapter", "TimmWindowAttentionAdapter"]


def _timm_class(module: nn.Module, module_path: str, name: str) -> type | None:
    if not type(module).__module__.startswith("timm."):
        return None  # never import timm for a model that does not use it
    try:
        import importlib

        return getattr(importlib.import_module(module_path), name, None)
    except ImportError:  # timm is optional for the passes
        return None


def _timm_attention_forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
    # Mirrors timm.layers.Attention.forward's explicit path; the mask is control flow (torch.where).
    B, N, C = x.shape
    gate = self.gate(x).sigmoid() if getattr(self, "gate", None) is not None else None
    head_dim = getattr(self, "head_dim", C // self.num_heads)
    attn_dim = self.num_heads * head_dim
    qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q, k = self.q_norm(q), self.k_norm(k)
    q = q * self.scale
    attn = q @ k.transpose(-2, -1)
    if is_causal:  # timm: is_causal takes precedence over attn_mask
        keep = torch.ones(N, N, dtype=torch.bool, device=x.device).tril()
        attn = where_logits(attn, keep)
    else:
        attn = where_logits(attn, attn_mask, bool_means_keep=True, mask_bias=getattr(self, "vitexport_mask_bias", False))
    attn = attn.softmax(dim=-1)
    attn = self.attn_drop(attn)
    x = attn @ v
    x = x.transpose(1, 2).reshape(B, N, attn_dim)
    x = self.norm(x) if hasattr(self, "norm") else x
    if gate is not None:
        x = x * gate
    x = self.proj(x)
    return self.proj_drop(x)


def _timm_window_attention_forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    # Mirrors timm WindowAttention.forward's explicit path; relative position bias stays an add (it is
    # data, not a mask), the shifted-window mask becomes torch.where.
    B_, N, C = x.shape
    qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q = q * self.scale
    attn = q @ k.transpose(-2, -1)
    attn = attn + self._get_rel_pos_bias()
    if mask is not None:
        num_win = mask.shape[0]
        attn = attn.view(-1, num_win, self.num_heads, N, N)
        attn = where_logits(attn, mask.unsqueeze(1).unsqueeze(0), mask_bias=getattr(self, "vitexport_mask_bias", False))
        attn = attn.view(-1, self.num_heads, N, N)
    attn = self.softmax(attn)
    attn = self.attn_drop(attn)
    x = attn @ v
    x = x.transpose(1, 2).reshape(B_, N, -1)
    x = self.proj(x)
    return self.proj_drop(x)


class TimmAttentionAdapter(AttentionAdapter):
    """``timm.layers.Attention`` (exact class): ViT, DeiT, and every timm model built on it."""

    name = "timm_attention"
    priority = 0
    family = "timm"

    def matches(self, module: nn.Module) -> bool:
        cls = _timm_class(module, "timm.layers.attention", "Attention")
        return cls is not None and type(module) is cls

    def qkv_layout(self, module: nn.Module) -> QKVLayout:
        return QKVLayout.fused("timm Attention projects q, k and v with one Linear 'qkv'")

    def mask_of(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
        call = bind_call(module.forward, args, kwargs)
        if call.get("is_causal"):
            n = call["x"].shape[1]
            return torch.ones(n, n, dtype=torch.bool).tril()
        return call.get("attn_mask")

    def to_where(self, module: nn.Module, *, mask_bias: bool = False) -> nn.Module:
        # The fused path hands the mask to SDPA as an additive input; the explicit forward below never
        # takes it, whatever fused_attn says. Set it anyway so the instance tells the truth.
        module.fused_attn = False
        module.vitexport_where = True
        module.vitexport_mask_bias = bool(mask_bias)
        install_forward(module, _timm_attention_forward)
        return module

    def fuse_qkv(self, module: nn.Module) -> nn.Module:
        raise SiteUnsupported(self.qkv_layout(module).reason)


class TimmWindowAttentionAdapter(AttentionAdapter):
    """timm Swin ``WindowAttention`` (exact class); its mask (0 / -100) arrives as the ``mask`` argument,
    from a buffer of the block or computed in forward (``dynamic_mask``)."""

    name = "timm_swin_window_attention"
    priority = 0
    family = "timm"

    def matches(self, module: nn.Module) -> bool:
        cls = _timm_class(module, "timm.models.swin_transformer", "WindowAttention")
        return cls is not None and type(module) is cls

    def qkv_layout(self, module: nn.Module) -> QKVLayout:
        return QKVLayout.fused("timm Swin WindowAttention projects q, k and v with one Linear 'qkv'")

    def mask_of(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
        return bind_call(module.forward, args, kwargs).get("mask")

    def to_where(self, module: nn.Module, *, mask_bias: bool = False) -> nn.Module:
        module.fused_attn = False
        module.vitexport_where = True
        module.vitexport_mask_bias = bool(mask_bias)
        install_forward(module, _timm_window_attention_forward)
        return module

    def fuse_qkv(self, module: nn.Module) -> nn.Module:
        raise SiteUnsupported(self.qkv_layout(module).reason)
