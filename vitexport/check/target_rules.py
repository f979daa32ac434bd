"""What each target's runtime accepts in a graph, beyond the recipe's contract: Q/DQ encodings,
placements and, for TensorRT, the operators and opsets its ONNX parser imports.

One class per target kind (``TARGET_RULES``), each a list of rule ids and a method per kind of
check; the quantizer validates what it wrote with them (``QuantTarget.validate``), the export's
contract step and ``vitexport check`` run them after the contract.

- every target: ``qdq.scale`` (a finite, positive constant scale), ``qdq.axis`` (a per-channel
  scale names an axis of its input and has one entry per channel along it), ``qdq.integer_path``
  (nothing quantizes an integer tensor such as token ids or a shape), ``onnx.types`` (operand
  types its schema takes, :mod:`.types`);
- orin (TensorRT explicit quantization): ``orin.int8`` (int8 with zero point 0),
  ``orin.per_channel`` (activations per tensor, weights per output channel of their consumer),
  ``orin.float16_qdq`` (float16 scales or inputs need opset 19), ``orin.qdq_pairs`` (each Q feeds
  one DQ, each activation DQ is fed by a Q), ``orin.dedicated_pairs`` (an activation DQ has one
  consumer), ``orin.float_consumer`` (no DQ into ops TensorRT runs in float: LayerNorm, Softmax,
  GELU, residual Adds...), ``tensorrt.ops`` and ``tensorrt.opset`` (TensorRT 10.3's ONNX parser,
  or 8.6's when the recipe builds without strong typing);
- npu: ``npu.per_tensor`` (one scale per tensor), ``npu.float16`` (no float16 anywhere);
- cpu (ONNX Runtime): the common rules only.
"""
from __future__ import annotations

from typing import ClassVar, Iterable

import numpy as np
import onnx_ir as ir

from ..graph.query import attr, const_array, is_const, opset_version, static_shape
from ..recipe import QuantizationSpec, TargetKind
from .contract import OP_HINTS, STANDARD_DOMAINS, all_nodes, float16_violations
from .tensorrt_ops import tensorrt_parser
from .types import type_violations
from .violation import Violation, node_label

__all__ = ["TargetRules", "OrinRules", "NpuRules", "CpuRules", "TARGET_RULES", "target_rules"]

_QDQ = ("QuantizeLinear", "DequantizeLinear")
_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE)
_F16 = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


def _v(rule: str, n: ir.Node, problem: str, hint: str) -> Violation:
    return Violation(rule, node_label(n), problem, hint, n.name, n.op_type)


def _scale(n: ir.Node) -> np.ndarray | None:
    return const_array(n.inputs[1]) if len(n.inputs) > 1 else None


def _zero_point(n: ir.Node) -> ir.Value | None:
    return n.inputs[2] if len(n.inputs) > 2 else None


class TargetRules:
    """The rules every target shares. Subclasses add rule ids and override the hooks."""

    kind: ClassVar[TargetKind]
    RULES: ClassVar[tuple[str, ...]] = ("qdq.scale", "qdq.axis", "qdq.integer_path", "onnx.types")

    def __init__(self, spec: QuantizationSpec | None = None):
        self.spec = spec or QuantizationSpec()

    def violations(self, model: ir.Model, skip: Iterable[str] = ()) -> list[Violation]:
        """Every rule of this target the graph breaks, Q/DQ nodes in graph order, then graph-wide
        rules; ``skip`` names rules another check already ran (the recipe's float16 contract)."""
        opset = opset_version(model)
        out: list[Violation] = []
        for n in all_nodes(model):
            if n.op_type in _QDQ and n.domain in STANDARD_DOMAINS:
                out += self.qdq(n, opset)
        out += self.graph(model, opset) + type_violations(model)
        skip = set(skip)
        return [v for v in out if v.rule not in skip]

    def qdq(self, n: ir.Node, opset: int) -> list[Violation]:
        """The rules one QuantizeLinear / DequantizeLinear breaks."""
        out: list[Violation] = []
        scale = _scale(n)
        if scale is None or scale.size == 0 or not np.all(np.isfinite(scale)) or not np.all(scale > 0):
            bad = scale[~(np.isfinite(scale) & (scale > 0))] if scale is not None and scale.size else None
            what = "is not a constant" if bad is None else f"holds {bad.ravel()[0]}, not a finite positive number"
            out.append(_v("qdq.scale", n, f"scale {what}", "a scale must be a finite positive constant; a zero "
                          "range calibrates to scale 0: recalibrate on data that reaches the tensor"))
        elif scale.size > 1:
            out += self._axis(n, scale)
        x = n.inputs[0]
        if n.op_type == "QuantizeLinear" and x is not None and x.dtype is not None and x.dtype not in _FLOATS:
            out.append(_v("qdq.integer_path", n, f"quantizes '{x.name}', a {x.dtype.name.lower()} tensor",
                          "quantize float activations only; remove the Q/DQ from the integer (ids / shape) path"))
        return out

    def _axis(self, n: ir.Node, scale: np.ndarray) -> list[Violation]:
        shape = static_shape(n.inputs[0])
        if shape is None:
            return []
        axis = attr(n, "axis", 1)
        hint = "a per-channel scale has one entry per channel of the axis it names: fix 'axis' or the scale"
        if not -len(shape) <= axis < len(shape):
            return [_v("qdq.axis", n, f"has axis {axis}, outside its rank-{len(shape)} input", hint)]
        channels = shape[axis]
        if scale.ndim != 1 or scale.shape[0] != channels:
            return [_v("qdq.axis", n, f"has a scale of shape {scale.shape} for {channels} channels on axis {axis}",
                       hint)]
        zp = const_array(_zero_point(n))
        if zp is not None and zp.shape != scale.shape:
            return [_v("qdq.axis", n, f"has a zero point of shape {zp.shape} and a scale of shape {scale.shape}", hint)]
        return []

    def graph(self, model: ir.Model, opset: int) -> list[Violation]:
        """Rules on the whole graph (none by default)."""
        return []


class OrinRules(TargetRules):
    """TensorRT explicit quantization (Jetson Orin)."""

    kind = TargetKind.orin
    RULES = TargetRules.RULES + ("orin.int8", "orin.per_channel", "orin.float16_qdq", "orin.qdq_pairs",
                                 "orin.dedicated_pairs", "orin.float_consumer", "tensorrt.ops", "tensorrt.opset")
    #: ops TensorRT runs in float: a DQ feeding one quantizes a residual or breaks a fusion
    FLOAT_CONSUMERS = frozenset({"LayerNormalization", "Softmax", "Add", "Sub", "Mul", "Div", "Erf", "Gelu", "Pow",
                                 "Sqrt", "ReduceMean"})
    #: the axis of its weight along which each consumer's output channels lie
    _WEIGHT_AXIS = {"Conv": lambda n, rank: 0, "ConvTranspose": lambda n, rank: 1,
                    "Gemm": lambda n, rank: 0 if attr(n, "transB", 0) else 1, "MatMul": lambda n, rank: rank - 1}

    def qdq(self, n: ir.Node, opset: int) -> list[Violation]:
        out = super().qdq(n, opset) + self._int8(n) + self._float16(n, opset)
        scale = _scale(n)
        if scale is not None and scale.size > 1:
            out += self._per_channel(n)
        return out + self._pairs(n)

    def _int8(self, n: ir.Node) -> list[Violation]:
        hint = ("TensorRT takes symmetric int8 only: quantize with vitexport's orin target, or make the zero "
                "point an int8 0 and the scale amax/127")
        zp_value = _zero_point(n)
        zp = const_array(zp_value)
        if zp_value is None and attr(n, "output_dtype", 0) == ir.DataType.INT8:
            return []  # opset 21: an int8 output type stands for an int8 zero point of 0
        if zp is None:
            return [_v("orin.int8", n, "has no constant zero point (ONNX then quantizes to uint8)", hint)]
        if zp.dtype != np.int8:
            return [_v("orin.int8", n, f"quantizes to {zp.dtype}, TensorRT needs int8", hint)]
        if np.any(zp != 0):
            return [_v("orin.int8", n, f"has zero point {zp.ravel()[np.flatnonzero(zp)[0]]}, TensorRT needs 0", hint)]
        return []

    def _float16(self, n: ir.Node, opset: int) -> list[Violation]:
        if opset >= 19:
            return []
        float_side = n.inputs[0] if n.op_type == "QuantizeLinear" else n.outputs[0]
        f16 = [v for v in (n.inputs[1], float_side) if v is not None and v.dtype in _F16]
        if not f16:
            return []
        return [_v("orin.float16_qdq", n, f"has float16 {'scale' if f16[0] is n.inputs[1] else 'data'} at opset {opset}; "
                   "float16 Q/DQ needs opset 19", "export at opset 19 or later (--set export.opset=19 with "
                   "contract.max_opset=19), or keep Q/DQ scales float32")]

    def _per_channel(self, n: ir.Node) -> list[Violation]:
        hint = ("TensorRT quantizes activations per tensor and weights per output channel: axis 0 of a Conv "
                "weight, the last axis of a MatMul weight, axis 0 of a transB Gemm weight")
        if not is_const(n.inputs[0]):
            return [_v("orin.per_channel", n, "has a per-channel scale on an activation", hint)]
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
                out.append(_v("orin.per_channel", n, f"has axis {axis}, but {node_label(c)} takes output channels on "
                              f"axis {want} of its weight", hint))
        return out

    def _pairs(self, n: ir.Node) -> list[Violation]:
        consumers = [u.node for u in n.outputs[0].uses()]
        if n.op_type == "QuantizeLinear":
            if len(consumers) != 1 or consumers[0].op_type != "DequantizeLinear":
                ops = ", ".join(sorted({c.op_type for c in consumers})) or "nothing"
                return [_v("orin.qdq_pairs", n, f"feeds {len(consumers)} consumer(s) ({ops}), not one DequantizeLinear",
                           "write one QuantizeLinear -> DequantizeLinear pair per quantized input (TensorRT fuses pairs)")]
            return []
        if is_const(n.inputs[0]):
            return []
        out = []
        producer = n.inputs[0].producer()
        if producer is None or producer.op_type != "QuantizeLinear":
            out.append(_v("orin.qdq_pairs", n, "dequantizes a tensor no QuantizeLinear produced",
                          "feed each activation DequantizeLinear from its own QuantizeLinear"))
        if len(consumers) != 1:
            out.append(_v("orin.dedicated_pairs", n, f"is shared by {len(consumers)} consumers",
                          "give each consumer its own Q/DQ pair: TensorRT fuses a pair into its one consumer"))
        out += [_v("orin.float_consumer", n, f"feeds {node_label(c)}, which TensorRT runs in float",
                   "keep LayerNorm, Softmax, GELU and residual Adds in float: remove the Q/DQ in front of it")
                for c in consumers if c.op_type in self.FLOAT_CONSUMERS]
        return out

    def graph(self, model: ir.Model, opset: int) -> list[Violation]:
        parser = tensorrt_parser(self.spec.strongly_typed)
        out = []
        if not parser.min_opset <= opset <= parser.max_opset:
            out.append(Violation("tensorrt.opset", f"opset {opset}", f"is outside the opsets {parser.version}'s ONNX "
                                 f"parser reads ({parser.min_opset}-{parser.max_opset})",
                                 f"export at an opset in that range (--set export.opset={parser.max_opset})"))
        for n in all_nodes(model):
            if n.domain in STANDARD_DOMAINS and n.op_type not in parser.ops:
                hint = OP_HINTS.get(n.op_type) or (f"write {n.op_type} with operators {parser.version} parses in the "
                                                   "model, or give TensorRT a plugin for it")
                out.append(_v("tensorrt.ops", n, f"has no importer in {parser.version}'s ONNX parser", hint))
        return out


class NpuRules(TargetRules):
    """A generic edge NPU: one scale per tensor, no float16 anywhere."""

    kind = TargetKind.npu
    RULES = TargetRules.RULES + ("npu.per_tensor", "npu.float16")

    def qdq(self, n: ir.Node, opset: int) -> list[Violation]:
        out = super().qdq(n, opset)
        scale = _scale(n)
        if scale is not None and scale.size > 1:
            out.append(_v("npu.per_tensor", n, f"has {scale.size} scales (per channel); the NPU takes one per tensor",
                          "quantize per tensor (--set quantization.per_channel_weights=false, as npu.yaml does)"))
        return out

    def graph(self, model: ir.Model, opset: int) -> list[Violation]:
        return float16_violations(model, "npu.float16")


class CpuRules(TargetRules):
    """ONNX Runtime on x86: it runs any valid Q/DQ; the common rules only."""

    kind = TargetKind.cpu


TARGET_RULES: dict[TargetKind, type[TargetRules]] = {}
for _cls in (OrinRules, NpuRules, CpuRules):
    if _cls.kind in TARGET_RULES:  # pragma: no cover - the registry refuses duplicates
        raise RuntimeError(f"duplicate target rules for {_cls.kind}")
    TARGET_RULES[_cls.kind] = _cls


def target_rules(kind: TargetKind | str, spec: QuantizationSpec | None = None) -> TargetRules:
    """The rules of target ``kind`` (``spec.strongly_typed`` picks orin's TensorRT parser)."""
    return TARGET_RULES[TargetKind(kind)](spec)
