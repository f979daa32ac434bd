"""Multiply-accumulates of one Conv / MatMul / Gemm, from its output shape, its weight's shape in
ONNX's layout and its group count: the one formula behind every MAC count vitexport reports (the
plan's, the Q/DQ file's INT8 share, OpenVINO's runtime model, RKNN's op table).

Each caller translates its own layout to ONNX's first (OpenVINO's grouped weights are 5-D
``[G, Cout/G, Cin/G, kh, kw]``; RKNN lists a depthwise weight as ``(1, C, kh, kw)`` and a grouped
conv it expanded to a dense one as ``(Cout, Cin, kh, kw)``), so that a depthwise or grouped conv
counts what it computes, the same in every note.
"""
from __future__ import annotations

import math
from typing import Sequence

import onnx_ir as ir

from .query import attr, static_shape

__all__ = ["layer_macs", "node_macs", "conv_groups", "MAC_OPS"]

#: the ONNX ops whose multiply-accumulates count as GEMM/Conv work
MAC_OPS = ("Conv", "MatMul", "Gemm")


def layer_macs(op: str, out: Sequence[int], weight: Sequence[int], groups: int = 1, trans_b: bool = False) -> int:
    """Multiply-accumulates of one layer: the output's elements times the products summed into each.

    Args:
        op: ``'Conv'``, ``'MatMul'`` or ``'Gemm'``.
        out: the output's shape (``[N, Cout, *spatial]`` for a Conv).
        weight: the second operand's shape in ONNX's layout: ``[Cout, Cin/groups, *kernel]`` for a
            Conv, ``[..., K, N]`` for a MatMul (a 1-D ``[K]`` too), ``[K, N]`` for a Gemm (``[N, K]``
            with ``trans_b``).
        groups: a Conv's group count (``Cin/groups`` input channels reach each output: a depthwise
            conv's weight is ``[C, 1, kh, kw]``, groups ``C``).
        trans_b: a Gemm's ``transB``.
    Returns:
        ``|out| · K``, K the length of each dot product (``Cin/groups · kh · kw`` for a Conv).
    Raises:
        ValueError: a Conv whose weight is not in ONNX's layout for ``groups`` (its first dim is not
            the output's channels, or they do not split into ``groups``): a caller's translation bug.
    """
    if not out or not weight:
        return 0
    n = math.prod(out)
    if op == "Conv":
        if len(weight) < 3 or len(out) < 2 or weight[0] != out[1] or groups < 1 or weight[0] % groups:
            raise ValueError(f"Conv weight {tuple(weight)} is not [Cout, Cin/{groups}, *kernel] for output {tuple(out)}")
        return n * math.prod(weight[1:])
    if op == "Gemm":
        return n * (weight[-1] if trans_b else weight[0])
    if op == "MatMul":
        return n * (weight[-2] if len(weight) >= 2 else weight[0])
    raise ValueError(f"no MAC formula for op {op!r} (expected one of {', '.join(MAC_OPS)})")


def node_macs(n: ir.Node, weight: tuple[int, ...] | None = None) -> int:
    """Multiply-accumulates of a Conv / MatMul / Gemm node (:func:`layer_macs`
    with its group count and ``transB``); 0 when its output's or second operand's shape is unknown.

    Args:
        n: the node.
        weight: the second operand's shape when known otherwise (a constant's own); default its value's.
    """
    out = static_shape(n.outputs[0])
    weight = weight if weight is not None else static_shape(n.inputs[1] if len(n.inputs) > 1 else None)
    if not out or not weight:
        return 0
    return layer_macs(n.op_type, out, weight, groups=int(attr(n, "group", 1)), trans_b=bool(attr(n, "transB", 0)))


def conv_groups(model: ir.Model) -> dict[str, int]:
    """Node name → ``group`` of each grouped Conv (group > 1) of an ONNX graph: what a runtime's layer
    table that lists grouped convs as dense ones (RKNN's) is read with."""
    return {n.name: int(attr(n, "group", 1)) for n in model.graph.all_nodes()
            if n.op_type == "Conv" and int(attr(n, "group", 1)) > 1}
