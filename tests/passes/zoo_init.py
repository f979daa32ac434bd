"""Trained-looking random weights for the zoo: what a model's own init leaves degenerate, re-drawn (seeded).

A random-weight model is not a trained one where its init is built to be switched off at the start of
training: BatchNorm scales initialised to 0 (RepViT's and ResNet's last BN of a residual branch), layer
scales of 1e-5 / 1e-6 (FastViT, EfficientFormer, MobileNetV4, ConvNeXt, CaiT, DINOv2), and BatchNorm
running statistics of 0 / 1 that match no activation of the net (MobileOne's random init reaches
|x| ~ 1e14). Folded into the exported graph these give all-zero convs or activations around 1e-10, and
an INT8 figure measured on them says nothing about the trained model a user exports.

:func:`realistic_init` re-draws, in place and seeded: every BatchNorm's affine weight to 1 ± 0.1 and
bias to ~0.05; every layer scale that its init left all equal and tiny (``|c| <= 1e-3``, a parameter
named gamma / scale / lambda / ls / layer_scale) uniformly in [0.1, 1]; then every BatchNorm's running
statistics are measured on the example inputs (train-mode BatchNorms only, cumulative average), as
training would have left them. Test side only: vitexport never changes a user's weights.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence, Union

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["InitReport", "realistic_init", "LAYER_SCALE_NAME", "TINY"]

Inputs = Union[Mapping[str, torch.Tensor], Sequence[torch.Tensor]]
#: parameter names a layer scale goes by (timm: gamma, gamma_1, ls1.gamma, layer_scale*.scale, layer_scale;
#: Hugging Face: lambda1, lambda_1, layer_scale_parameter, layer_scale_1)
LAYER_SCALE_NAME = re.compile(r"(^|[._])(gamma\w*|lambda\w*|ls\d*|layer_scale\w*|scale)$")
#: an init value this small switches its branch off (timm's init_values / layer_scale_init_value: 1e-5, 1e-6)
TINY = 1e-3


@dataclass
class InitReport:
    """What :func:`realistic_init` re-drew: BatchNorms (of which had a zero scale) and layer scales."""

    batchnorms: int = 0
    zero_bn_scales: int = 0
    layer_scales: int = 0
    bn_stats_measured: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.batchnorms or self.layer_scales)


def _is_layer_scale(name: str, p: torch.Tensor) -> bool:
    if not LAYER_SCALE_NAME.search(name) or not p.is_floating_point() or p.numel() < 2:
        return False
    first = p.reshape(-1)[0]
    return bool(first.abs() <= TINY and torch.all(p == first))


def _measure_bn_stats(model: nn.Module, bns: list[_BatchNorm], inputs: Inputs) -> None:
    """Running statistics as the BatchNorms' own inputs have them: a cumulative average over one forward
    (momentum None), only the BatchNorms in train mode (dropout, drop-path and the rest stay in eval)."""
    saved = [(bn.momentum, bn.training) for bn in bns]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
        bn.train()
    try:
        with torch.no_grad():
            model(**inputs) if isinstance(inputs, Mapping) else model(*inputs)
    finally:
        for bn, (momentum, training) in zip(bns, saved):
            bn.momentum = momentum
            bn.train(training)


def realistic_init(model: nn.Module, inputs: Inputs, seed: int = 0) -> InitReport:
    """Re-draw ``model``'s degenerate init in place (see the module docstring); returns what changed.

    Args:
        model: the model in eval mode; called as ``model(**inputs)`` (``model(*inputs)`` for a tuple) to
            measure BatchNorm statistics.
        inputs: a batch of example inputs (8 samples or so: BatchNorm statistics are measured on them).
        seed: the seed of every draw.
    """
    g = torch.Generator().manual_seed(seed)
    report = InitReport()
    bns = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    with torch.no_grad():
        for bn in bns:
            if bn.affine:
                report.zero_bn_scales += int(bool(torch.all(bn.weight == 0)))
                bn.weight.copy_(1 + 0.1 * torch.randn(bn.weight.shape, generator=g))
                bn.bias.copy_(0.05 * torch.randn(bn.bias.shape, generator=g))
            report.batchnorms += 1
        for name, p in model.named_parameters():
            if _is_layer_scale(name, p):
                p.copy_(0.1 + 0.9 * torch.rand(p.shape, generator=g))
                report.layer_scales += 1
    tracked = [bn for bn in bns if bn.track_running_stats]
    if tracked:
        _measure_bn_stats(model, tracked, inputs)
        report.bn_stats_measured = True
    return report
