"""Index plumbing written with the ops an edge compiler takes (``contract.allowed_ops``).

Text encoders build position ids and token types from their inputs with ops a generic NPU op list
lacks: RoBERTa counts real tokens with ``cumsum`` (ONNX ``CumSum``) and picks token types with
``torch.gather`` (``GatherElements``); mask code combines booleans with ``&`` / ``|`` (``And`` /
``Or``). Shapes are static, so each has an exact form in MatMul, Equal, Not, Cast and Mul:

* ``cumsum`` along an axis of length n: a product with the constant upper-triangular n x n ones;
* ``gather`` along an axis of length n: a product of the one-hot ``index == arange(n)`` with the input;
* ``a & b`` on booleans: ``a * b`` in int32; ``a | b``: ``not (a + b == 0)``.

Integer inputs stay integers (an int64 MatMul is exact, and the quantizer never touches a MatMul
whose input is not float).
"""
from __future__ import annotations

import torch

__all__ = ["LOWERABLE", "cumsum_as_matmul", "gather_as_matmul", "bool_and", "bool_or"]

#: ONNX op -> what replaces it, for the export report.
LOWERABLE: dict[str, str] = {
    "CumSum": "MatMul with a triangular constant",
    "GatherElements": "Equal (one-hot) + MatMul",
    "And": "Cast + Mul",
    "Or": "Cast + Add + Equal + Not",
}


def _swap_last(t: torch.Tensor, d: int) -> torch.Tensor:
    # transpose, not movedim: the exporter writes movedim(d, -1) as a Transpose with a negative perm
    return t if d == t.dim() - 1 else t.transpose(d, -1)


def _matmul_dtype(t: torch.Tensor) -> torch.dtype:
    return t.dtype if t.is_floating_point() else torch.int64


def cumsum_as_matmul(input: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.cumsum(input, dim)`` as ``input @ triu(ones(n, n))`` along ``dim``."""
    x = input if dtype is None else input.to(dtype)
    # like torch.cumsum: integers and booleans add up in int64 unless a dtype is given
    out_dtype = x.dtype if dtype is not None or x.is_floating_point() else torch.int64
    d = dim % x.dim()
    n = int(x.shape[d])
    work = _matmul_dtype(x)
    tri = torch.ones(n, n, dtype=work, device=x.device).triu()  # tri[i, j] = 1 for i <= j
    out = _swap_last(torch.matmul(_swap_last(x, d).to(work), tri), d)
    return out.to(out_dtype)


def gather_as_matmul(input: torch.Tensor, dim: int, index: torch.Tensor, *, sparse_grad: bool = False) -> torch.Tensor:
    """``torch.gather(input, dim, index)`` as a one-hot product along ``dim``."""
    del sparse_grad
    d = dim % input.dim()
    n = int(input.shape[d])
    x = _swap_last(input, d)
    idx = _swap_last(index, d)
    # gather reads only the leading part of the other axes when index is smaller there
    x = x[tuple(slice(0, int(s)) for s in idx.shape[:-1])]
    work = _matmul_dtype(x)
    onehot = (idx.unsqueeze(-1) == torch.arange(n, device=idx.device)).to(work)  # (..., m, n)
    out = torch.matmul(onehot, x.to(work).unsqueeze(-1)).squeeze(-1)  # (..., m)
    return _swap_last(out.to(input.dtype), d)


def bool_and(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a & b`` for booleans without an ``And`` op."""
    return (a.to(torch.int32) * b.to(torch.int32)).to(torch.bool)


def bool_or(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a | b`` for booleans without an ``Or`` op."""
    return torch.logical_not((a.to(torch.int32) + b.to(torch.int32)) == 0)
