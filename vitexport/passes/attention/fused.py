"""Separate q / k / v Linears reading one input, computed as one Linear, without touching ``forward``.

The attention's own code still calls ``self.q_proj(x)``, ``self.k_proj(x)``, ``self.v_proj(x)``. Those
attributes become :class:`ProjectionSlice` modules backed by one :class:`FusedProjection` (registered on
the attention as ``qkv``): the first slice asked for ``x`` runs the fused Linear once (one MatMul/Gemm
in the exported graph) and the others take their part of that result, as long as they are given the
very same, unmodified tensor. A slice given anything else computes the fused Linear again and takes
its part, which is still correct.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from .ops import fused_qkv_name

__all__ = ["FusedProjection", "ProjectionSlice", "fuse_projections"]


class FusedProjection(nn.Linear):
    """One Linear holding the rows of several (q, k, v) in order; ``split`` are their output sizes."""

    def __init__(self, parts: Sequence[nn.Linear], names: Sequence[str]):
        ref = parts[0].weight
        has_bias = any(p.bias is not None for p in parts)
        super().__init__(parts[0].in_features, sum(p.out_features for p in parts), bias=has_bias,
                         device=ref.device, dtype=ref.dtype)
        with torch.no_grad():
            self.weight.copy_(torch.cat([p.weight for p in parts], 0))
            if has_bias:
                self.bias.copy_(torch.cat([
                    p.bias if p.bias is not None else torch.zeros(p.out_features, dtype=ref.dtype, device=ref.device)
                    for p in parts
                ]))
        self.train(parts[0].training)
        self.split = [p.out_features for p in parts]
        self.part_names = list(names)
        self._memo: list[Any] | None = None

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Output rows ``index`` of this Linear applied to ``x`` (computed once for all parts)."""
        memo = self._memo
        if memo is None or memo[0] is not x or memo[1] != x._version or index in memo[3]:
            memo = [x, x._version, self(x).split(self.split, dim=-1), set()]
            self._memo = memo
        memo[3].add(index)
        if len(memo[3]) == len(self.split):
            self._memo = None  # every part served: hold no activation past this call
        return memo[2][index]

    def extra_repr(self) -> str:
        return super().extra_repr() + f", parts={self.part_names}"

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_memo"] = None
        return state


class ProjectionSlice(nn.Module):
    """Stands where one of the fused Linears was; holds no weight of its own."""

    def __init__(self, fused: FusedProjection, index: int, fused_name: str):
        super().__init__()
        # A plain reference, not a child module: the fused Linear is registered once, on the attention.
        self.__dict__["fused"] = fused
        self.index = index
        self.fused_name = fused_name
        self.in_features = fused.in_features
        self.out_features = fused.split[index]

    @property
    def _rows(self) -> slice:
        start = sum(self.fused.split[: self.index])
        return slice(start, start + self.out_features)

    @property
    def weight(self) -> torch.Tensor:
        """This part's rows of the fused weight (a view: code reading ``.weight.dtype`` still works)."""
        return self.fused.weight[self._rows]

    @property
    def bias(self) -> torch.Tensor | None:
        return None if self.fused.bias is None else self.fused.bias[self._rows]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.part(x, self.index)

    def extra_repr(self) -> str:
        return f"part {self.index} of '{self.fused_name}', out_features={self.out_features}"


def fuse_projections(owner: nn.Module, names: Sequence[str]) -> str:
    """Replace the Linears ``names`` (dotted, under ``owner``) by slices of one fused Linear.

    Returns:
        The attribute name of the fused Linear on ``owner``.
    Raises:
        ValueError: the parts are not Linears with the same input size, dtype and device.
    """
    parts = [owner.get_submodule(n) for n in names]
    if not all(type(p) is nn.Linear for p in parts):
        raise ValueError(f"cannot fuse {list(names)}: not all are nn.Linear")
    if len({(p.in_features, p.weight.dtype, p.weight.device) for p in parts}) != 1:
        raise ValueError(f"cannot fuse {list(names)}: input sizes, dtypes or devices differ")
    fused = FusedProjection(parts, names)
    attr = fused_qkv_name(owner)
    owner.add_module(attr, fused)
    for i, n in enumerate(names):
        parent_name, _, leaf = n.rpartition(".")
        parent = owner.get_submodule(parent_name) if parent_name else owner
        setattr(parent, leaf, ProjectionSlice(fused, i, attr))
    return attr
