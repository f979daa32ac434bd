"""``torch.nn.MultiheadAttention`` — torchvision's ``EncoderBlock`` and hand-written models.

Its q/k/v live in one packed ``in_proj_weight`` (``fuse_qkv`` reports it unchanged). For
``mask_to_where`` the copied instance gets an explicit forward: ``attn_mask`` (boolean: True is
masked; float: additive) and ``key_padding_mask`` (same conventions) become ``torch.where`` on the
logits, and self-attention keeps one packed projection (one MatMul) as PyTorch's own path does.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .base import AttentionAdapter, QKVLayout, SiteUnsupported, install_forward
from .ops import bind_call, where_logits

__all__ = ["MultiheadAttentionAdapter"]


def _mha_where_forward(
    self,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    need_weights: bool = True,
    attn_mask: torch.Tensor | None = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
):
    self_attention = query is key and key is value
    is_batched = query.dim() == 3
    if not is_batched:  # an unbatched call: add the batch axis where this instance expects it
        bdim = 0 if self.batch_first else 1
        if self_attention:
            query = key = value = query.unsqueeze(bdim)
        else:
            query, key, value = (x.unsqueeze(bdim) for x in (query, key, value))
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    if self.batch_first:  # work in (L, N, E) like F.multi_head_attention_forward, keeping identity
        if self_attention:
            query = key = value = query.transpose(1, 0)
        else:
            query, key, value = (x.transpose(1, 0) for x in (query, key, value))
    L, N, E = query.shape
    S = key.shape[0]
    H = self.num_heads
    hd = E // H
    w, b = self.in_proj_weight, self.in_proj_bias
    if self_attention:  # one packed projection: a single MatMul in the exported graph
        q, k, v = F.linear(query, w, b).chunk(3, dim=-1)
    else:
        wq, wk, wv = w.chunk(3)
        bq, bk, bv = b.chunk(3) if b is not None else (None, None, None)
        q, k, v = F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)
    q = q.reshape(L, N * H, hd).transpose(0, 1)
    k = k.reshape(S, N * H, hd).transpose(0, 1)
    v = v.reshape(S, N * H, hd).transpose(0, 1)
    logits = torch.bmm(q * (float(hd) ** -0.5), k.transpose(1, 2)).view(N, H, L, S)
    bias = getattr(self, "vitexport_mask_bias", False)
    if attn_mask is not None:
        m = attn_mask if attn_mask.dim() == 2 else attn_mask.view(N, H, L, S)
        logits = where_logits(logits, m, bool_means_keep=False, mask_bias=bias)
    elif is_causal:
        logits = where_logits(logits, torch.ones(L, S, dtype=torch.bool, device=logits.device).tril())
    if key_padding_mask is not None:
        logits = where_logits(logits, key_padding_mask.view(N, 1, 1, S), bool_means_keep=False, mask_bias=bias)
    attn = torch.softmax(logits, dim=-1)
    if self.training and self.dropout > 0:
        attn = F.dropout(attn, p=self.dropout)
    out = torch.matmul(attn, v.view(N, H, S, hd))  # (N, H, L, hd)
    out = out.permute(2, 0, 1, 3).reshape(L * N, E)
    out = F.linear(out, self.out_proj.weight, self.out_proj.bias).view(L, N, E)
    if self.batch_first:
        out = out.transpose(1, 0)
    if not is_batched:
        out = out.squeeze(1 if not self.batch_first else 0)
    weights = None
    if need_weights:
        weights = attn.mean(dim=1) if average_attn_weights else attn
        if not is_batched:
            weights = weights.squeeze(0)
    return out, weights


class MultiheadAttentionAdapter(AttentionAdapter):
    """``torch.nn.MultiheadAttention`` (exact class)."""

    name = "torch_multihead_attention"
    priority = 0
    family = "torch"

    def matches(self, module: nn.Module) -> bool:
        return type(module) is nn.MultiheadAttention

    def qkv_layout(self, module: nn.Module) -> QKVLayout:
        if module._qkv_same_embed_dim:
            return QKVLayout.fused("nn.MultiheadAttention packs q, k and v in one 'in_proj_weight'")
        return QKVLayout.unsupported("separate q/k/v weights of different input sizes (kdim/vdim) cannot share one Linear")

    def mask_of(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
        call = bind_call(module.forward, args, kwargs)
        for name in ("attn_mask", "key_padding_mask"):
            if call.get(name) is not None:
                return call[name]
        if call.get("is_causal"):
            return torch.ones(1, dtype=torch.bool)
        return None

    def to_where(self, module: nn.Module, *, mask_bias: bool = False) -> nn.Module:
        if not module._qkv_same_embed_dim:
            raise SiteUnsupported("kdim/vdim differ from embed_dim; only packed in_proj is rewritten")
        if module.bias_k is not None or module.add_zero_attn:
            raise SiteUnsupported("add_bias_kv / add_zero_attn are not supported by the rewritten forward")
        module.vitexport_where = True
        module.vitexport_mask_bias = bool(mask_bias)
        install_forward(module, _mha_where_forward)
        return module

    def fuse_qkv(self, module: nn.Module) -> nn.Module:
        raise SiteUnsupported(self.qkv_layout(module).reason)
