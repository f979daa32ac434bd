"""What an attention adapter is, and the registry that finds one for a module.

An adapter teaches the passes one attention class: where its q/k/v projections are, which argument
carries its mask, and how to rewrite the *copied* instance (swap that instance's ``forward`` or return
a replacement module). It never patches the class itself.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch
from torch import nn

__all__ = [
    "SiteUnsupported",
    "QKVLayout",
    "AttentionAdapter",
    "ATTENTION_ADAPTERS",
    "register_attention_adapter",
    "unregister_attention_adapter",
    "adapter_for",
    "install_forward",
]


class SiteUnsupported(Exception):
    """Raised by an adapter's rewrite when this instance cannot be rewritten; the message is the
    reason the pass reports for skipping the site."""


@dataclass(frozen=True)
class QKVLayout:
    """How an attention computes q, k and v.

    ``separate``: three Linears named ``names`` read the same input (fusable). ``fused``: already one
    projection (``reason`` says which). ``unsupported``: neither, ``reason`` says why.
    """

    kind: Literal["separate", "fused", "unsupported"]
    names: tuple[str, ...] = ()
    reason: str = ""

    @classmethod
    def separate(cls, *names: str) -> "QKVLayout":
        return cls("separate", tuple(names))

    @classmethod
    def fused(cls, reason: str) -> "QKVLayout":
        return cls("fused", (), reason)

    @classmethod
    def unsupported(cls, reason: str) -> "QKVLayout":
        return cls("unsupported", (), reason)


class AttentionAdapter:
    """Base class of the per-family adapters; subclass it to teach vitexport your attention class.

    Subclasses set ``name`` and implement :meth:`matches`, :meth:`qkv_layout`, :meth:`mask_of`,
    :meth:`to_where` and :meth:`fuse_qkv`. ``priority`` orders matching (higher first); adapters a user
    registers default to 100, above the built-in ones (0), so a user adapter wins for its class.
    """

    name: str = ""
    priority: int = 100
    family: str = "custom"

    def matches(self, module: nn.Module) -> bool:
        """True when this adapter knows ``module``'s class (match the exact class: a subclass may
        override ``forward``)."""
        raise NotImplementedError

    def qkv_layout(self, module: nn.Module) -> QKVLayout:
        """Where q, k and v come from in ``module``."""
        raise NotImplementedError

    def mask_of(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
        """The mask a recorded call ``module(*args, **kwargs)`` carries, or None when unmasked."""
        return None

    def is_where(self, module: nn.Module) -> bool:
        """True when ``module`` already applies its mask with ``torch.where``."""
        return bool(getattr(module, "vitexport_where", False))

    def to_where(self, module: nn.Module, *, mask_bias: bool = False) -> nn.Module:
        """Make ``module`` apply its mask as ``torch.where(keep, logits, finfo.min)``.

        Args:
            module: the instance in the copied model (safe to modify).
            mask_bias: a float mask seen on the example inputs carried values other than 0 at kept
                positions (a bias): keep adding those.
        Returns:
            The module to put at the site: ``module`` itself or a replacement.
        """
        raise NotImplementedError

    def fuse_qkv(self, module: nn.Module) -> nn.Module:
        """Replace separate q/k/v Linears by one Linear and a split; returns the module for the site."""
        raise NotImplementedError

    def finalize(self, model: nn.Module, rewritten: list[tuple[str, nn.Module]]) -> list[str]:
        """Called once per pass after this adapter rewrote ``rewritten``; returns notes for the report."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


ATTENTION_ADAPTERS: dict[str, AttentionAdapter] = {}


def register_attention_adapter(adapter: AttentionAdapter | type[AttentionAdapter]) -> Any:
    """Register an adapter (an instance, or a class that is instantiated without arguments).

    Usable as a class decorator. Returns what it was given.
    Raises:
        ValueError: the name is empty or already registered.
        TypeError: ``adapter`` is not an :class:`AttentionAdapter`.
    """
    inst = adapter() if isinstance(adapter, type) else adapter
    if not isinstance(inst, AttentionAdapter):
        raise TypeError(f"{adapter!r} is not an AttentionAdapter")
    if not inst.name:
        raise ValueError(f"{type(inst).__name__} has no name")
    if inst.name in ATTENTION_ADAPTERS:
        raise ValueError(f"attention adapter '{inst.name}' is already registered")
    ATTENTION_ADAPTERS[inst.name] = inst
    return adapter


def unregister_attention_adapter(name: str) -> None:
    """Remove a registered adapter. Raises KeyError if unknown."""
    try:
        del ATTENTION_ADAPTERS[name]
    except KeyError:
        raise KeyError(f"unknown attention adapter '{name}'; registered: {sorted(ATTENTION_ADAPTERS)}") from None


def adapter_for(module: nn.Module) -> AttentionAdapter | None:
    """The highest-priority registered adapter that matches ``module`` (registration order breaks ties)."""
    ordered = sorted(enumerate(ATTENTION_ADAPTERS.values()), key=lambda t: (-t[1].priority, t[0]))
    for _, adapter in ordered:
        if adapter.matches(module):
            return adapter
    return None


def install_forward(module: nn.Module, fn: Callable[..., Any]) -> None:
    """Make ``fn(module, ...)`` this one instance's ``forward``; the class is untouched.

    A ``functools.partial`` rather than a bound method: both follow a deep copy to the copied
    instance, but only the partial survives ``torch.save`` / ``pickle`` (a bound method is pickled by
    name, and ``fn`` is not an attribute of the instance). ``fn`` must be a module-level function.
    """
    module.forward = functools.partial(fn, module)
