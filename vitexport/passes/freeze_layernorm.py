"""``freeze_layernorm``: no LayerNorm keeps a loaded affine (NPU compilers reject one).

Two modes (``stages.freeze_layernorm.mode``):

* ``constants``: the LayerNorm runs without elementwise affine and gamma / beta become constant
  buffers applied after it (:class:`LayerNormConstants`): ``y = layer_norm(x) * gamma + beta``.
* ``fold`` (default): when every reader of the LayerNorm's output is a Linear (qkv, fc1, the head; a
  packed ``nn.MultiheadAttention`` in-projection counts), ``W' = W * gamma`` and ``b' = b + W @ beta``
  in those Linears and the LayerNorm keeps no affine. Otherwise (a residual add reads it, a post-norm
  block, the model output) the LayerNorm falls back to ``constants`` and the report says why.

``nn.LayerNorm`` and its subclasses (timm ``LayerNorm``, Hugging Face models use ``nn.LayerNorm``)
are handled; eps is kept. A subclass whose forward is not a plain last-axis ``layer_norm`` (timm
``LayerNorm2d``) never folds; its constants are verified on the input it received on the example run.
"""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ..recipe import FreezeLayerNormSpec, LayerNormMode
from ._layernorm_flow import FoldPlan, analyse_layernorm_consumers
from ._probe import probe_inputs, record_calls, run_model
from .base import PassReport, maybe_copy, register_pass, set_submodule
from .selfcheck import self_check_note

__all__ = ["freeze_layernorm", "LayerNormConstants", "has_affine"]


class LayerNormConstants(nn.Module):
    """A LayerNorm without affine, then constant gamma / beta (buffers: nothing left to train or load).

    Args:
        norm: the LayerNorm, its affine already removed.
        gamma, beta: the former affine; None, all-ones gamma and all-zero beta apply no op.
        channel_axis: where gamma / beta apply: -1 for the trailing normalized axes, 1 for a
            channels-first LayerNorm (timm ``LayerNorm2d``).
    """

    def __init__(self, norm: nn.Module, gamma: torch.Tensor | None, beta: torch.Tensor | None, channel_axis: int = -1):
        super().__init__()
        self.norm = norm
        self.channel_axis = channel_axis
        # An identity part needs no op at all in the exported graph.
        if gamma is not None and bool((gamma == 1).all()):
            gamma = None
        if beta is not None and not bool(beta.any()):
            beta = None
        self.register_buffer("gamma", None if gamma is None else gamma.detach().clone())
        self.register_buffer("beta", None if beta is None else beta.detach().clone())

    def _shaped(self, t: torch.Tensor, ndim: int) -> torch.Tensor:
        if self.channel_axis == -1:
            return t
        return t.reshape([-1] + [1] * (ndim - 1 - self.channel_axis))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        if self.gamma is not None:
            y = y * self._shaped(self.gamma, y.dim())
        if self.beta is not None:
            y = y + self._shaped(self.beta, y.dim())
        return y

    def extra_repr(self) -> str:
        return f"channel_axis={self.channel_axis}"


def has_affine(norm: nn.LayerNorm) -> bool:
    """True when the LayerNorm holds a weight or a bias."""
    return getattr(norm, "weight", None) is not None or getattr(norm, "bias", None) is not None


def _strip_affine(norm: nn.LayerNorm) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Remove the affine from ``norm`` in place; returns (gamma, beta) as detached tensors."""
    gamma = None if norm.weight is None else norm.weight.detach().clone()
    beta = None if getattr(norm, "bias", None) is None else norm.bias.detach().clone()
    norm.weight = None
    norm.bias = None
    norm.elementwise_affine = False
    return gamma, beta


def _is_plain(norm: nn.Module) -> bool:
    # Classes whose forward is exactly layer_norm over the trailing normalized_shape.
    if type(norm) is nn.LayerNorm:
        return True
    if not type(norm).__module__.startswith("timm."):
        return False
    try:  # timm is loaded already when a timm LayerNorm exists; never imported for other models
        from timm.layers import LayerNorm as TimmLayerNorm
    except ImportError:
        return False
    return type(norm) is TimmLayerNorm


def _fold(model: nn.Module, norm: nn.LayerNorm, plan: FoldPlan) -> None:
    gamma, beta = _strip_affine(norm)
    with torch.no_grad():
        targets = [(model.get_submodule(n), "weight", "bias") for n in plan.linears]
        targets += [(model.get_submodule(n), "in_proj_weight", "in_proj_bias") for n in plan.mhas]
        for mod, wname, bname in targets:
            w = getattr(mod, wname)
            b = getattr(mod, bname)
            w64 = w.detach().double()
            if beta is not None and bool(beta.any()):
                shift = w64 @ beta.double()  # float64: the fold itself adds no rounding worth measuring
                new_b = shift if b is None else b.detach().double() + shift
                if b is None:
                    setattr(mod, bname, nn.Parameter(new_b.to(w.dtype), requires_grad=w.requires_grad))
                else:
                    b.copy_(new_b.to(b.dtype))
            if gamma is not None:
                w.copy_((w64 * gamma.double()[None, :]).to(w.dtype))


def _strips_cleanly(norm: nn.Module, sample: torch.Tensor | None) -> str | None:
    """None when ``norm`` without its affine computes ``layer_norm(x)`` (a fold may remove it), else why not."""
    if _is_plain(norm):
        return None
    if sample is None:
        return f"{type(norm).__name__} is not a plain LayerNorm and was not called on the example inputs"
    stripped = copy.deepcopy(norm)
    _strip_affine(stripped)
    try:
        with torch.no_grad():
            got = stripped(sample)
    except Exception as exc:  # its forward may not accept a missing weight
        return f"{type(norm).__name__} does not run without its affine ({type(exc).__name__})"
    try:
        want = torch.nn.functional.layer_norm(sample, tuple(norm.normalized_shape), None, None, norm.eps)
    except RuntimeError:
        want = None
    if want is None or got.shape != want.shape or not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
        return f"{type(norm).__name__} without its affine is not a plain layer_norm"
    return None


def _constants(norm: nn.Module, sample: torch.Tensor | None) -> tuple[nn.Module | None, str]:
    """A :class:`LayerNormConstants` equivalent to ``norm`` (checked on ``sample``), or (None, why)."""
    if _is_plain(norm):
        inner = norm
        gamma, beta = _strip_affine(inner)
        return LayerNormConstants(inner, gamma, beta, -1), ""
    if sample is None:
        return None, f"{type(norm).__name__} is not a plain LayerNorm and was not called on the example inputs"
    with torch.no_grad():
        expected = norm(sample)
    inner = copy.deepcopy(norm)
    gamma, beta = _strip_affine(inner)
    for axis in (-1, 1):  # trailing axes, or channels-first (LayerNorm2d)
        cand = LayerNormConstants(inner, gamma, beta, axis)
        try:
            with torch.no_grad():
                got = cand(sample)
        except Exception:  # its forward may not accept a missing weight
            continue
        if got.shape == expected.shape and torch.allclose(got, expected, rtol=1e-5, atol=1e-6):
            return cand, ""
    return None, f"{type(norm).__name__}: could not rebuild it as layer_norm + constants (checked on the example input)"


@register_pass("freeze_layernorm")
def freeze_layernorm(
    model: nn.Module,
    example_inputs: dict[str, torch.Tensor],
    spec: FreezeLayerNormSpec | None = None,
    *,
    inplace: bool = False,
) -> tuple[nn.Module, PassReport]:
    """Remove every LayerNorm's loaded affine, by folding it into the next Linears or as constants.

    Args:
        model: the model (usually an ``OutputAdapter``); ``model(**example_inputs)`` runs it.
        example_inputs: inputs for the run that finds what reads each LayerNorm.
        spec: ``enabled`` and ``mode`` (``fold`` by default, see the recipe schema).
        inplace: rewrite ``model`` itself instead of a copy.
    Returns:
        (model, report): one site per LayerNorm; changes are ``fold`` or ``constants`` (with the
        reason a fold was impossible); LayerNorms without affine are skipped.
    """
    spec = spec or FreezeLayerNormSpec()
    report = PassReport("freeze_layernorm")
    if not spec.enabled:
        report.notes.append("disabled by the recipe")
        return model, report
    model = maybe_copy(model, inplace)
    norms = {n: m for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)}
    report.found = len(norms)
    if not norms:
        report.notes.append("the model has no LayerNorm")
        return model, report
    affine = {}
    for name, norm in norms.items():
        if has_affine(norm):
            affine[name] = norm
        else:
            report.skip(name, "no elementwise affine (nothing to freeze)")
    if not affine:
        return model, report
    inputs = probe_inputs(example_inputs)
    if spec.mode == LayerNormMode.fold:
        plans, reference = analyse_layernorm_consumers(model, inputs, affine)
    else:
        plans, reference = {}, None
    # Subclasses (timm LayerNorm2d, HF ConvNextLayerNorm ...) are checked on the input they received.
    samples: dict[str, Any] = {}
    if any(not _is_plain(m) for m in affine.values()):
        calls, out = record_calls(model, inputs, {n: m for n, m in affine.items() if not _is_plain(m)}, max_calls=1)
        samples = {n: c[0][0][0] for n, c in calls.items() if c and c[0][0]}
        reference = out if reference is None else reference
    if reference is None:
        reference = run_model(model, inputs)
    for name, norm in affine.items():
        plan = plans.get(name)
        if plan is not None and plan.foldable:
            plan.blocker = _strips_cleanly(norm, samples.get(name))
            if plan.blocker is None:
                _fold(model, norm, plan)
                report.change(name, "fold", "into " + ", ".join(plan.linears + [f"{m}.in_proj" for m in plan.mhas]))
                continue
        if not name:  # the model itself is a LayerNorm: nothing to hang a wrapper on
            report.skip(name, "the model itself is a LayerNorm")
            continue
        new, why = _constants(norm, samples.get(name))
        if new is None:
            report.skip(name, why)
            continue
        set_submodule(model, name, new)
        detail = f"fold impossible: {plan.blocker}" if plan is not None else ""
        report.change(name, "constants", detail)
    report.notes.append(self_check_note(model, inputs, reference))
    return model, report
