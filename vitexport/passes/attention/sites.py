"""Finding the attention modules of a model: registered adapters first, then traced patterns."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from .._probe import probe_inputs, record_calls
from .base import AttentionAdapter, QKVLayout, adapter_for
from .fx_pattern import TraceFailure, TracedAttention, analyse_module
from .ops import is_binary_additive

__all__ = ["AttentionSite", "find_attention_sites"]


@dataclass
class AttentionSite:
    """One attention module of a model and the adapter that rewrites it.

    ``masks`` are the masks the module received on the probe run (adapter sites); traced sites know
    their masks from the graph.
    """

    name: str
    module: nn.Module
    adapter: AttentionAdapter
    masks: list[torch.Tensor] = field(default_factory=list)

    @property
    def traced(self) -> bool:
        return isinstance(self.adapter, TracedAttention)

    @property
    def layout(self) -> QKVLayout:
        return self.adapter.qkv_layout(self.module)

    @property
    def has_mask(self) -> bool:
        return self.adapter.has_mask() if self.traced else bool(self.masks)

    @property
    def is_where(self) -> bool:
        return self.adapter.is_where(self.module)

    @property
    def mask_bias(self) -> bool:
        """A float mask seen on the probe carried non-zero values at kept positions (a bias)."""
        return any(m.dtype != torch.bool and not is_binary_additive(m) for m in self.masks)

    def describe_mask(self) -> str:
        if self.traced:
            return self.adapter.mask_description()
        kinds = sorted({"boolean" if m.dtype == torch.bool else ("additive" if not self.mask_bias else "additive with bias") for m in self.masks})
        return f"{' and '.join(kinds)} mask"


def _is_candidate(module: nn.Module) -> bool:
    # Hand-written attention owns its projections: at least two Linears as direct children.
    if not isinstance(module, fx.GraphModule) and type(module).__module__.startswith("torch."):
        return False
    return sum(isinstance(c, nn.Linear) for c in module.children()) >= 2


def _looks_like_attention(name: str, module: nn.Module) -> bool:
    leaf = name.rpartition(".")[2].lower()
    return "attn" in leaf or "attention" in leaf or "attention" in type(module).__name__.lower()


def find_attention_sites(
    model: nn.Module, example_inputs: dict[str, torch.Tensor]
) -> tuple[list[AttentionSite], list[str], Any]:
    """All attention modules of ``model`` that an adapter or the traced pattern recognises.

    Runs the model once (mask inputs flipped, see :func:`~vitexport.passes._probe.probe_inputs`) to
    record what each attention receives.

    Returns:
        (sites in module order, notes for the report: modules that look like attention but could not
        be analysed, and why; the model's output on the probe inputs).
    """
    matched: dict[str, tuple[nn.Module, AttentionAdapter]] = {}
    candidates: dict[str, nn.Module] = {}
    for name, module in model.named_modules():
        if any(name.startswith(p + ".") for p in matched):
            continue  # inside an attention an adapter owns
        adapter = adapter_for(module)
        if adapter is not None:
            matched[name] = (module, adapter)
        elif _is_candidate(module):
            candidates[name] = module
    watch = {n: m for n, (m, _) in matched.items()}
    watch.update(candidates)
    calls, output = record_calls(model, probe_inputs(example_inputs), watch)
    sites: dict[str, AttentionSite] = {}
    notes: list[str] = []
    for name, (module, adapter) in matched.items():
        masks = []
        for args, kwargs in calls.get(name, []):
            mask = adapter.mask_of(module, args, kwargs)
            if isinstance(mask, torch.Tensor):
                masks.append(mask)
        sites[name] = AttentionSite(name, module, adapter, masks)
    for name, module in candidates.items():
        if any(name.startswith(p + ".") for p in sites):
            continue
        if name not in calls:
            if _looks_like_attention(name, module):
                notes.append(f"{name or '<model>'}: not called on the example inputs, not analysed")
            continue
        args, kwargs = calls[name][0]
        try:
            traced = analyse_module(module, args, kwargs)
        except TraceFailure as exc:
            if _looks_like_attention(name, module):
                notes.append(f"{name or '<model>'} ({type(module).__name__}): {exc}; register an attention adapter for it")
            continue
        if traced is not None:
            sites[name] = AttentionSite(name, module, traced)
    order = {n: i for i, (n, _) in enumerate(model.named_modules())}
    return sorted(sites.values(), key=lambda s: order[s.name]), notes, output
