"""A tiny RepVGG-style model: each block trains a 3x3 + 1x1 + identity branch, each with its BatchNorm,
and folds them into one 3x3 conv in ``reparameterize()`` (the method timm's RepVGG/MobileOne define).

Loadable as ``python:tests/passes/rep_models.py:build`` (the export test) and imported by the pass tests.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["RepBlock", "build"]


def _bn(c: int, seed: int) -> nn.BatchNorm2d:
    # trained-looking statistics, so a fold that ignored them (or the eps) would be caught
    g = torch.Generator().manual_seed(seed)
    bn = nn.BatchNorm2d(c)
    with torch.no_grad():
        bn.weight.copy_(1 + 0.3 * torch.randn(c, generator=g))
        bn.bias.copy_(0.2 * torch.randn(c, generator=g))
        bn.running_mean.copy_(0.5 * torch.randn(c, generator=g))
        bn.running_var.copy_(torch.rand(c, generator=g) + 0.5)
    return bn


def _fold(conv_weight: torch.Tensor, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    std = (bn.running_var + bn.eps).sqrt()
    return conv_weight * (bn.weight / std).reshape(-1, 1, 1, 1), bn.bias - bn.running_mean * bn.weight / std


class RepBlock(nn.Module):
    """relu(bn(conv3x3(x)) + bn(conv1x1(x)) + bn(x)); after ``reparameterize()``: relu(conv3x3(x))."""

    def __init__(self, c: int, seed: int) -> None:
        super().__init__()
        self.c = c
        self.conv3 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn3 = _bn(c, seed)
        self.conv1 = nn.Conv2d(c, c, 1, bias=False)
        self.bn1 = _bn(c, seed + 1)
        self.bn_id = _bn(c, seed + 2)
        self.reparam: nn.Conv2d | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reparam is not None:
            return F.relu(self.reparam(x))
        return F.relu(self.bn3(self.conv3(x)) + self.bn1(self.conv1(x)) + self.bn_id(x))

    def reparameterize(self) -> None:
        w3, b3 = _fold(self.conv3.weight, self.bn3)
        w1, b1 = _fold(F.pad(self.conv1.weight, [1, 1, 1, 1]), self.bn1)
        eye = torch.zeros_like(self.conv3.weight)
        eye[torch.arange(self.c), torch.arange(self.c), 1, 1] = 1
        wi, bi = _fold(eye, self.bn_id)
        self.reparam = nn.Conv2d(self.c, self.c, 3, padding=1)
        self.reparam.weight.data, self.reparam.bias.data = w3 + w1 + wi, b3 + b1 + bi
        for name in ("conv3", "bn3", "conv1", "bn1", "bn_id"):
            delattr(self, name)


def build() -> nn.Module:
    """Stem conv, two RepBlocks, global pool, a 10-class head (eval mode, seeded)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), RepBlock(8, 1), RepBlock(8, 11),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)).eval()
