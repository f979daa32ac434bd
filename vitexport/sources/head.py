"""The classifier head to build: its size read from a fine-tuned checkpoint's own head tensor (found
by the name the model gives its classifier, never guessed), or given as ``num_classes``.

A model named by ``timm:`` / ``torchvision:`` / ``hf:`` is built before its ``--weights`` load; a
checkpoint fine-tuned on 10 classes would then meet a 1000-class head and be refused. Reading the
head's size first and building with it (``timm.create_model(name, num_classes=10)``, a Hugging Face
config's ``num_labels``) loads it as it was trained; every other tensor is still checked strictly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import torch
from torch import nn

from ..errors import BadInput

__all__ = ["HeadRequest", "find_head", "head_size", "last_linear"]

#: prefixes a training wrapper leaves on every key (DataParallel's ``module.``, a Lightning ``model.``)
_PREFIXES = ("", "module.", "model.")


@dataclass(frozen=True)
class HeadRequest:
    """What decides the head: the ``--weights`` state dict (already read) and its file, and an
    explicit ``num_classes`` (``--num-classes``)."""

    state: Mapping[str, torch.Tensor] | None = field(default=None, repr=False)
    weights: str | Path | None = None
    num_classes: int | None = None


def find_head(state: Mapping[str, torch.Tensor], names: Iterable[str]) -> tuple[str, int] | None:
    """The first of the classifier ``names`` whose ``.weight`` the checkpoint holds: (its key, rows).

    Args:
        state: the checkpoint's tensors.
        names: module names of the classifier, most important first (timm's ``('head', 'head_dist')``).
    Returns:
        (key as stored, the number of classes it was trained with), or None when no name is there.
    """
    for name in names:
        for prefix in _PREFIXES:
            t = state.get(f"{prefix}{name}.weight")
            if isinstance(t, torch.Tensor) and t.ndim >= 1:
                return f"{prefix}{name}.weight", int(t.shape[0])
    return None


def last_linear(model: nn.Module) -> tuple[str, int] | None:
    """The model's last ``nn.Linear`` in registration order and its output size: a torchvision or
    Hugging Face classifier's head (``fc``, ``heads.head``, ``classifier.1``, ``classifier``), which
    neither library names in a config."""
    found = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            found = (name, int(mod.out_features))
    return found


def head_size(request: HeadRequest | None, names: Iterable[str], default: int | None, what: str,
              knob: str = "num_classes") -> tuple[int | None, str | None]:
    """The head size to build with, and the note saying where it came from.

    Args:
        request: the checkpoint and/or the explicit size; None: build as the library does.
        names: the model's classifier module names.
        default: the size the model is built with otherwise (None: unknown).
        what: the model as named in the note (``timm:mobilevit_xxs``).
        knob: the argument set (``num_classes``; ``num_labels`` for a Hugging Face config).
    Returns:
        (size, note): (None, None) when the default is right.
    Raises:
        BadInput: an explicit ``num_classes`` that the checkpoint's head contradicts.
    """
    if request is None:
        return None, None
    names = list(names)
    found = find_head(request.state, names) if request.state is not None and names else None
    n = request.num_classes
    if n is not None:
        if found is not None and found[1] != n:
            raise BadInput(f"--num-classes {n}: tensor '{found[0]}' in {request.weights} holds {found[1]} classes; "
                           f"pass --num-classes {found[1]} or leave it out (the checkpoint says it)")
        return n, f"{what} built with {knob}={n} (--num-classes)"
    if found is None or found[1] == default:
        return None, None
    return found[1], f"{what} built with {knob}={found[1]} (from {found[0]} in {Path(str(request.weights)).name})"
