"""The tensor operations every rewritten attention shares: masks as ``torch.where``, fused projections.

Attention forwards installed by the adapters call these, so all families agree on what a mask means
and on the value that replaces masked logits.
"""
from __future__ import annotations

import inspect
from typing import Any, Sequence

import torch
from torch import nn

__all__ = [
    "MASKED_AT_OR_BELOW",
    "masked_value",
    "is_binary_additive",
    "keep_from_mask",
    "where_logits",
    "fuse_linears",
    "fused_qkv_name",
    "project_qkv",
    "bind_call",
]

# An additive mask entry at or below this value counts as "masked". Swin's shifted-window mask uses
# -100, Hugging Face uses finfo.min, hand-written models -1e9 or -inf. A logit lowered by >= 100 has
# softmax weight <= e^-100 ~ 4e-44 of the row maximum, below float32's smallest normal number, so
# treating it as exactly masked changes nothing a float32 output can show.
MASKED_AT_OR_BELOW = -100.0


def masked_value(dtype: torch.dtype) -> float:
    """The value masked logits get: the dtype's most negative finite number, never -inf.

    A fully masked row then softmaxes to a uniform row instead of NaN (-inf - -inf).
    """
    return float(torch.finfo(dtype).min)


def is_binary_additive(mask: torch.Tensor) -> bool:
    """True when every entry of a float mask is exactly 0 or masked (<= ``MASKED_AT_OR_BELOW``)."""
    if mask.dtype == torch.bool:
        return True
    m = mask.detach()
    return bool(((m == 0) | (m <= MASKED_AT_OR_BELOW)).all())


def keep_from_mask(mask: torch.Tensor, *, bool_means_keep: bool) -> torch.Tensor:
    """Boolean "may attend" from a mask of any convention.

    Args:
        mask: a boolean mask, or an additive float mask (0 keeps, <= ``MASKED_AT_OR_BELOW`` masks).
        bool_means_keep: the API's boolean convention: True for ``scaled_dot_product_attention``
            (True takes part), False for ``nn.MultiheadAttention`` and ``masked_fill`` (True is masked).
    """
    if mask.dtype == torch.bool:
        return mask if bool_means_keep else ~mask
    return mask > MASKED_AT_OR_BELOW


def where_logits(
    logits: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    bool_means_keep: bool = True,
    mask_bias: bool = False,
) -> torch.Tensor:
    """Apply ``mask`` to attention logits as ``torch.where(keep, logits, finfo.min)``.

    Args:
        logits: attention scores before softmax.
        mask: boolean or additive float mask broadcastable to ``logits``; None leaves logits alone.
        bool_means_keep: boolean convention, see :func:`keep_from_mask`.
        mask_bias: the float mask also carries a bias at kept positions (not just 0): add it there.
            The masked entries are zeroed first so no huge value ever reaches an Add a quantizer sees.
    Returns:
        Logits with masked positions set to the dtype's minimum.
    """
    if mask is None:
        return logits
    keep = keep_from_mask(mask, bool_means_keep=bool_means_keep)
    if mask_bias and mask.dtype != torch.bool:
        logits = logits + torch.where(keep, mask.to(logits.dtype), 0.0)
    return torch.where(keep, logits, masked_value(logits.dtype))


def fused_qkv_name(module: nn.Module) -> str:
    """``qkv`` unless the module already uses that name for something else."""
    return "qkv" if not hasattr(module, "qkv") else "qkv_fused"


def fuse_linears(module: nn.Module, names: Sequence[str]) -> str:
    """Replace the Linears ``names`` of ``module`` (same input size) by one Linear with stacked rows.

    The fused Linear gets a bias when any part had one (zeros for the others). The split sizes are
    kept in ``module.vitexport_qkv_split`` for :func:`project_qkv`.

    Returns:
        The attribute name of the fused Linear.
    Raises:
        ValueError: the parts are not Linears with the same input size, dtype and device.
    """
    parts = [getattr(module, n) for n in names]
    if not all(isinstance(p, nn.Linear) for p in parts):
        raise ValueError(f"cannot fuse {list(names)}: not all are nn.Linear")
    in_f = {p.in_features for p in parts}
    if len(in_f) != 1 or len({(p.weight.dtype, p.weight.device) for p in parts}) != 1:
        raise ValueError(f"cannot fuse {list(names)}: input sizes or dtypes differ")
    ref = parts[0].weight
    has_bias = any(p.bias is not None for p in parts)
    fused = nn.Linear(in_f.pop(), sum(p.out_features for p in parts), bias=has_bias, device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([p.weight for p in parts], 0))
        if has_bias:
            fused.bias.copy_(
                torch.cat([p.bias if p.bias is not None else torch.zeros(p.out_features, dtype=ref.dtype, device=ref.device) for p in parts])
            )
    fused.train(parts[0].training)
    name = fused_qkv_name(module)
    for n in names:
        delattr(module, n)
    setattr(module, name, fused)
    module.vitexport_qkv_split = (name, tuple(names), tuple(p.out_features for p in parts))
    return name


def project_qkv(module: nn.Module, x: torch.Tensor, names: Sequence[str]) -> tuple[torch.Tensor, ...]:
    """q, k, v projections of ``x``: one fused Linear and a split after :func:`fuse_linears`, else the
    separate Linears ``names``."""
    fused = getattr(module, "vitexport_qkv_split", None)
    if fused is not None:
        name, _, sizes = fused
        return tuple(getattr(module, name)(x).split(list(sizes), dim=-1))
    return tuple(getattr(module, n)(x) for n in names)


def bind_call(fn: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Name every argument of a recorded call of ``fn`` (a bound forward), defaults filled in.

    Returns an empty dict when the call does not fit the signature.
    """
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return {}
    bound.apply_defaults()
    return dict(bound.arguments)
