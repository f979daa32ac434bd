"""Hugging Face attention through transformers' own extension points.

Every model whose attention modules call ``ALL_ATTENTION_FUNCTIONS.get_interface(...)`` (ViT, DeiT,
Dinov2, CLIP, SigLIP, BEiT, YOLOS, Swin, BERT, RoBERTa, DistilBERT, ...) can be given another
attention implementation by name. vitexport registers one, ``"vitexport"``, in both registries:

* ``AttentionInterface``: explicit MatMul → Softmax → MatMul (the eager math), with a boolean mask
  applied as ``torch.where(mask, logits, finfo.min)``;
* ``AttentionMaskInterface``: the masks the models build (``masking_utils.create_bidirectional_mask``
  and friends) come out boolean, and a padding-only mask is the 2-D input itself broadcast
  (Unsqueeze), with none of the And / index plumbing an edge compiler refuses.

``model.set_attn_implementation("vitexport")`` switches a model over. Float masks some models build
themselves (Swin's shifted windows, added to the relative position bias before the call) are handled
per attention module from what the observed run saw: ``vitexport_mask`` on the module says how, and a
constant mask under a learned bias leaves its ``keep`` as a buffer.
"""
from __future__ import annotations

import inspect
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .ops import keep_from_mask, masked_value, where_logits

__all__ = [
    "IMPLEMENTATION", "Registration", "dispatches", "register", "attention", "boolean_mask", "plan_site", "switch",
]

IMPLEMENTATION = "vitexport"
_PLAN = "vitexport_mask"  # "mask" | "kept" | "split"
_KEEP = "vitexport_keep"


def dispatches(module: nn.Module) -> bool:
    """True when ``module`` (a transformers class) runs its attention through the attention interface."""
    if not type(module).__module__.startswith("transformers.") or getattr(module, "config", None) is None:
        return False
    # Unwrap decorators (deprecate_kwarg) to read the names the real forward uses.
    code = getattr(inspect.unwrap(type(module).forward), "__code__", None)
    return code is not None and "ALL_ATTENTION_FUNCTIONS" in code.co_names


def register() -> None:
    """Register ``"vitexport"`` in transformers' attention and mask registries (once)."""
    # transformers loads only for a model that uses it (measured: 4 s, 60 MB on this machine)
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if IMPLEMENTATION not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(IMPLEMENTATION, attention)
    if IMPLEMENTATION not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionMaskInterface.register(IMPLEMENTATION, boolean_mask)


class Registration:
    """Kept on a switched attention module: unpickling or copying the model registers ``"vitexport"``
    again, so a model saved after the pass runs in a process that never ran it."""

    def __reduce__(self):
        return _registered, ()


def _registered() -> Registration:
    register()
    return Registration()


def _float_mask(module: nn.Module, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    plan = getattr(module, _PLAN, None)
    if plan is None:  # what eager does: a bias (a relative position table), added as it is
        return logits + mask
    if plan == "mask":
        return where_logits(logits, mask)
    keep = getattr(module, _KEEP, None) if plan == "split" else None
    if keep is None or torch.broadcast_shapes(keep.shape, mask.shape) != tuple(mask.shape):
        keep = keep_from_mask(mask, bool_means_keep=True)
    # The bias is added where the mask keeps (zero elsewhere: no very negative value reaches an add).
    logits = logits + torch.where(keep, mask.to(logits.dtype), 0.0)
    return torch.where(keep, logits, masked_value(logits.dtype))


def attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``"vitexport"`` attention function (transformers' attention-function signature).

    Returns:
        (output ``(batch, tokens, heads, head_dim)``, attention weights), like the eager function.
    """
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    if key.shape[1] != query.shape[1]:  # grouped-query attention: repeat the key/value heads
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        value = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
    logits = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            logits = where_logits(logits, attention_mask, bool_means_keep=True)
        else:
            logits = _float_mask(module, logits, attention_mask)
    weights = F.softmax(logits, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def boolean_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    allow_is_causal_skip: bool = True,
    allow_is_bidirectional_skip: bool = False,
    use_vmap: bool = False,
    device: Any = "cpu",
    **kwargs: Any,
) -> torch.Tensor | None:
    """The ``"vitexport"`` mask function: boolean, True takes part (transformers' mask signature).

    A padding-only (bidirectional) mask is the 2-D mask broadcast to ``(batch, 1, 1, keys)``; every
    other pattern (causal, sliding windows) is transformers' own ``sdpa_mask``, always materialised.
    """
    from transformers.masking_utils import bidirectional_mask_function, prepare_padding_mask, sdpa_mask  # transformers: only for a model that uses it
    from transformers.utils import is_tracing

    padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    plain = mask_function is bidirectional_mask_function and not use_vmap and local_size is None
    if plain and (padding is None or (padding.dim() == 2 and padding.shape[-1] == kv_length)):
        if padding is None:
            return None
        if allow_is_bidirectional_skip and not is_tracing(padding) and bool(padding.all()):
            return None  # nothing padded: no mask at all (outside an export, like sdpa does)
        return padding[:, None, None, :].to(torch.bool)
    return sdpa_mask(
        batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
        mask_function=mask_function, attention_mask=attention_mask, local_size=local_size,
        allow_is_causal_skip=False, allow_is_bidirectional_skip=allow_is_bidirectional_skip,
        use_vmap=use_vmap, device=device, **kwargs,
    )


def plan_site(module: nn.Module, how: str, keep: torch.Tensor | None = None) -> None:
    """Tell the ``"vitexport"`` attention how this module's float masks are made.

    Args:
        module: the attention module (its own instance attributes; the class is untouched).
        how: ``mask`` (0 / very negative), ``kept`` (a mask carrying a bias: add the bias where it
            keeps), ``split`` (a constant mask added to a learned bias: ``keep`` says which positions).
        keep: for ``split``, the boolean kept positions (stored as a non-persistent buffer).
    """
    setattr(module, _PLAN, how)
    module.vitexport_registration = Registration()
    if keep is not None:
        module.register_buffer(_KEEP, keep.detach().clone(), persistent=False)


def switch(model: nn.Module, site_names: Iterable[str]) -> list[str]:
    """``set_attn_implementation("vitexport")`` on the outermost transformers models holding ``site_names``.

    Returns:
        One note per switched model.
    """
    from transformers import PreTrainedModel  # transformers: only for a model that uses it

    register()
    names = list(site_names)
    switched: list[str] = []
    notes = []
    for name, module in model.named_modules():
        if not isinstance(module, PreTrainedModel) or any(name == s or name.startswith(s + ".") for s in switched):
            continue
        prefix = name + "." if name else ""
        if any(s == name or s.startswith(prefix) for s in names):
            module.set_attn_implementation(IMPLEMENTATION)
            switched.append(name)
            notes.append(f"{name or '<model>'} ({type(module).__name__}): set_attn_implementation('{IMPLEMENTATION}') "
                         "(transformers' AttentionInterface; boolean masks from its mask utilities)")
    return notes
