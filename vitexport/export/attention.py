"""``scaled_dot_product_attention`` written as MatMul → Softmax → MatMul.

Why always explicit: the TorchScript exporter has no symbolic for SDPA below opset 14 (the ``npu``
recipe is opset 13), newer exporters may emit the fused opset-23 ``Attention`` op that edge
compilers do not parse, and the quantizer places Q/DQ around the two batched MatMuls and the
Softmax, which must therefore exist as separate nodes. The math matches PyTorch's reference
("math") implementation.
"""
from __future__ import annotations

import math

import torch

__all__ = ["explicit_attention"]


def explicit_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Same signature and result as ``torch.nn.functional.scaled_dot_product_attention`` in eval.

    Dropout is not exported (export runs in eval mode), so ``dropout_p`` is accepted and ignored.
    A boolean ``attn_mask`` keeps positions that are True; a float mask is added to the logits.
    """
    del dropout_p  # eval-mode export: no dropout in the graph
    # Shapes are static in every export, so the head size is a Python constant here; computing
    # the scale from a traced size would put Shape/Cast/Sqrt/Pow nodes into the graph.
    head_dim = int(query.shape[-1])
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(head_dim)
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        groups = int(query.shape[-3]) // int(key.shape[-3])
        key = key.repeat_interleave(groups, dim=-3)
        value = value.repeat_interleave(groups, dim=-3)
    logits = torch.matmul(query * scale, key.transpose(-2, -1))
    if is_causal:
        L, S = int(query.shape[-2]), int(key.shape[-2])
        causal = torch.ones(L, S, dtype=torch.bool).tril()
        logits = logits.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            logits = logits.masked_fill(~attn_mask, float("-inf"))
        else:
            logits = logits + attn_mask
    return torch.matmul(torch.softmax(logits, dim=-1), value)
