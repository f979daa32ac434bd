"""Finding the attention modules of a model: one observed run, registered adapters where they apply.

The model runs once (:mod:`.observation`) and every attention in that run is recognised by its shape
(:mod:`.patterns`), whichever library wrote it. A module a registered adapter matches (a user's own
adapter, ``nn.MultiheadAttention`` whose math happens inside one opaque call) is that adapter's site;
every other attention is an :class:`~.observed.ObservedAttention` site.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._probe import probe_inputs
from .base import AttentionAdapter, QKVLayout, adapter_for
from .observation import observe
from .observed_adapter import ObservedAttention
from .ops import is_binary_additive
from .patterns import MaskTerm, find_patterns

__all__ = ["AttentionSite", "find_attention_sites"]


@dataclass
class AttentionSite:
    """One attention module of a model and the adapter that rewrites it.

    ``masks`` are the masks an adapter site received on the observed run (``adapter.mask_of``);
    observed sites know their masks and biases from the run itself.
    """

    name: str
    module: nn.Module
    adapter: AttentionAdapter
    masks: list[torch.Tensor] = field(default_factory=list)

    @property
    def observed(self) -> bool:
        return isinstance(self.adapter, ObservedAttention)

    @property
    def layout(self) -> QKVLayout:
        return self.adapter.qkv_layout(self.module)

    @property
    def has_mask(self) -> bool:
        return self.adapter.has_mask() if self.observed else bool(self.masks)

    @property
    def is_where(self) -> bool:
        return self.adapter.is_where(self.module)

    @property
    def biases(self) -> list[MaskTerm]:
        """Biases added to the logits that are not masks (kept as adds; reported)."""
        return self.adapter.bias_terms() if self.observed else []

    @property
    def mask_bias(self) -> bool:
        """A float mask seen on the run carried non-zero values at kept positions (a bias)."""
        return any(m.dtype != torch.bool and not is_binary_additive(m) for m in self.masks)

    def describe_mask(self) -> str:
        if self.observed:
            return self.adapter.describe_mask()
        kinds = sorted({"boolean" if m.dtype == torch.bool else ("additive" if not self.mask_bias else "additive with bias") for m in self.masks})
        return f"{' and '.join(kinds)} mask"


def _looks_like_attention(name: str, module: nn.Module) -> bool:
    leaf = name.rpartition(".")[2].lower()
    named = "attn" in leaf or "attention" in leaf or "attention" in type(module).__name__.lower()
    return named and sum(isinstance(c, nn.Linear) for c in module.children()) >= 2


def _inside(name: str, owners: Any) -> bool:
    return any(name == p or name.startswith(p + ".") or p == "" for p in owners)


def find_attention_sites(
    model: nn.Module, example_inputs: dict[str, torch.Tensor]
) -> tuple[list[AttentionSite], list[str], Any]:
    """All attention modules of ``model``: adapter matches and attention seen in one observed run.

    Runs the model once (mask inputs flipped, see :func:`~vitexport.passes._probe.probe_inputs`).

    Returns:
        (sites in module order, notes for the report: modules that look like attention but hold
        none the run could see, and why; the model's output on the probe inputs).
    """
    matched: dict[str, tuple[nn.Module, AttentionAdapter]] = {}
    for name, module in model.named_modules():
        if _inside(name, matched):
            continue  # inside an attention an adapter owns
        adapter = adapter_for(module)
        if adapter is not None:
            matched[name] = (module, adapter)
    obs = observe(model, probe_inputs(example_inputs), watch=set(matched))
    sites: dict[str, AttentionSite] = {}
    for name, (module, adapter) in matched.items():
        masks = []
        for call in obs.calls_of(name)[:2]:
            mask = adapter.mask_of(module, call.args, call.kwargs)
            if isinstance(mask, torch.Tensor):
                masks.append(mask)
        sites[name] = AttentionSite(name, module, adapter, masks)
    grouped: dict[str, tuple[Any, list]] = {}
    for p in find_patterns(obs):
        call = obs.calls[p.site]
        if _inside(call.name, matched):
            continue
        first, patterns = grouped.setdefault(call.name, (obs.calls_of(call.name)[0], []))
        if first is call:  # later calls of the same module run under the first call's rewrite
            patterns.append(p)
    for name, (call, patterns) in grouped.items():
        sites[name] = AttentionSite(name, call.module, ObservedAttention(name, call.module, call, patterns, obs))
    notes = []
    called = {c.name for c in obs.calls.values()}
    for name, module in model.named_modules():
        if _looks_like_attention(name, module) and not _inside(name, sites) and not any(s.startswith(name + ".") for s in sites):
            why = "no softmax attention seen in its forward" if name in called else "not called on the example inputs"
            notes.append(f"{name or '<model>'} ({type(module).__name__}): {why}")
    order = {n: i for i, (n, _) in enumerate(model.named_modules())}
    return sorted(sites.values(), key=lambda s: order[s.name]), notes, obs.output
