"""Masks as ``torch.where`` inside a module whose code we do not own, without touching that code.

A rewritten attention keeps its own ``forward``. A forward pre-hook enters a ``TorchFunctionMode``
for the duration of the call (PyTorch's supported way to override torch calls in a scope; the forward
hook leaves it, also when the forward raises). The mode counts the calls it may replace (adds,
``masked_fill``, softmax, ``scaled_dot_product_attention``) and replaces exactly the ones the observed
run identified, by name and count (``add`` #3 of this call, say):

* the add of a mask (or its ``masked_fill``) becomes ``torch.where(keep, logits, finfo.min)``, or,
  when only scalings lie between it and the softmax, disappears and the where is applied to the
  softmax input;
* ``scaled_dot_product_attention`` with a mask becomes MatMul → where → Softmax → MatMul;
* a mask that was added to a learned bias first is picked up at that add (``stash``), so the where
  reads the mask itself and the bias is still added where the mask keeps.

Each replaced call is checked against the shape the observed run recorded; a call that does not fit
(other inputs took another code path) runs unchanged, which keeps the module's results exact.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from .observation import COUNTED, SOFTMAX, func_name
from .ops import keep_from_mask, masked_value

__all__ = ["MaskAction", "StashAction", "SitePlan", "SiteRewrite", "install_plan"]


@dataclass(frozen=True)
class MaskAction:
    """Replace one call that applies a mask.

    ``kind``: ``add``, ``masked_fill``, ``masked_fill_`` or ``sdpa``. ``mask_pos`` / ``logits_pos``:
    arguments of that call. ``convention``: ``additive``, ``bool_keep`` (True takes part) or
    ``bool_masked`` (True is masked). ``bias``: ``none``; ``kept`` (the float mask carries a bias at
    kept positions: add it there); ``split`` (keep comes from the mask stashed under ``tag``).
    ``plain`` (SDPA only: the ``attn_mask`` is a bias, added as it is). ``move``: apply the where at
    the next softmax instead. ``causal``: SDPA's ``is_causal``.
    """

    kind: str
    mask_pos: int | str | None
    logits_pos: int | str | None
    convention: str
    bias: str = "none"
    tag: int | None = None
    move: bool = False
    causal: bool = False
    mask_shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class StashAction:
    """Keep argument ``pos`` of this call (a mask about to be added to a bias) under ``tag``."""

    pos: int | str
    tag: int


@dataclass(frozen=True)
class SitePlan:
    """What to replace in one module's forward: ``(call name, count) -> action``."""

    actions: dict[tuple[str, int], MaskAction | StashAction]

    @property
    def moved(self) -> bool:
        return any(isinstance(a, MaskAction) and a.move for a in self.actions.values())


def _get(args: tuple, kwargs: dict, pos: int | str | None) -> Any:
    if pos is None:
        return None
    if isinstance(pos, int):
        return args[pos] if pos < len(args) else None
    return kwargs.get(pos)


def _with(args: tuple, kwargs: dict, pos: int | str, value: Any) -> tuple[tuple, dict]:
    if isinstance(pos, int) and pos < len(args):
        return args[:pos] + (value,) + args[pos + 1:], kwargs
    return args, {**kwargs, pos: value}


class _SiteMode(TorchFunctionMode):
    def __init__(self, plan: SitePlan):
        super().__init__()
        self.plan = plan
        self.counts: dict[str, int] = {}
        self.stash: dict[int, torch.Tensor] = {}
        self.pending: list[torch.Tensor] = []
        self.misses = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func_name(func)
        if name not in COUNTED:
            return func(*args, **kwargs)
        n = self.counts.get(name, 0)
        self.counts[name] = n + 1
        action = self.plan.actions.get((name, n))
        if isinstance(action, StashAction):
            self.stash[action.tag] = _get(args, kwargs, action.pos)
        elif isinstance(action, MaskAction):
            mask = _get(args, kwargs, action.mask_pos)
            if action.mask_shape is None or (isinstance(mask, torch.Tensor) and tuple(mask.shape) == action.mask_shape):
                return self._apply(action, func, args, kwargs, mask)
            self.misses += 1
        elif name in SOFTMAX and self.pending:
            x = args[0] if args else kwargs["input"]
            keep = self.pending[0]
            for other in self.pending[1:]:
                keep = torch.logical_and(keep, other)
            self.pending = []
            x = torch.where(keep, x, masked_value(x.dtype))
            args, kwargs = _with(args, kwargs, 0 if args else "input", x)
        return func(*args, **kwargs)

    def _keep(self, action: MaskAction, mask: torch.Tensor) -> torch.Tensor:
        if action.bias == "split" and action.tag in self.stash:
            return keep_from_mask(self.stash[action.tag], bool_means_keep=True)
        return keep_from_mask(mask, bool_means_keep=action.convention != "bool_masked")

    def _apply(self, action: MaskAction, func, args: tuple, kwargs: dict, mask: torch.Tensor) -> Any:
        if action.kind == "sdpa":
            return self._attention(action, args, kwargs, mask)
        keep = self._keep(action, mask)
        logits = _get(args, kwargs, action.logits_pos)
        out = logits
        if action.bias != "none" and mask.dtype != torch.bool:
            # Zero at masked positions first: no very negative value ever reaches an add.
            out = out + torch.where(keep, mask.to(out.dtype), 0.0)
        if action.move:
            self.pending.append(keep)
        else:
            out = torch.where(keep, out, masked_value(out.dtype))
        if action.kind.endswith("_"):  # in place: the caller keeps using the tensor it passed
            return logits if out is logits else logits.copy_(out)
        return out

    def _attention(self, action: MaskAction, args: tuple, kwargs: dict, mask: torch.Tensor | None) -> torch.Tensor:
        names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
        call = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
        call.update(dict(zip(names, args)))
        call.update(kwargs)
        q, k, v = call["query"], call["key"], call["value"]
        if call["enable_gqa"] and k.shape[-3] != q.shape[-3]:
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
            v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
        scale = call["scale"] if call["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
        logits = torch.matmul(q, k.transpose(-2, -1)) * scale
        if mask is not None and action.bias == "plain":
            logits = logits + mask  # a bias, not a mask: the call was rewritten for is_causal
        elif mask is not None:
            keep = self._keep(action, mask)
            if action.bias != "none" and mask.dtype != torch.bool:
                logits = logits + torch.where(keep, mask.to(logits.dtype), 0.0)
            logits = torch.where(keep, logits, masked_value(logits.dtype))
        if call["is_causal"]:
            causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
            logits = torch.where(causal, logits, masked_value(logits.dtype))
        weights = torch.softmax(logits, dim=-1)
        if call["dropout_p"]:
            weights = F.dropout(weights, p=call["dropout_p"])
        return torch.matmul(weights, v)


class SiteRewrite:
    """The hooks that run one module's forward under its plan (picklable: the plan is plain data)."""

    def __init__(self, plan: SitePlan):
        self.plan = plan
        self._active: list[_SiteMode] = []
        self.misses = 0

    def enter(self, module: nn.Module, args: tuple) -> None:
        mode = _SiteMode(self.plan)
        mode.__enter__()
        self._active.append(mode)

    def exit(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self._active:
            mode = self._active.pop()
            mode.__exit__(None, None, None)
            self.misses += mode.misses

    def __getstate__(self) -> dict[str, Any]:
        return {"plan": self.plan, "_active": [], "misses": self.misses}


def install_plan(module: nn.Module, plan: SitePlan) -> SiteRewrite:
    """Run ``module``'s forward under ``plan`` from now on (this instance only; the class is untouched).

    Returns:
        The :class:`SiteRewrite`, also kept as ``module.vitexport_rewrite``.
    """
    rewrite = SiteRewrite(plan)
    module.register_forward_pre_hook(rewrite.enter)
    module.register_forward_hook(rewrite.exit, always_call=True)
    module.vitexport_rewrite = rewrite
    module.vitexport_where = True
    return rewrite
