"""``reparameterize``: fold training-time branches into the single conv/linear a deployed model runs.

FastViT, MobileOne, RepViT, RepVGG, RepGhost, LeViT, TinyViT, EfficientViT-MSRA... train with parallel
branches (3x3 + 1x1 + identity, each with its BatchNorm) or Conv/Linear + BatchNorm pairs that their
authors fold before deployment. Exporting the training graph gives the quantizer three small convs and
an Add where the device runs one, and BatchNorm scales it cannot fold into INT8 weights.

The walk is timm's ``reparameterize_model`` (``timm.models._manipulate``): every submodule below the
root that defines ``fuse()`` is replaced by what it returns, else ``reparameterize()`` or
``switch_to_deploy()`` is called on it in place. Unlike timm's walk, an attribute of that name that is
not a method taking no arguments (a submodule called ``fuse``, a ``fuse(x)`` helper) is skipped with
the reason instead of being called, and the report counts what was folded and the parameters before
and after. The folds use BatchNorm's running statistics: the result equals the model in eval mode.
"""
from __future__ import annotations

import inspect
from collections import Counter

import torch
from torch import nn

from ..recipe import StageToggle
from .base import PassReport, maybe_copy, register_pass

__all__ = ["reparameterize", "FOLD_METHODS"]

#: the methods timm's models fold themselves with, in timm's order of preference
FOLD_METHODS: tuple[str, ...] = ("fuse", "reparameterize", "switch_to_deploy")


def _fold_method(module: nn.Module) -> tuple[str | None, str | None]:
    """(the fold method ``module`` defines, why it cannot be called) — (None, None) when it has none."""
    for name in FOLD_METHODS:
        attr = inspect.getattr_static(module, name, None)
        if attr is None:
            continue
        if isinstance(attr, nn.Module) or not callable(getattr(module, name)):
            continue  # a submodule or a value named like a fold method: not a fold
        try:
            inspect.signature(getattr(module, name)).bind()
        except TypeError:
            return None, f"{type(module).__name__}.{name}() needs arguments; not a fold this pass can call"
        return name, None
    return None, None


def _walk(parent: nn.Module, prefix: str, report: PassReport, kinds: Counter) -> None:
    for child_name, child in list(parent.named_children()):
        path = f"{prefix}{child_name}"
        method, why = _fold_method(child)
        if why:
            report.found += 1
            report.skip(path, why)
        elif method:
            report.found += 1
            try:
                result = getattr(child, method)()
            except Exception as exc:  # the model's own fold failed: say so; the parity gate sees the rest
                report.skip(path, f"{type(child).__name__}.{method}() raised {type(exc).__name__}: {exc}")
                continue
            kind = f"{type(child).__name__}.{method}()"
            if method == "fuse":
                if not isinstance(result, nn.Module):
                    report.skip(path, f"{type(child).__name__}.fuse() returned {type(result).__name__}, not a module")
                    continue
                setattr(parent, child_name, result)
                child = result
            kinds[kind] += 1
            report.change(path, "fold", f"{kind} -> {type(child).__name__}")
        _walk(child, f"{path}.", report, kinds)


def _census(model: nn.Module) -> dict[str, int]:
    """Parameters, modules and BatchNorm layers: what a fold removes (one ``fuse()`` of a model's root
    folds every block, so the count of calls alone says little)."""
    modules = list(model.modules())
    return {"params": sum(p.numel() for p in model.parameters()), "modules": len(modules),
            "batchnorms": sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in modules)}


@register_pass("reparameterize")
def reparameterize(
    model: nn.Module,
    example_inputs: dict[str, torch.Tensor],
    spec: StageToggle | None = None,
    *,
    inplace: bool = False,
) -> tuple[nn.Module, PassReport]:
    """Fold every structurally reparameterizable block (timm's ``fuse`` / ``reparameterize`` methods).

    Args:
        model: the model, in eval mode (the folds use BatchNorm's running statistics).
        example_inputs: unused (the folds need no observed run); kept for the pass signature.
        spec: ``enabled`` toggle from the recipe.
        inplace: rewrite ``model`` itself instead of a copy.
    Returns:
        (model, report): found = modules defining a fold method; changed = folded; ``stats`` has
        ``params_before`` / ``params_after``, ``modules_*`` and ``batchnorms_*``. A model with nothing to fold comes back unchanged
        (a copy unless ``inplace``), its report saying "nothing to fold".
    """
    report = PassReport("reparameterize")
    if spec is not None and not spec.enabled:
        report.notes.append("disabled by the recipe")
        return model, report
    model = maybe_copy(model, inplace)
    before = _census(model)
    kinds: Counter = Counter()
    with torch.no_grad():
        _walk(model, "", report, kinds)
    after = _census(model)
    report.stats = {f"{k}_{when}": v for when, c in (("before", before), ("after", after)) for k, v in c.items()}
    if report.found == 0:
        report.notes.append("nothing to fold")
        return model, report
    folded = ", ".join(f"{k} x{n}" for k, n in kinds.most_common()) or "nothing"
    report.notes.append(f"folded: {folded}; parameters {before['params']:,} -> {after['params']:,}, modules "
                        f"{before['modules']:,} -> {after['modules']:,}, BatchNorm {before['batchnorms']} -> {after['batchnorms']}")
    return model, report
