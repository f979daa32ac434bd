"""Two-operand ``torch.einsum`` written as Transpose/Reshape/MatMul.

Attention code often says ``einsum("bhid,bhjd->bhij", q, k)``. Exporters write that as an ``Einsum``
node, which NPU op lists rarely include and which the quantizer cannot treat as the batched MatMul
it is. Every two-operand einsum without repeated or ellipsis indices is a batched matrix product:
indices in both operands and the output are batch dimensions, in both operands only are contracted,
in one operand and the output are free. Anything else is left to the exporter.
"""
from __future__ import annotations

import math

import torch

__all__ = ["einsum_as_matmul"]


def _parse(equation: str, n_operands: int) -> tuple[list[str], str] | None:
    eq = equation.replace(" ", "")
    if "." in eq or "->" not in eq:
        return None  # ellipsis and implicit output order: leave to the exporter
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    if len(terms) != n_operands or any(len(set(t)) != len(t) for t in (*terms, out)):
        return None  # repeated index (a diagonal or trace): not a matrix product
    if not set(out) <= set("".join(terms)):
        return None
    return terms, out


def _sum_lonely(t: torch.Tensor, term: str, other: str, out: str) -> tuple[torch.Tensor, str]:
    lonely = [i for i, c in enumerate(term) if c not in other and c not in out]
    if not lonely:
        return t, term
    return t.sum(dim=lonely), "".join(c for i, c in enumerate(term) if i not in lonely)


def einsum_as_matmul(equation: str, *operands: torch.Tensor) -> torch.Tensor | None:
    """``torch.einsum(equation, a, b)`` through one ``matmul``; ``None`` when it does not apply.

    Args:
        equation: an explicit einsum equation (with ``->``) over two operands.
        operands: the two tensors (a single list or tuple of two is accepted too).
    Returns:
        The product, or ``None`` for equations that are not a batched matrix product, so the
        caller can fall back to ``torch.einsum``.
    """
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if len(operands) != 2 or not all(isinstance(t, torch.Tensor) for t in operands):
        return None
    parsed = _parse(equation, 2)
    if parsed is None:
        return None
    (ta, tb), out = parsed
    a, b = operands
    if a.dim() != len(ta) or b.dim() != len(tb):
        return None
    # Indices that appear in one operand only and not in the output are summed out first.
    a, ta = _sum_lonely(a, ta, tb, out)
    b, tb = _sum_lonely(b, tb, ta, out)
    batch = [c for c in out if c in ta and c in tb]
    contract = [c for c in ta if c in tb and c not in out]
    free_a = [c for c in out if c in ta and c not in tb]
    free_b = [c for c in out if c in tb and c not in ta]
    if any(int(a.shape[ta.index(c)]) != int(b.shape[tb.index(c)]) for c in batch + contract):
        return None  # a broadcasting einsum: leave it to the exporter
    size = {**{c: int(b.shape[i]) for i, c in enumerate(tb)}, **{c: int(a.shape[i]) for i, c in enumerate(ta)}}
    # Shapes are static in every export, so the reshape targets are Python constants.
    nb = [size[c] for c in batch]
    m = math.prod(size[c] for c in free_a)
    k = math.prod(size[c] for c in contract)
    n = math.prod(size[c] for c in free_b)
    a2 = a.permute([ta.index(c) for c in batch + free_a + contract]).reshape(*nb, m, k)
    b2 = b.permute([tb.index(c) for c in batch + contract + free_b]).reshape(*nb, k, n)
    y = torch.matmul(a2, b2).reshape(*nb, *[size[c] for c in free_a], *[size[c] for c in free_b])
    order = batch + free_a + free_b
    perm = [order.index(c) for c in out]
    return y if perm == list(range(len(perm))) else y.permute(perm)
