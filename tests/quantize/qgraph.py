"""Reading a quantized ONNX file in the tests: small questions on onnx-ir nodes."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir

from vitexport.graph.query import const_array, is_const


def load(path: str | Path) -> ir.Model:
    return ir.load(str(path))


def producer_op(value: ir.Value | None) -> str | None:
    p = value.producer() if value is not None else None
    return p.op_type if p is not None else None


def dq_fed(node: ir.Node) -> list[int]:
    """Input indices of ``node`` fed by a DequantizeLinear."""
    return [j for j, v in enumerate(node.inputs) if producer_op(v) == "DequantizeLinear"]


def weight_dq(value: ir.Value | None) -> bool:
    """Whether ``value`` is a DequantizeLinear of a constant (a quantized weight)."""
    p = value.producer() if value is not None else None
    return p is not None and p.op_type == "DequantizeLinear" and is_const(p.inputs[0])


def residual_adds(model: ir.Model) -> list[ir.Node]:
    """Adds of two non-constant tensors (the residual connections)."""
    return [n for n in model.graph if n.op_type == "Add" and not any(is_const(v) for v in n.inputs)]


def consumers(value: ir.Value) -> list[ir.Node]:
    return [u.node for u in value.uses()]


def const(value: ir.Value) -> np.ndarray:
    return const_array(value)
