"""What every graph pass is: a named unit ``(model, example_inputs, spec) -> (model, PassReport)``.

Passes copy the model unless ``inplace=True``. ``changed`` counts sites really rewritten; a pass that
found nothing says so (``found=0``), and ``changed=0`` is a statement, not a default.
"""
from __future__ import annotations

import copy
from dataclasses import field
from typing import Any, Callable, Protocol

import torch

from ..results import Data, result

__all__ = [
    "SkippedSite",
    "ChangedSite",
    "PassReport",
    "TorchPass",
    "PASSES",
    "register_pass",
    "get_pass",
    "maybe_copy",
    "set_submodule",
]


@result
class SkippedSite(Data):
    site: str
    reason: str


@result
class ChangedSite(Data):
    """One rewritten site: ``action`` names what was done (``fold``, ``constants``, ``where``, ``fuse``)."""

    site: str
    action: str
    detail: str = ""


@result
class PassReport(Data):
    """Outcome of one pass: ``found`` candidate sites, ``changed`` rewritten, ``skipped`` with reasons.

    ``stats`` holds the pass's other counts by name (e.g. ``attention_sites``, ``biases``).
    """

    name: str
    found: int = 0
    changed: int = 0
    skipped: list[SkippedSite] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    changes: list[ChangedSite] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    def skip(self, site: str, reason: str) -> None:
        self.skipped.append(SkippedSite(site, reason))

    def change(self, site: str, action: str, detail: str = "") -> None:
        """Record one rewritten site; ``changed`` counts these and nothing else."""
        self.changes.append(ChangedSite(site, action, detail))
        self.changed = len(self.changes)

    def count(self, action: str) -> int:
        """How many sites were changed with ``action``."""
        return sum(1 for c in self.changes if c.action == action)

    def summary(self) -> str:
        if self.found == 0:
            return f"{self.name}: no sites found" + (f" ({'; '.join(self.notes)})" if self.notes else "")
        s = f"{self.name}: {self.changed}/{self.found} sites changed"
        actions = sorted({c.action for c in self.changes})
        if len(actions) > 1:
            s += " (" + ", ".join(f"{a} {self.count(a)}" for a in actions) + ")"
        if self.skipped:
            s += f", {len(self.skipped)} skipped"
        return s


class TorchPass(Protocol):
    """A pass over a torch module (``freeze_layernorm``, ``mask_to_where``, ``fuse_qkv``): takes the
    module and its example inputs, returns the rewritten module and a :class:`PassReport`. Passes over
    an ONNX graph are :class:`vitexport.graph.passes.GraphPass` (onnx-ir's pass manager)."""

    name: str

    def __call__(
        self, model: torch.nn.Module, example_inputs: dict[str, torch.Tensor], spec: Any = None, *, inplace: bool = False
    ) -> tuple[torch.nn.Module, PassReport]: ...


PASSES: dict[str, TorchPass] = {}


def register_pass(name: str) -> Callable[[Callable], Callable]:
    """Register a pass under ``name``; a second registration of the same name is an error."""

    def deco(fn: Callable) -> Callable:
        if name in PASSES:
            raise ValueError(f"pass '{name}' is already registered")
        fn.name = name  # type: ignore[attr-defined]
        PASSES[name] = fn  # type: ignore[assignment]
        return fn

    return deco


def get_pass(name: str) -> TorchPass:
    try:
        return PASSES[name]
    except KeyError:
        raise KeyError(f"unknown pass '{name}'; registered: {sorted(PASSES)}") from None


def maybe_copy(model: torch.nn.Module, inplace: bool) -> torch.nn.Module:
    """``model`` itself when ``inplace``, else a deep copy (the caller's model is never touched)."""
    return model if inplace else copy.deepcopy(model)


def set_submodule(root: torch.nn.Module, name: str, new: torch.nn.Module) -> None:
    """Put ``new`` at the dotted path ``name`` under ``root`` (``''`` is not allowed: the root stays)."""
    if not name:
        raise ValueError("cannot replace the root module in place")
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)
