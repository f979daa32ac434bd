"""Export-time rewrites of a few torch functions, applied while the exporter traces the model.

The rewrites act on *calls* (``F.layer_norm``, ``F.scaled_dot_product_attention``, ``F.gelu``,
``torch.einsum``) through a ``TorchFunctionMode``, PyTorch's supported hook for overriding torch
functions in a scope. Compared with swapping modules in a copy of the model this also catches the
functional calls that modules such as timm's ``LayerNorm2d`` or Hugging Face attention make, never
copies the weights, and leaves the caller's model untouched. Both exporters honour the mode: the
TorchScript tracer records the ops a handler runs, and ``torch.export`` (non-strict) traces through
it.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..recipe import ExportSpec
from .attention import explicit_attention
from .einsum import einsum_as_matmul
from .layernorm import decomposed_layer_norm

__all__ = ["ExportRewrites", "tanh_gelu"]


def tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation with ``x*x*x``: the exporters write ``x**3`` as ``Pow``."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))


class ExportRewrites(TorchFunctionMode):
    """Rewrites what ``spec`` asks for while active; ``counts`` says how many calls were rewritten.

    Args:
        spec: the recipe's export section (``decompose_layernorm``, ``fp16_safe_layernorm``,
            ``explicit_attention``, ``einsum_as_matmul``, ``gelu_approximation``).
    """

    def __init__(self, spec: ExportSpec):
        super().__init__()
        self.spec = spec
        self.counts: Counter[str] = Counter()
        self._handlers: dict[Callable, Callable[..., Any]] = {}
        if spec.decompose_layernorm:
            self._handlers[F.layer_norm] = self._layer_norm
        if spec.explicit_attention:
            self._handlers[F.scaled_dot_product_attention] = self._attention
        if spec.einsum_as_matmul:
            self._handlers[torch.einsum] = self._einsum
        # Always: a tanh GELU the model asks for itself would otherwise export with Pow(x, 3).
        self._handlers[F.gelu] = self._gelu

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = self._handlers.get(func)
        if handler is not None:
            out = handler(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)

    # The handlers bind the same arguments as the functions they replace, so a call with any mix of
    # positional and keyword arguments lands on the right parameter.
    def _layer_norm(self, input, normalized_shape, weight=None, bias=None, eps=1e-5):
        self.counts["layernorm_decomposed"] += 1
        return decomposed_layer_norm(
            input, normalized_shape, weight, bias, eps, fp16_safe=self.spec.fp16_safe_layernorm
        )

    def _attention(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
        self.counts["attention_explicit"] += 1
        return explicit_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    def _einsum(self, equation, *operands):
        if not isinstance(equation, str):
            return NotImplemented  # the sublist form einsum(a, [0, 1], b, [1, 2])
        out = einsum_as_matmul(equation, *operands)
        if out is None:
            self.counts["einsum_kept"] += 1
            return NotImplemented
        self.counts["einsum_as_matmul"] += 1
        return out

    def _gelu(self, input, approximate="none"):
        if approximate == "tanh" or self.spec.gelu_approximation == "tanh":
            self.counts["gelu_tanh"] += 1
            return tanh_gelu(input)
        return NotImplemented
