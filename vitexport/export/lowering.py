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

__all__ = ["LOWERABLE", "cumsum_as_matmul", "gather_as_matmul", "bool_and", "bool_or", "fold_as_conv_transpose",
           "adaptive_avg_pool_as_matmul"]

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


def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def fold_as_conv_transpose(input: torch.Tensor, output_size, kernel_size, dilation=1, padding=0,
                           stride=1) -> torch.Tensor:
    """``F.fold`` (ONNX ``Col2Im``: opset 18 only, and no TensorRT 10.3 importer) as a grouped
    ``conv_transpose2d`` with one-hot kernels: each block's (i, j) entry is added at offset (i, j),
    the overlapping sums fold computes (VOLO's outlook attention)."""
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = map(_pair, (kernel_size, dilation, padding, stride))
    (oh, ow) = _pair(output_size)
    batched = input.dim() == 3
    x = input if batched else input.unsqueeze(0)
    lh = (oh + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    lw = (ow + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    channels = x.shape[1] // (kh * kw)
    eye = torch.eye(kh * kw, dtype=x.dtype, device=x.device).reshape(kh * kw, 1, kh, kw)
    weight = eye.repeat(channels, 1, 1, 1)  # (C*kh*kw, 1, kh, kw): input channel c*kh*kw + k -> output c
    extra = (oh - ((lh - 1) * sh - 2 * ph + dh * (kh - 1) + 1), ow - ((lw - 1) * sw - 2 * pw + dw * (kw - 1) + 1))
    out = torch.nn.functional.conv_transpose2d(x.reshape(x.shape[0], x.shape[1], lh, lw), weight, stride=(sh, sw),
                                               padding=(ph, pw), output_padding=extra, groups=channels,
                                               dilation=(dh, dw))
    return out if batched else out.squeeze(0)


def _adaptive_windows(size: int, out: int) -> torch.Tensor:
    """The (out, size) matrix of adaptive average pooling along one axis: row i averages the inputs
    ``floor(i·size/out) .. ceil((i+1)·size/out) − 1``, PyTorch's windows."""
    rows = torch.zeros(out, size, dtype=torch.float64)
    for i in range(out):
        start, end = (i * size) // out, -((-(i + 1) * size) // out)
        rows[i, start:end] = 1.0 / (end - start)
    return rows


def adaptive_avg_pool_as_matmul(input: torch.Tensor, output_size) -> torch.Tensor | None:
    """``F.adaptive_avg_pool2d`` whose output size does not divide its input's, as one product with a constant:
    ``reshape(x, (…, H·W)) @ kron(P_h, P_w)ᵀ`` reshaped to ``(…, oh, ow)``, ``P`` each axis's window matrix
    (:func:`_adaptive_windows`). The exporters write that case as index gathers (the TorchScript one refuses it);
    RKNN 2.5.0's optimiser looped on UperNet's pyramid pooling in that form. None where every output size divides
    its input's (an ``AveragePool`` or a mean, as exported)."""
    h, w = input.shape[-2:]
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    oh, ow = int(h if oh is None else oh), int(w if ow is None else ow)
    if (h % oh == 0 and w % ow == 0) or not input.is_floating_point():
        return None
    kernel = torch.kron(_adaptive_windows(int(h), oh), _adaptive_windows(int(w), ow)).t().to(input.dtype)
    flat = input.reshape(*input.shape[:-2], int(h) * int(w))
    return (flat @ kernel.to(input.device)).reshape(*input.shape[:-2], oh, ow)
