"""The graph questions vitexport's ONNX passes ask, answered on onnx-ir values and nodes."""
from __future__ import annotations

from typing import Iterable

import numpy as np
import onnx_ir as ir

__all__ = [
    "PASS_THROUGH_OPS",
    "const_array",
    "quantized_linears",
    "is_const",
    "static_shape",
    "attr",
    "opset_version",
    "producer_through",
    "uses_through",
    "set_dtype",
    "conv_stages",
]

#: ops that move or reshape values without changing them (a channel stays a channel when the last
#: dimension is unchanged)
PASS_THROUGH_OPS = frozenset({"Reshape", "Flatten", "Identity", "Squeeze", "Unsqueeze"})


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The value's constant content (an initializer or a ``Constant`` node's output), else None."""
    if value is None:
        return None
    if value.const_value is not None:
        return value.const_value.numpy()
    node = value.producer()
    if node is not None and node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
        for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
            a = node.attributes.get(key)
            if a is None:
                continue
            v = a.value
            return v.numpy() if hasattr(v, "numpy") else np.asarray(v)
    return None


def is_const(value: ir.Value | None) -> bool:
    """Whether the value is an initializer or the output of a ``Constant`` node."""
    if value is None:
        return False
    if value.const_value is not None or value.is_initializer():
        return True
    node = value.producer()
    return node is not None and node.op_type == "Constant"


def static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """The value's shape when every dimension is a known integer, else None."""
    if value is None:
        return None
    shape = value.shape
    if shape is None and value.const_value is not None:
        shape = value.const_value.shape
    if shape is None:
        return None
    dims = tuple(shape)
    if not all(isinstance(d, int) and d >= 0 for d in dims):
        return None
    return dims


def attr(node: ir.Node, name: str, default=None):
    """An attribute's Python value (int, float, string, list, tensor), or ``default``."""
    a = node.attributes.get(name)
    return default if a is None else a.value


def opset_version(model: ir.Model) -> int:
    """The default-domain opset the model imports."""
    return int(model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0)))


def producer_through(value: ir.Value, ops: Iterable[str] = PASS_THROUGH_OPS) -> tuple[ir.Node | None, ir.Value]:
    """Walk back from ``value`` through ``ops`` (first input each); returns the first producer that
    is not one of them (None for a graph input or constant) and the value it produces."""
    ops = frozenset(ops)
    node = value.producer()
    while node is not None and node.op_type in ops and node.inputs and node.inputs[0] is not None:
        value = node.inputs[0]
        node = value.producer()
    return node, value


def uses_through(value: ir.Value, ops: Iterable[str] = PASS_THROUGH_OPS) -> list[tuple[ir.Node, int]]:
    """Every (consumer, input index) of ``value``, looking through ``ops`` fed at input 0."""
    ops = frozenset(ops)
    out: list[tuple[ir.Node, int]] = []
    for use in value.uses():
        node, idx = use.node, use.idx
        if node.op_type in ops and idx == 0:
            for o in node.outputs:
                out.extend(uses_through(o, ops))
        else:
            out.append((node, idx))
    return out


def set_dtype(value: ir.Value, dtype: ir.DataType) -> None:
    """Give ``value`` a new tensor type. (``value.dtype = …`` edits its type object in place, and an
    onnx-ir clone shares type objects with its original: the float model would change too.)"""
    value.type = ir.TensorType(dtype)


def quantized_linears(model: ir.Model) -> list[ir.Node]:
    """MatMul / Gemm nodes that read a DequantizeLinear activation and a DequantizeLinear of a constant
    2-D weight: the Linears a Q/DQ file quantizes, in graph order."""
    out = []
    for node in model.graph:
        if node.op_type not in ("MatMul", "Gemm") or len(node.inputs) < 2:
            continue
        x, w = (v.producer() if v is not None else None for v in node.inputs[:2])
        if x is None or w is None or x.op_type != "DequantizeLinear" or w.op_type != "DequantizeLinear":
            continue
        weight = const_array(w.inputs[0])
        if weight is not None and weight.ndim == 2:
            out.append(node)
    return out


def conv_stages(model: ir.Model, names: Iterable[str] | None = None) -> bool:
    """Whether the graph has conv stages: a Conv (among ``names`` when given) whose kernel is not its stride, i.e.
    more than a ViT's patch embedding (MobileViT, EfficientViT, SegFormer's overlapping patches, LeViT's stem)."""
    wanted = None if names is None else set(names)
    for node in model.graph:
        if node.op_type != "Conv" or (wanted is not None and node.name not in wanted):
            continue
        kernel, strides = node.attributes.get("kernel_shape"), node.attributes.get("strides")
        if kernel is None:
            return True
        k = list(kernel.as_ints())
        if k != (list(strides.as_ints()) if strides is not None else [1] * len(k)):
            return True
    return False
