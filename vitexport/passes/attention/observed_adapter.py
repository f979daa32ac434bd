"""The adapter of one attention found in the observed run (the generic path; no per-family code).

Rewrites go through the least intrusive hook the module offers: a transformers module that calls the
attention interface gets the ``"vitexport"`` implementation (:mod:`.hf_interface`); any other module
runs its own forward under a plan (:mod:`.runtime`). q/k/v fusion is found by structure — distinct
Linears reading one tensor and feeding one attention — and done with :mod:`.fused`.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from . import hf_interface
from .base import AttentionAdapter, QKVLayout, SiteUnsupported
from .fused import fuse_projections
from .observation import LINEAR, ModuleCall, Observation
from .patterns import MaskTerm, Pattern
from .runtime import MaskAction, SitePlan, StashAction, install_plan

__all__ = ["ObservedAttention"]


class ObservedAttention(AttentionAdapter):
    """One attention site seen in the observed run; the adapter for that site only."""

    name = "observed"
    priority = -1
    family = "observed"
    group = "observed"  # the pass calls ``finalize`` once for all observed sites

    def __init__(self, site: str, module: nn.Module, call: ModuleCall, patterns: list[Pattern], obs: Observation):
        self.site = site
        self.module = module
        self.call = call
        self.patterns = patterns
        self.obs = obs

    def matches(self, module: nn.Module) -> bool:
        return module is self.module

    # --- what the passes read -------------------------------------------------------------------
    @property
    def route(self) -> str:
        return "hf" if hf_interface.dispatches(self.module) else "hooks"

    def mask_terms(self) -> list[MaskTerm]:
        return [t for p in self.patterns for t in p.masks]

    def bias_terms(self) -> list[MaskTerm]:
        return [t for p in self.patterns for t in p.biases]

    def has_mask(self) -> bool:
        return bool(self.mask_terms())

    def is_where(self, module: nn.Module | None = None) -> bool:
        terms = self.mask_terms()
        return bool(terms) and all(t.kind == "where" for t in terms)

    def describe_mask(self) -> str:
        return ", ".join(sorted({t.describe() for t in self.mask_terms()}))

    def describe(self) -> str:
        p = self.patterns[0]
        core = "scaled_dot_product_attention" if p.softmax is None else f"{p.scores.name} + softmax"
        return f"{core}{' via the attention interface' if self.route == 'hf' else ''}"

    def _relative(self, label: str) -> str | None:
        if not self.site:
            return label
        return label[len(self.site) + 1:] if label.startswith(self.site + ".") else None

    def qkv_layout(self, module: nn.Module | None = None) -> QKVLayout:
        if len(self.patterns) != 1:
            return QKVLayout.unsupported(f"{len(self.patterns)} attentions in one module")
        p = self.patterns[0]
        if any(len(s) != 1 for s in (p.q, p.k, p.v)):
            return QKVLayout.unsupported("q, k or v does not come from exactly one projection")
        nodes = list(dict.fromkeys(next(iter(s)) for s in (p.q, p.k, p.v)))
        if any(n.name != LINEAR for n in nodes):
            return QKVLayout.unsupported("q, k or v comes from a convolution")
        if any(not n.label for n in nodes):
            return QKVLayout.unsupported("a projection is a functional linear whose weight no nn.Linear owns")
        names = [self._relative(n.label) for n in nodes]
        if len(nodes) == 1:
            return QKVLayout.fused(f"q, k and v come from one Linear '{names[0] or nodes[0].label}'")
        if len({id(n.arg(0, "input")) for n in nodes}) != 1:
            return QKVLayout.unsupported("q, k and v read different inputs (cross-attention)")
        if any(n is None for n in names):
            return QKVLayout.unsupported("the projections live outside the attention module")
        inside = [n for n in self.obs.nodes[self.call.start:self.call.end] if n.name == LINEAR]
        if any(sum(1 for n in inside if n.label == node.label) != 1 for node in nodes):
            return QKVLayout.unsupported("a projection is called more than once in the attention")
        if any(type(self.module.get_submodule(n)) is not nn.Linear for n in names):
            return QKVLayout.unsupported("a projection is not a plain nn.Linear")
        return QKVLayout.separate(*names)

    def mask_of(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]):
        return None  # masks are known from the observed run

    # --- rewrites ---------------------------------------------------------------------------------
    def to_where(self, module: nn.Module, *, mask_bias: bool = False) -> nn.Module:
        if self.route == "hf":
            self._plan_hf(module)
        else:
            install_plan(module, self.plan())
        return module

    def _plan_hf(self, module: nn.Module) -> None:
        terms = [t for t in self.mask_terms() if t.kind != "where"]
        if any(t.split for t in terms):
            t = next(t for t in terms if t.split)
            node, pos = t.split
            split_values = node.values.get(pos)
            source = node.args[pos].flags
            if split_values is not None and split_values.keep is not None and "input" not in source:
                hf_interface.plan_site(module, "split", split_values.keep)
                return
        how = "kept" if any(t.role == "mask+bias" for t in terms) else "mask"
        hf_interface.plan_site(module, how)

    def _key(self, node) -> tuple[str, int]:
        return node.name, self.obs.ordinal(node, self.call)

    def plan(self) -> SitePlan:
        """The runtime plan that applies this site's masks with ``torch.where``."""
        actions: dict[tuple[str, int], Any] = {}
        for tag, t in enumerate(self.mask_terms()):
            if t.kind == "where":
                continue
            bias = "none" if t.role == "mask" else "kept"
            if t.split is not None and self.call.id in t.split[0].stack:
                actions[self._key(t.split[0])] = StashAction(t.split[1], tag)
                bias = "split"
            shape = t.values.shape if t.values is not None else None
            if t.kind in ("sdpa", "causal"):
                prev = actions.get(self._key(t.op))
                if isinstance(prev, MaskAction):  # attn_mask and is_causal on one call
                    actions[self._key(t.op)] = MaskAction("sdpa", prev.mask_pos, None, prev.convention, prev.bias,
                                                          prev.tag, causal=True, mask_shape=prev.mask_shape)
                    continue
                convention = "bool_keep" if t.values is None or t.values.is_bool else "additive"
                actions[self._key(t.op)] = MaskAction("sdpa", t.pos, None, convention, bias, tag,
                                                      causal=t.kind == "causal", mask_shape=shape)
                continue
            convention = "bool_masked" if t.kind.startswith("masked_fill") else "additive"
            actions[self._key(t.op)] = MaskAction(t.kind, t.pos, t.logits_pos, convention, bias, tag,
                                                  move=t.movable, mask_shape=shape)
        self._plain_sdpa_bias(actions)
        return SitePlan(actions)

    def _plain_sdpa_bias(self, actions: dict) -> None:
        # An SDPA call rewritten for is_causal alone may also carry a bias as attn_mask: add it as is.
        for t in self.bias_terms():
            if t.kind == "sdpa":
                prev = actions.get(self._key(t.op))
                if isinstance(prev, MaskAction) and prev.mask_pos is None:
                    actions[self._key(t.op)] = MaskAction("sdpa", t.pos, None, "additive", "plain", None, causal=True,
                                                          mask_shape=t.values.shape if t.values else None)

    def fuse_qkv(self, module: nn.Module) -> nn.Module:
        layout = self.qkv_layout()
        if layout.kind != "separate":
            raise SiteUnsupported(layout.reason)
        try:
            fuse_projections(module, layout.names)
        except ValueError as exc:
            raise SiteUnsupported(str(exc)) from None
        return module

    def finalize(self, model: nn.Module, rewritten: list[tuple[str, nn.Module]]) -> list[str]:
        """After ``mask_to_where``: switch the transformers models holding rewritten sites over."""
        hf = [name for name, m in rewritten if hf_interface.dispatches(m)]
        return hf_interface.switch(model, hf) if hf else []
