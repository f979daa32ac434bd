"""Export-time rewrites of a few torch functions, applied while the exporter traces the model.

The rewrites act on *calls* (``F.layer_norm``, ``F.scaled_dot_product_attention``, ``F.gelu``,
``torch.einsum``, ``F.fold``, and for a target whose ``contract.allowed_ops`` lacks them ``cumsum``, ``gather``
and boolean ``&`` / ``|``, see :mod:`.lowering`) through a ``TorchFunctionMode``, PyTorch's supported hook for overriding torch
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

from ..recipe import ContractSpec, ExportSpec
from .attention import explicit_attention
from .einsum import einsum_as_matmul
from .layernorm import decomposed_layer_norm
from .lowering import (LOWERABLE, adaptive_avg_pool_as_matmul, bool_and, bool_or, cumsum_as_matmul, fold_as_conv_transpose,
                       gather_as_matmul)

__all__ = ["ExportRewrites", "tanh_gelu"]


def tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation with ``x*x*x``: the exporters write ``x**3`` as ``Pow``."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))


class ExportRewrites(TorchFunctionMode):
    """Rewrites what ``spec`` asks for while active; ``counts`` says how many calls were rewritten.

    Args:
        spec: the recipe's export section (``decompose_layernorm``, ``fp16_safe_layernorm``,
            ``explicit_attention``, ``einsum_as_matmul``, ``gelu_approximation``).
        contract: the recipe's contract; ops of :data:`~.lowering.LOWERABLE` missing from its
            ``allowed_ops`` are written with ops it has (counted as ``lowered_<Op>``).
    """

    def __init__(self, spec: ExportSpec, contract: ContractSpec | None = None):
        super().__init__()
        self.spec = spec
        self.counts: Counter[str] = Counter()
        self._handlers: dict[Callable, Callable[..., Any]] = {}
        allowed = None if contract is None or contract.allowed_ops is None else set(contract.allowed_ops)
        self.lowered = frozenset(op for op in LOWERABLE if allowed is not None and op not in allowed)
        self._lowering_handlers()
        if spec.decompose_layernorm:
            self._handlers[F.layer_norm] = self._layer_norm
        if spec.explicit_attention:
            self._handlers[F.scaled_dot_product_attention] = self._attention
        if spec.einsum_as_matmul:
            self._handlers[torch.einsum] = self._einsum
        # Always: a tanh GELU the model asks for itself would otherwise export with Pow(x, 3).
        self._handlers[F.gelu] = self._gelu
        # Always: F.fold is Col2Im, which opset 17 lacks and TensorRT 10.3's parser does not import
        self._handlers[F.fold] = self._fold
        # Always: adaptive pooling by a size that does not divide the input's exports as index gathers (UperNet's
        # pyramid pooling; RKNN's optimiser looped on them, the TorchScript exporter refuses them)
        self._handlers[F.adaptive_avg_pool2d] = self._adaptive_avg_pool

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = self._handlers.get(func)
        if handler is not None:
            out = handler(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)

    def _lowering_handlers(self) -> None:
        if "CumSum" in self.lowered:
            self._handlers[torch.cumsum] = self._handlers[torch.Tensor.cumsum] = self._cumsum
        if "GatherElements" in self.lowered:
            self._handlers[torch.gather] = self._handlers[torch.Tensor.gather] = self._gather
        for op, fn, funcs in (
            ("And", bool_and, (torch.logical_and, torch.Tensor.logical_and, torch.Tensor.__and__, torch.Tensor.__rand__,
                               torch.bitwise_and, torch.Tensor.bitwise_and)),
            ("Or", bool_or, (torch.logical_or, torch.Tensor.logical_or, torch.Tensor.__or__, torch.Tensor.__ror__,
                             torch.bitwise_or, torch.Tensor.bitwise_or)),
        ):
            if op in self.lowered:
                for f in funcs:
                    self._handlers[f] = self._boolean(op, fn)

    def _cumsum(self, input, dim, *, dtype=None, out=None):
        if out is not None:
            return NotImplemented
        self.counts["lowered_CumSum"] += 1
        return cumsum_as_matmul(input, dim, dtype=dtype)

    def _gather(self, input, dim, index, *, sparse_grad=False, out=None):
        if out is not None:
            return NotImplemented
        self.counts["lowered_GatherElements"] += 1
        return gather_as_matmul(input, dim, index)

    def _boolean(self, op: str, fn: Callable[..., torch.Tensor]) -> Callable[..., Any]:
        def handler(input, other, *args, **kwargs):
            if args or kwargs or not all(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in (input, other)):
                return NotImplemented  # integers (bitwise ops) and out= calls are left alone
            self.counts[f"lowered_{op}"] += 1
            return fn(input, other)

        return handler

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

    def _fold(self, input, output_size, kernel_size, dilation=1, padding=0, stride=1):
        self.counts["fold_as_conv_transpose"] += 1
        return fold_as_conv_transpose(input, output_size, kernel_size, dilation, padding, stride)

    def _adaptive_avg_pool(self, input, output_size):
        out = adaptive_avg_pool_as_matmul(input, output_size)
        if out is None:
            return NotImplemented
        self.counts["adaptive_pool_as_matmul"] += 1
        return out

    def _gelu(self, input, approximate="none"):
        if approximate == "tanh" or self.spec.gelu_approximation == "tanh":
            self.counts["gelu_tanh"] += 1
            return tanh_gelu(input)
        return NotImplemented
