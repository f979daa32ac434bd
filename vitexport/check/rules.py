"""What a target's runtime accepts in a graph beyond the recipe's contract: the rule engine and
the rules every target shares.

:class:`RuntimeRules` walks the Q/DQ nodes (:meth:`~RuntimeRules.qdq`), then the whole graph
(:meth:`~RuntimeRules.graph`); a target's module subclasses it with its own rule ids and returns it
from ``Target.rules()`` (TensorRT's in :mod:`vitexport.targets.tensorrt.rules`, the NPU's in
:mod:`vitexport.targets.npu`). The quantizer validates what it wrote with them, the export's
contract step and ``vitexport check`` run them after the contract.

Shared by every target: ``qdq.scale`` (a finite, positive constant scale), ``qdq.axis`` (a
per-channel scale names an axis of its input and has one entry per channel along it),
``qdq.integer_path`` (nothing quantizes an integer tensor such as token ids or a shape),
``onnx.types`` (operand types its schema takes, :mod:`.types`).
"""
from __future__ import annotations

from typing import ClassVar, Iterable

import numpy as np
import onnx_ir as ir

from ..graph.query import attr, const_array, opset_version, static_shape
from .contract import STANDARD_DOMAINS, all_nodes
from .types import type_violations
from .violation import Violation, node_label

__all__ = ["RuntimeRules", "violation", "qdq_scale", "qdq_zero_point", "QDQ_OPS", "FLOAT16_TYPES"]

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE)
FLOAT16_TYPES = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


def violation(rule: str, n: ir.Node, problem: str, hint: str) -> Violation:
    """A :class:`Violation` of ``rule`` naming node ``n``."""
    return Violation(rule, node_label(n), problem, hint, n.name, n.op_type)


def qdq_scale(n: ir.Node) -> np.ndarray | None:
    """The constant scale of a QuantizeLinear / DequantizeLinear, or None."""
    return const_array(n.inputs[1]) if len(n.inputs) > 1 else None


def qdq_zero_point(n: ir.Node) -> ir.Value | None:
    """The zero-point input of a QuantizeLinear / DequantizeLinear, or None."""
    return n.inputs[2] if len(n.inputs) > 2 else None


class RuntimeRules:
    """The rules every target shares. A target's rules subclass it: ``RULES`` lists the ids they
    can report (in the order ``vitexport check`` names them), :meth:`qdq` and :meth:`graph` add theirs."""

    RULES: ClassVar[tuple[str, ...]] = ("qdq.scale", "qdq.axis", "qdq.integer_path", "onnx.types")
    #: the id of a rule that says what ``contract.forbid_float16`` says (a check reports it by the key)
    FLOAT16_RULE: ClassVar[str | None] = None

    def violations(self, model: ir.Model, skip: Iterable[str] = ()) -> list[Violation]:
        """Every rule of this target the graph breaks, Q/DQ nodes in graph order, then graph-wide
        rules; ``skip`` names rules another check already ran (the recipe's float16 contract)."""
        opset = opset_version(model)
        out: list[Violation] = []
        for n in all_nodes(model):
            if n.op_type in QDQ_OPS and n.domain in STANDARD_DOMAINS:
                out += self.qdq(n, opset)
        out += self.graph(model, opset) + type_violations(model)
        skip = set(skip)
        return [v for v in out if v.rule not in skip]

    def qdq(self, n: ir.Node, opset: int) -> list[Violation]:
        """The rules one QuantizeLinear / DequantizeLinear breaks."""
        out: list[Violation] = []
        scale = qdq_scale(n)
        if scale is None or scale.size == 0 or not np.all(np.isfinite(scale)) or not np.all(scale > 0):
            bad = scale[~(np.isfinite(scale) & (scale > 0))] if scale is not None and scale.size else None
            what = "is not a constant" if bad is None else f"holds {bad.ravel()[0]}, not a finite positive number"
            out.append(violation("qdq.scale", n, f"scale {what}", "a scale must be a finite positive constant; a zero "
                          "range calibrates to scale 0: recalibrate on data that reaches the tensor"))
        elif scale.size > 1:
            out += self._axis(n, scale)
        x = n.inputs[0]
        if n.op_type == "QuantizeLinear" and x is not None and x.dtype is not None and x.dtype not in _FLOATS:
            out.append(violation("qdq.integer_path", n, f"quantizes '{x.name}', a {x.dtype.name.lower()} tensor",
                          "quantize float activations only; remove the Q/DQ from the integer (ids / shape) path"))
        return out

    def _axis(self, n: ir.Node, scale: np.ndarray) -> list[Violation]:
        shape = static_shape(n.inputs[0])
        if shape is None:
            return []
        axis = attr(n, "axis", 1)
        hint = "a per-channel scale has one entry per channel of the axis it names: fix 'axis' or the scale"
        if not -len(shape) <= axis < len(shape):
            return [violation("qdq.axis", n, f"has axis {axis}, outside its rank-{len(shape)} input", hint)]
        channels = shape[axis]
        if scale.ndim != 1 or scale.shape[0] != channels:
            return [violation("qdq.axis", n, f"has a scale of shape {scale.shape} for {channels} channels on axis {axis}",
                       hint)]
        zp = const_array(qdq_zero_point(n))
        if zp is not None and zp.shape != scale.shape:
            return [violation("qdq.axis", n, f"has a zero point of shape {zp.shape} and a scale of shape {scale.shape}", hint)]
        return []

    def graph(self, model: ir.Model, opset: int) -> list[Violation]:
        """Rules on the whole graph (none by default)."""
        return []
