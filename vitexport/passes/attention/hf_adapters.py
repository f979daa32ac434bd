"""Hugging Face (transformers >= 5): ViT / DeiT ``*Attention`` and BERT ``BertSelfAttention``.

These classes compute q, k, v with three Linears and dispatch the attention math through
``ALL_ATTENTION_FUNCTIONS`` by ``config._attn_implementation`` (eager: the mask is added; sdpa: the mask
goes into SDPA). The copied instance gets a forward that projects q/k/v (fused or not) and, once
``mask_to_where`` ran, does the softmax itself with the mask as ``torch.where`` — the same for eager
and sdpa configs.
"""
from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

import torch
from torch import nn

from .base import AttentionAdapter, QKVLayout, SiteUnsupported, install_forward
from .ops import bind_call, fuse_linears, project_qkv, where_logits

__all__ = ["HFSelfAttentionAdapter", "HF_ATTENTION_CLASSES"]

# (module, class) of the self-attention classes whose forward ``_hf_attention_forward`` reproduces.
HF_ATTENTION_CLASSES: tuple[tuple[str, str], ...] = (
    ("transformers.models.vit.modeling_vit", "ViTAttention"),
    ("transformers.models.deit.modeling_deit", "DeiTAttention"),
    ("transformers.models.bert.modeling_bert", "BertSelfAttention"),
)
_QKV_NAMES = (("q_proj", "k_proj", "v_proj"), ("query", "key", "value"))


def _classes() -> tuple[type, ...]:
    out = []
    for mod, name in HF_ATTENTION_CLASSES:
        try:
            cls = getattr(importlib.import_module(mod), name, None)
        except ImportError:
            cls = None
        if cls is not None:
            out.append(cls)
    return tuple(out)


def _qkv_names(module: nn.Module) -> tuple[str, str, str] | None:
    split = getattr(module, "vitexport_qkv_split", None)
    if split is not None:
        return tuple(split[1])  # type: ignore[return-value]
    for names in _QKV_NAMES:
        if all(isinstance(getattr(module, n, None), nn.Linear) for n in names):
            return names
    return None


def _head_dim(module: nn.Module) -> int:
    return int(getattr(module, "head_dim", None) or getattr(module, "attention_head_size"))


def _dropout_p(module: nn.Module) -> float:
    if not module.training:
        return 0.0
    p = getattr(module, "attention_dropout", None)
    return float(p if p is not None else module.dropout.p)


def _hf_attention_forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, *args, **kwargs):
    cache = kwargs.pop("cache", None)
    if cache is None:
        cache = kwargs.pop("past_key_values", None)
    if cache is None and args:
        cache = args[0]
    if cache is not None or kwargs.get("encoder_hidden_states") is not None:
        raise NotImplementedError("vitexport's rewritten attention serves encoder self-attention: no KV cache, no cross-attention")
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, _head_dim(self))
    q, k, v = project_qkv(self, hidden_states, self.vitexport_qkv_names)
    q = q.view(hidden_shape).transpose(1, 2)
    k = k.view(hidden_shape).transpose(1, 2)
    v = v.view(hidden_shape).transpose(1, 2)
    if getattr(self, "vitexport_where", False):
        logits = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        # HF masks are boolean "take part" (sdpa) or additive 0 / finfo.min (eager).
        logits = where_logits(logits, attention_mask, bool_means_keep=True, mask_bias=getattr(self, "vitexport_mask_bias", False))
        weights = nn.functional.softmax(logits, dim=-1, dtype=torch.float32).to(q.dtype)
        weights = nn.functional.dropout(weights, p=_dropout_p(self), training=self.training)
        out = torch.matmul(weights, v).transpose(1, 2).contiguous()
    else:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        eager = getattr(sys.modules[type(self).__module__], "eager_attention_forward")
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager)
        out, weights = interface(self, q, k, v, attention_mask, dropout=_dropout_p(self), scaling=self.scaling, **kwargs)
    out = out.reshape(*input_shape, -1).contiguous()
    if isinstance(getattr(self, "o_proj", None), nn.Module):
        out = self.o_proj(out)
    return out, weights


def _dispatches_attention(module: nn.Module) -> bool:
    # Unwrap decorators (deprecate_kwarg) to read the names the real forward uses.
    code = getattr(inspect.unwrap(type(module).forward), "__code__", None)
    return code is not None and "ALL_ATTENTION_FUNCTIONS" in code.co_names


class HFSelfAttentionAdapter(AttentionAdapter):
    """The Hugging Face self-attention classes listed in ``HF_ATTENTION_CLASSES`` (exact classes)."""

    name = "hf_self_attention"
    priority = 0
    family = "hf"

    def matches(self, module: nn.Module) -> bool:
        if not type(module).__module__.startswith("transformers."):
            return False  # never import transformers for a model that does not use it
        classes = _classes()
        if not classes or type(module) not in classes:
            return False
        params = list(inspect.signature(type(module).forward).parameters)
        # transformers 4.x attention took (hidden_states, head_mask, output_attentions): not this forward.
        return len(params) >= 3 and params[2] == "attention_mask" and _qkv_names(module) is not None

    def qkv_layout(self, module: nn.Module) -> QKVLayout:
        if getattr(module, "vitexport_qkv_split", None) is not None:
            return QKVLayout.fused(f"q, k, v already fused into '{module.vitexport_qkv_split[0]}'")
        names = _qkv_names(module)
        return QKVLayout.separate(*names) if names else QKVLayout.unsupported("no q/k/v Linears found")

    def mask_of(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
        return bind_call(module.forward, args, kwargs).get("attention_mask")

    def _install(self, module: nn.Module) -> None:
        if getattr(module, "config", None) is not None and getattr(module.config, "is_decoder", False):
            raise SiteUnsupported("decoder attention (KV cache) is not rewritten")
        if not hasattr(module, "vitexport_qkv_names"):
            module.vitexport_qkv_names = _qkv_names(module)
        install_forward(module, _hf_attention_forward)

    def to_where(self, module: nn.Module, *, mask_bias: bool = False) -> nn.Module:
        self._install(module)
        module.vitexport_where = True
        module.vitexport_mask_bias = bool(mask_bias)
        return module

    def fuse_qkv(self, module: nn.Module) -> nn.Module:
        names = _qkv_names(module)
        if names is None:
            raise SiteUnsupported("no q/k/v Linears found")
        self._install(module)
        fuse_linears(module, names)
        return module

    def finalize(self, model: nn.Module, rewritten: list[tuple[str, nn.Module]]) -> list[str]:
        """After ``mask_to_where``: let eager configs build boolean masks.

        An eager config makes the model turn ``attention_mask`` into a float 0 / finfo.min tensor, and
        the where would have to recover the boolean from it. When every module of the model that
        dispatches on that config is one we rewrote (it no longer uses the attention interface), the
        config can ask for sdpa-format masks: the where then reads the boolean built from the input.
        """
        notes = []
        where_mods = [m for _, m in rewritten if getattr(m, "vitexport_where", False)]
        configs = {id(m.config): m.config for m in where_mods if getattr(m, "config", None) is not None}
        for cfg in configs.values():
            if getattr(cfg, "_attn_implementation", None) != "eager":
                continue
            users = [m for m in model.modules() if getattr(m, "config", None) is cfg and _dispatches_attention(m)]
            if users and all(getattr(m, "vitexport_where", False) for m in users):
                cfg._attn_implementation = "sdpa"
                notes.append(
                    f"{type(cfg).__name__}: masks now built as booleans (sdpa format) instead of eager's "
                    "0/finfo.min floats; the attention math is vitexport's own, so only the mask format changes"
                )
        return notes
