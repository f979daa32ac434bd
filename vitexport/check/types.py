"""Operator input and output types against the ONNX schemas: rule ``onnx.types``.

A graph pass that changes types (the FP16 islands, a Cast inserted by hand) can give an operator a
type its schema does not take: ``Resize`` reads its ``scales`` only as float32, so a float16 one
makes ONNX Runtime refuse the whole file with ``INVALID_GRAPH``. These checks read the schema of
each standard-domain node at the model's opset: every typed input and output must be one of the
types its formal parameter allows, and the values bound to one type constraint (``T``) must agree.
"""
from __future__ import annotations

from functools import lru_cache

import onnx
import onnx_ir as ir

from ..graph.query import opset_version
from .contract import STANDARD_DOMAINS, all_nodes
from .violation import Violation, node_label

__all__ = ["allowed_types", "type_violations"]


@lru_cache(maxsize=None)
def _schema(op: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None


_NAMES = {ir.DataType.FLOAT: "tensor(float)", ir.DataType.FLOAT16: "tensor(float16)", ir.DataType.DOUBLE: "tensor(double)",
          ir.DataType.BFLOAT16: "tensor(bfloat16)", ir.DataType.INT64: "tensor(int64)", ir.DataType.INT32: "tensor(int32)",
          ir.DataType.INT8: "tensor(int8)", ir.DataType.UINT8: "tensor(uint8)", ir.DataType.BOOL: "tensor(bool)",
          ir.DataType.INT16: "tensor(int16)", ir.DataType.UINT16: "tensor(uint16)", ir.DataType.UINT32: "tensor(uint32)",
          ir.DataType.UINT64: "tensor(uint64)", ir.DataType.STRING: "tensor(string)"}


def _formal(params, i: int):
    """The formal parameter that position ``i`` binds to (a variadic last parameter takes the rest)."""
    if i < len(params):
        return params[i]
    if params and params[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        return params[-1]
    return None


def _allowed(schema: onnx.defs.OpSchema, type_str: str) -> frozenset[str]:
    for tc in schema.type_constraints:
        if tc.type_param_str == type_str:
            return frozenset(tc.allowed_type_strs)
    return frozenset({type_str})  # a concrete type such as tensor(float)


def allowed_types(node: ir.Node, index: int, opset: int, output: bool = False) -> tuple[str, frozenset[str]] | None:
    """(parameter name, the types its schema allows) of input (or output) ``index`` of ``node``;
    None for a node outside the standard domain, an unknown op or an index past the schema."""
    if node.domain not in STANDARD_DOMAINS:
        return None
    schema = _schema(node.op_type, opset)
    if schema is None:
        return None
    p = _formal(schema.outputs if output else schema.inputs, index)
    return None if p is None else (p.name, _allowed(schema, p.type_str))


def _node_violations(n: ir.Node, opset: int) -> list[Violation]:
    schema = _schema(n.op_type, opset)
    if schema is None:
        return []
    bound: dict[str, tuple[str, str]] = {}  # constraint -> (type, the value that bound it)
    out: list[Violation] = []
    for output, values, params in ((False, n.inputs, schema.inputs), (True, n.outputs, schema.outputs)):
        for i, v in enumerate(values):
            p = _formal(params, i)
            name = _NAMES.get(v.dtype) if v is not None and v.dtype is not None else None
            if p is None or name is None:
                continue
            allowed = _allowed(schema, p.type_str)
            where = f"{'output' if output else 'input'} '{p.name}' ('{v.name}')"
            if name not in allowed:
                out.append(Violation("onnx.types", node_label(n), f"takes {where} as {name}, its schema allows "
                                     f"{', '.join(sorted(allowed))}", "keep that operand in a type the operator takes "
                                     "(a pass retyped it; a Cast before the node restores it)", n.name, n.op_type))
            elif p.type_str in bound and bound[p.type_str][0] != name:
                out.append(Violation("onnx.types", node_label(n), f"binds {p.type_str} to {bound[p.type_str][0]} "
                                     f"({bound[p.type_str][1]}) and to {name} ({where})",
                                     "operands of one type constraint must have one type", n.name, n.op_type))
            else:
                bound.setdefault(p.type_str, (name, where))
    return out


def type_violations(model: ir.Model) -> list[Violation]:
    """Every standard-domain node whose typed operands break its schema (rule ``onnx.types``)."""
    opset = opset_version(model)
    out: list[Violation] = []
    for n in all_nodes(model):
        if n.domain in STANDARD_DOMAINS:
            out += _node_violations(n, opset)
    return out
