"""LayerNorm written with elementary ops, for compilers that cannot parse ``LayerNormalization``.

TensorRT 8.5/8.6 (JetPack 5 / 6.0) cannot parse the opset-17 op, and below opset 17 the TorchScript
exporter writes LayerNorm as ``Pow(x - mean, 2)``, which a target without the op then runs in
float16. Any square of ``|x - mean| > 256`` overflows float16 (65504), and ViT-B residual streams
carry channels near 1400: the variance becomes ``inf``, every normalised value becomes 0 and the
block outputs only its bias (one such export cost a ViT 65 points of top-1).

``fp16_safe=True`` divides by ``s = max(max|x - mean|, sqrt(eps))`` before squaring. That is exact
for any ``s > 0`` (``d/s / sqrt(mean((d/s)^2) + eps/s^2) == d / sqrt(var + eps)``) and keeps every
intermediate in [0, 1] whatever the activations' scale. It adds Abs/ReduceMax/Max per LayerNorm;
targets that run no float16 (``npu``) use the plain form, whose ops all sit on their op list.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = ["decomposed_layer_norm"]


def decomposed_layer_norm(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    fp16_safe: bool = True,
) -> torch.Tensor:
    """``F.layer_norm`` as Sub/ReduceMean/Mul/Sqrt/Div (never ``Pow``), optionally float16-safe.

    Args:
        x: the input; normalised over its last ``len(normalized_shape)`` dimensions.
        normalized_shape, weight, bias, eps: as in ``torch.nn.functional.layer_norm``.
        fp16_safe: scale by the largest deviation first so no intermediate can overflow float16.
    Returns:
        The normalised tensor, equal to ``F.layer_norm`` up to float rounding.
    """
    dims = tuple(range(-len(normalized_shape), 0))
    if fp16_safe:
        # Summing first would overflow float16 when many channels are large; (x * 1/n) summed is
        # bounded by max|x|. n is the static element count of the normalised dimensions.
        n = math.prod(int(s) for s in normalized_shape)
        mean = (x * (1.0 / n)).sum(dims, keepdim=True)
        d = x - mean
        # A tensor, not a Python float: ``float / tensor`` exports as Reciprocal + Mul.
        root_eps = torch.full((), math.sqrt(eps), dtype=x.dtype)
        s = torch.maximum(d.abs().amax(dims, keepdim=True), root_eps)
        d = d / s
        c = root_eps / s  # <= 1, so c * c cannot overflow; it may underflow when eps is negligible
        var = (d * d).mean(dims, keepdim=True) + c * c
    else:
        # Subtract the mean first (never E[x^2] - E[x]^2, which cancels catastrophically) and square
        # with Mul: some compilers run Pow through exp/log or reject it outright.
        d = x - x.mean(dims, keepdim=True)
        var = (d * d).mean(dims, keepdim=True) + eps
    y = d / torch.sqrt(var)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
