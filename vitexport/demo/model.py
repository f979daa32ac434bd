"""The demo ViT: hand-written in the style many production codebases use (einsum attention,
pre-norm blocks, affine LayerNorm, separate q/k/v Linears, an additive float key-padding mask).

It is deliberately the kind of model the passes exist for: the token sequence (16 patches + CLS = 17)
is padded to 24 so attention shapes are multiples of 8, and the padded keys are masked with an
additive 0 / -1e9 buffer — a float mask that a naive quantizer would calibrate as data.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["DemoViT", "build_demo_vit", "DEMO_CONFIG"]

DEMO_CONFIG = dict(img_size=16, patch_size=4, in_chans=1, num_classes=10, dim=64, depth=4, heads=4, mlp_ratio=2.0, pad_to=24)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, mask: torch.Tensor):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        h = self.heads
        q = self.q(x).reshape(b, n, h, c // h).transpose(1, 2)
        k = self.k(x).reshape(b, n, h, c // h).transpose(1, 2)
        v = self.v(x).reshape(b, n, h, c // h).transpose(1, 2)
        attn = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale
        attn = attn + self.mask  # (1, 1, 1, n): 0 for real tokens, -1e9 for padding
        attn = attn.softmax(dim=-1)
        out = torch.einsum("bhij,bhjd->bhid", attn, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float, mask: torch.Tensor):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads, mask)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        hidden = int(dim * mlp_ratio)
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class DemoViT(nn.Module):
    def __init__(self, img_size=16, patch_size=4, in_chans=1, num_classes=10, dim=64, depth=4, heads=4, mlp_ratio=2.0, pad_to=24):
        super().__init__()
        self.patch_embed = nn.Conv2d(in_chans, dim, kernel_size=patch_size, stride=patch_size)
        num_tokens = (img_size // patch_size) ** 2 + 1
        self.num_pad = max(pad_to - num_tokens, 0)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_tokens, dim))
        mask = torch.zeros(1, 1, 1, num_tokens + self.num_pad)
        mask[..., num_tokens:] = -1e9
        self.blocks = nn.ModuleList([Block(dim, heads, mlp_ratio, mask) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)
        # timm-style metadata: vitexport reads the input size and preprocessing from here
        self.pretrained_cfg = {"input_size": (in_chans, img_size, img_size), "mean": (0.5,), "std": (0.5,)}
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        if self.num_pad:
            x = torch.cat([x, x.new_zeros(x.shape[0], self.num_pad, x.shape[2])], dim=1)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


def build_demo_vit() -> DemoViT:
    """The demo architecture with random weights; ``--weights demo_vit.safetensors`` trains it."""
    return DemoViT(**DEMO_CONFIG)
