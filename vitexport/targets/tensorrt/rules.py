"""TensorRT's rules for a Q/DQ graph (explicit quantization), shared by the orin targets.

Rule ids: ``orin.int8`` (int8 with zero point 0), ``orin.per_channel`` (activations per tensor,
weights per output channel of their consumer), ``orin.float16_qdq`` (float16 scales or inputs need
opset 19), ``orin.qdq_pairs`` (each Q feeds one DQ, each activation DQ is fed by a Q),
``orin.dedicated_pairs`` (an activation DQ has one consumer), ``orin.float_consumer`` (no DQ into
ops TensorRT runs in float: LayerNorm, Softmax, GELU, residual Adds...), ``tensorrt.ops`` and
``tensorrt.opset`` (the operators and opsets of the target's TensorRT release's ONNX parser,
:mod:`.ops`).
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...check.contract import OP_HINTS, STANDARD_DOMAINS, all_nodes
from ...check.rules import FLOAT16_TYPES, RuntimeRules, qdq_scale, qdq_zero_point, violation
from ...check.violation import Violation, node_label
from ...graph.query import attr, const_array, is_const, static_shape
from .ops import TensorRTParser

__all__ = ["TensorRTRules"]


class TensorRTRules(RuntimeRules):
    """TensorRT explicit quantization (Jetson Orin), checked against one release's ONNX parser.

    Args:
        parser: the TensorRT release whose operators and opsets the graph must fit.
    """

    RULES = RuntimeRules.RULES + ("orin.int8", "orin.per_channel", "orin.float16_qdq", "orin.qdq_pairs",
                                 "orin.dedicated_pairs", "orin.float_consumer", "tensorrt.ops", "tensorrt.opset")
    #: ops TensorRT runs in float: a DQ feeding one quantizes a residual or breaks a fusion
    FLOAT_CONSUMERS = frozenset({"LayerNormalization", "Softmax", "Add", "Sub", "Mul", "Div", "Erf", "Gelu", "Pow",
                                 "Sqrt", "ReduceMean"})
    #: the axis of its weight along which each consumer's output channels lie
    _WEIGHT_AXIS = {"Conv": lambda n, rank: 0, "ConvTranspose": lambda n, rank: 1,
                    "Gemm": lambda n, rank: 0 if attr(n, "transB", 0) else 1, "MatMul": lambda n, rank: rank - 1}

    def __init__(self, parser: TensorRTParser):
        self.parser = parser

    def qdq(self, n: ir.Node, opset: int) -> list[Violation]:
        out = super().qdq(n, opset) + self._int8(n) + self._float16(n, opset)
        scale = qdq_scale(n)
        if scale is not None and scale.size > 1:
            out += self._per_channel(n)
        return out + self._pairs(n)

    def _int8(self, n: ir.Node) -> list[Violation]:
        hint = ("TensorRT takes symmetric int8 only: quantize with vitexport's orin target, or make the zero "
                "point an int8 0 and the scale amax/127")
        zp_value = qdq_zero_point(n)
        zp = const_array(zp_value)
        if zp_value is None and attr(n, "output_dtype", 0) == ir.DataType.INT8:
            return []  # opset 21: an int8 output type stands for an int8 zero point of 0
        if zp is None:
            return [violation("orin.int8", n, "has no constant zero point (ONNX then quantizes to uint8)", hint)]
        if zp.dtype != np.int8:
            return [violation("orin.int8", n, f"quantizes to {zp.dtype}, TensorRT needs int8", hint)]
        if np.any(zp != 0):
            return [violation("orin.int8", n, f"has zero point {zp.ravel()[np.flatnonzero(zp)[0]]}, TensorRT needs 0", hint)]
        return []

    def _float16(self, n: ir.Node, opset: int) -> list[Violation]:
        if opset >= 19:
            return []
        float_side = n.inputs[0] if n.op_type == "QuantizeLinear" else n.outputs[0]
        f16 = [v for v in (n.inputs[1], float_side) if v is not None and v.dtype in FLOAT16_TYPES]
        if not f16:
            return []
        return [violation("orin.float16_qdq", n, f"has float16 {'scale' if f16[0] is n.inputs[1] else 'data'} at opset {opset}; "
                   "float16 Q/DQ needs opset 19", "export at opset 19 or later (--set export.opset=19 with "
                   "contract.max_opset=19), or keep Q/DQ scales float32")]

    def _per_channel(self, n: ir.Node) -> list[Violation]:
        hint = ("TensorRT quantizes activations per tensor and weights per output channel: axis 0 of a Conv "
                "weight, the last axis of a MatMul weight, axis 0 of a transB Gemm weight")
        if not is_const(n.inputs[0]):
            return [violation("orin.per_channel", n, "has a per-channel scale on an activation", hint)]
        if n.op_type != "DequantizeLinear":
            return []
        shape = static_shape(n.inputs[0]) or ()
        axis = attr(n, "axis", 1)
        axis = axis + len(shape) if axis < 0 else axis
        out = []
        for use in n.outputs[0].uses():
            c, idx = use.node, use.idx
            rule = self._WEIGHT_AXIS.get(c.op_type)
            if rule is None or idx != 1:
                continue
            want = rule(c, len(shape))
            if axis != want:
                out.append(violation("orin.per_channel", n, f"has axis {axis}, but {node_label(c)} takes output channels on "
                              f"axis {want} of its weight", hint))
        return out

    def _pairs(self, n: ir.Node) -> list[Violation]:
        consumers = [u.node for u in n.outputs[0].uses()]
        if n.op_type == "QuantizeLinear":
            if len(consumers) != 1 or consumers[0].op_type != "DequantizeLinear":
                ops = ", ".join(sorted({c.op_type for c in consumers})) or "nothing"
                return [violation("orin.qdq_pairs", n, f"feeds {len(consumers)} consumer(s) ({ops}), not one DequantizeLinear",
                           "write one QuantizeLinear -> DequantizeLinear pair per quantized input (TensorRT fuses pairs)")]
            return []
        if is_const(n.inputs[0]):
            return []
        out = []
        producer = n.inputs[0].producer()
        if producer is None or producer.op_type != "QuantizeLinear":
            out.append(violation("orin.qdq_pairs", n, "dequantizes a tensor no QuantizeLinear produced",
                          "feed each activation DequantizeLinear from its own QuantizeLinear"))
        if len(consumers) != 1:
            out.append(violation("orin.dedicated_pairs", n, f"is shared by {len(consumers)} consumers",
                          "give each consumer its own Q/DQ pair: TensorRT fuses a pair into its one consumer"))
        out += [violation("orin.float_consumer", n, f"feeds {node_label(c)}, which TensorRT runs in float",
                   "keep LayerNorm, Softmax, GELU and residual Adds in float: remove the Q/DQ in front of it")
                for c in consumers if c.op_type in self.FLOAT_CONSUMERS]
        return out

    def graph(self, model: ir.Model, opset: int) -> list[Violation]:
        parser = self.parser
        out = []
        if not parser.min_opset <= opset <= parser.max_opset:
            out.append(Violation("tensorrt.opset", f"opset {opset}", f"is outside the opsets {parser.version}'s ONNX "
                                 f"parser reads ({parser.min_opset}-{parser.max_opset})",
                                 f"export at an opset in that range (--set export.opset={parser.max_opset})"))
        for n in all_nodes(model):
            if n.domain in STANDARD_DOMAINS and n.op_type not in parser.ops:
                hint = OP_HINTS.get(n.op_type) or (f"write {n.op_type} with operators {parser.version} parses in the "
                                                   "model, or give TensorRT a plugin for it")
                out.append(violation("tensorrt.ops", n, f"has no importer in {parser.version}'s ONNX parser", hint))
        return out
