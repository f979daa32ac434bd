"""FP16 islands: the float parts of an Orin Q/DQ graph in float16, FP32 where ranges demand it.

TensorRT 10 builds Q/DQ models *strongly typed*: every tensor runs in the type the file gives it, so
a Q/DQ model whose float parts are FP32 runs LayerNorm, Softmax, GELU and the residual Adds in FP32
on the Orin GPU — INT8 that does not pay against a plain FP16 engine. ModelOpt's ONNX INT8 default
writes those parts in FP16; so does this pass, with evidence for the exceptions:

- a tensor whose calibrated magnitude, times a safety margin, passes FP16's 65504 keeps its producer
  and every reader in FP32 (huge activations, unscaled attention scores), and so does one whose
  largest value is below FP16's smallest normal number (6.1e-5: every value a subnormal or 0);
- a LayerNorm whose input reaches ``sqrt(65504 / margin)`` stays FP32: its variance (a mean of
  squares) would overflow if TensorRT computed it in half precision;
- a constant that FP16 cannot hold (too large, or a non-zero scalar that underflows to 0, such as
  an epsilon of 1e-12) keeps its reader in FP32 — except a mask fill (``mask_to_where`` writes
  ``where(keep, logits, finfo.min)``), which becomes float16's own minimum: the same meaning, and the
  logits it replaces, not the fill, are what the safe range is checked on.

Model inputs and outputs keep their types (a ``Cast`` at each FP16 boundary, one per tensor and
type). Q/DQ follow their float side: a ``DequantizeLinear`` read by an FP16 node has an FP16 scale
and produces FP16, a ``QuantizeLinear`` takes its input in whatever type it comes; float16 scales
need opset 19 (:func:`to_opset`).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import onnx
import onnx.version_converter
import onnx_ir as ir

from ..check.types import allowed_types, type_violations
from ..graph.macs import MAC_OPS, node_macs
from ..graph.passes import GraphPass, GraphPassReport
from ..graph.query import attr, const_array, opset_version, set_dtype, static_shape
from ..graph.weights import through_proto

__all__ = ["FP16_MAX", "FP16_MIN_SCALE", "Float16Islands", "legal_fp16_scales", "to_opset", "precision_summary", "weight_bytes",
           "reads_int8"]

FP16_MAX = 65504.0
_FP16_TINY = 6.0e-8  # smallest positive float16 (subnormal)
_FP16_NORMAL = float(2.0**-14)  # smallest normal float16: below it a value keeps fewer than 10 bits
#: the least Q/DQ scale written in float16: its smallest positive (subnormal) value, 2**-24. Below
#: it a scale is 0, which TensorRT refuses (an all-zero weight channel calibrates to a scale of 0).
#: Subnormal scales are kept (TensorRT warns and keeps them): a random-weight EfficientViT has many
#: channels with scales under float16's smallest normal 2**-14, and raising them there drops its
#: INT8 cosine from 0.9997 to 0.96
FP16_MIN_SCALE = float(2.0**-24)
_QDQ = ("QuantizeLinear", "DequantizeLinear")
_F32, _F16 = ir.DataType.FLOAT, ir.DataType.FLOAT16


def to_opset(model: ir.Model, version: int) -> ir.Model:
    """``model`` converted to the default-domain ``version`` (onnx's version converter, weights lifted out)."""
    if opset_version(model) >= version:
        return model
    return through_proto(model, lambda p: onnx.version_converter.convert_version(p, version),
                         lift=lambda v: v.const_value is not None and v.const_value.nbytes >= (16 << 10))


def _is_float(v: ir.Value | None) -> bool:
    return v is not None and v.dtype == _F32


def _is_mask_fill(v: ir.Value | None) -> bool:
    """A constant of nothing but the float32 minimum or -inf: what masked logits are filled with."""
    c = const_array(v) if v is not None else None
    return c is not None and c.size > 0 and c.dtype == np.float32 and bool(
        np.all((c == np.finfo(np.float32).min) | np.isneginf(c)))


def _takes_half(n: ir.Node, j: int, opset: int, output: bool = False) -> bool:
    """Whether operand ``j`` of ``n`` may be float16 (its schema says so; unknown ops: yes)."""
    allowed = allowed_types(n, j, opset, output)
    return allowed is None or "tensor(float16)" in allowed[1]


def _to_fp16(arr: np.ndarray) -> np.ndarray:
    """float16 values; a mask fill (float32's minimum) becomes float16's minimum, not -inf."""
    with np.errstate(over="ignore"):  # the fill overflows float16 by design; it is replaced just below
        out = arr.astype(np.float16)
    out[arr == np.finfo(np.float32).min] = np.finfo(np.float16).min
    return out


class Float16Islands(GraphPass):
    """Convert a (Q/DQ) float32 graph to float16 outside the FP32 islands its ranges call for.

    Args:
        absmax: tensor → largest |value| seen on calibration data (the evidence for FP32 islands).
        margin: headroom factor against FP16's range.
    """

    name = "float16_islands"

    def __init__(self, absmax: Mapping[str, float], margin: float = 4.0):
        super().__init__()
        self.absmax, self.margin = absmax, margin
        self.raised = 0  # scales raised to FP16_MIN_SCALE by the last run

    def requires(self, model: ir.Model) -> None:
        if opset_version(model) < 19:
            raise ValueError("float16 Q/DQ scales need opset 19 (convert with to_opset first)")

    # --- which nodes stay FP32 -------------------------------------------------------------------
    def _amax(self, v: ir.Value) -> float:
        """The range that matters: a masked ``Where``'s is that of the logits it keeps, not of its fill."""
        p = v.producer()
        if p is not None and p.op_type == "Where" and any(_is_mask_fill(i) for i in p.inputs[1:]):
            return max((self._amax(i) for i in p.inputs[1:] if i is not None and not _is_mask_fill(i)), default=0.0)
        return self.absmax.get(v.name, 0.0)

    def _unsafe(self, v: ir.Value | None) -> bool:
        """Beyond FP16: too large (overflow with the margin), or so small that even its largest value
        is a float16 subnormal (a random-weight LeViT's outputs are about 1e-8: 0 in FP16). A tensor
        that is 0 throughout is exact in FP16."""
        if v is None:
            return False
        amax = self._amax(v)
        return amax * self.margin > FP16_MAX or 0.0 < amax < _FP16_NORMAL

    def _const_unsafe(self, v: ir.Value | None) -> bool:
        c = const_array(v) if v is not None and v.dtype == _F32 else None
        if c is None or c.size == 0 or _is_mask_fill(v):
            return False
        c = c[np.isfinite(c)]
        if c.size == 0:
            return False
        big = float(np.abs(c).max()) * self.margin > FP16_MAX
        tiny = c.size == 1 and 0 < abs(float(c.reshape(-1)[0])) < _FP16_TINY
        return big or tiny

    def fp32_nodes(self, model: ir.Model) -> dict[str, str]:
        """Node name → why it stays FP32."""
        keep: dict[str, str] = {}
        ln_max = float(np.sqrt(FP16_MAX / self.margin))
        for n in model.graph:
            if n.op_type in _QDQ:
                continue
            if n.op_type == "LayerNormalization" and self._amax(n.inputs[0]) > ln_max:
                keep[n.name] = f"LayerNorm input reaches {self._amax(n.inputs[0]):.4g} (> {ln_max:.0f}: its variance overflows FP16)"
            elif any(self._unsafe(o) for o in n.outputs if _is_float(o)):
                keep[n.name] = "produces a tensor beyond FP16's safe range"
            elif any(self._unsafe(i) for i in n.inputs if _is_float(i) and i.const_value is None):
                keep[n.name] = "reads a tensor beyond FP16's safe range"
            elif any(self._const_unsafe(i) for i in n.inputs) or any(self._const_unsafe(o) for o in n.outputs):
                # a Constant node too: in FP16 its 1e9 would be inf and its 1e-9 would be 0 before any Cast
                keep[n.name] = "holds a constant FP16 cannot represent"
        return keep

    # --- rewrite ---------------------------------------------------------------------------------
    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        self.raised = legal_fp16_scales(model)
        if self.raised:
            report.notes.append(f"{self.raised} Q/DQ scale(s) below float16's smallest value raised to "
                                f"{FP16_MIN_SCALE:.3g} (dead or near-dead channels, tiny ranges)")
        keep = self.fp32_nodes(model)
        report.skipped.update(keep)
        graph = model.graph
        half = {n.name for n in graph if n.op_type not in _QDQ and n.name not in keep}
        dq_half = {n.name for n in graph if n.op_type == "DequantizeLinear"
                   and n.outputs[0].uses() and all(u.node.name in half for u in n.outputs[0].uses())}
        casts: dict[tuple[str, ir.DataType], ir.Value] = {}
        consts: dict[tuple[str, ir.DataType], ir.Value] = {}
        opset = opset_version(model)
        for n in list(graph):
            if n.name in half:
                self._to_half(n, graph, casts, consts, opset)
                report.changed += 1
            elif n.op_type == "DequantizeLinear":
                self._typed(n, 1, _F16 if n.name in dq_half else _F32, graph, casts, consts)
                set_dtype(n.outputs[0], _F16 if n.name in dq_half else _F32)
            elif n.op_type == "QuantizeLinear":
                self._typed(n, 1, n.inputs[0].dtype, graph, casts, consts)
            else:  # an FP32 island: FP16 inputs come back to FP32
                for j, v in enumerate(n.inputs):
                    if v is not None and v.dtype == _F16:
                        n.replace_input_with(j, self._cast(v, _F32, graph, casts))
        self._outputs_keep_types(graph)
        report.notes.append(f"{report.changed} node(s) in FP16, {len(keep)} kept in FP32")
        broken = type_violations(model)
        if broken:  # a bug here, named by the rule it broke rather than by ONNX Runtime's INVALID_GRAPH
            raise RuntimeError(f"{self.name} broke operator types: {'; '.join(map(str, broken[:3]))}")

    def _to_half(self, n: ir.Node, graph: ir.Graph, casts, consts, opset: int) -> None:
        # operands whose schema takes no float16 keep float32 (Resize's scales, Upsample's scales)
        for j, v in enumerate(n.inputs):
            if v is None:
                continue
            if _takes_half(n, j, opset):
                if _is_float(v):
                    self._typed(n, j, _F16, graph, casts, consts)
            elif v.dtype == _F16:  # made float16 by its producer (a Constant gone half): back to float32
                self._typed(n, j, _F32, graph, casts, consts)
        if n.op_type == "Cast" and n.attributes["to"].value == int(_F32):
            n.attributes["to"] = ir.AttrInt64("to", int(_F16))
        for key in ("value",):  # Constant / ConstantOfShape holding a float tensor
            a = n.attributes.get(key)
            if a is not None and a.type == ir.AttributeType.TENSOR and a.value.dtype == _F32:
                n.attributes[key] = ir.AttrTensor(key, ir.tensor(_to_fp16(a.value.numpy()), name=a.value.name))
        for j, o in enumerate(n.outputs):
            if o.dtype == _F32 and _takes_half(n, j, opset, output=True):
                set_dtype(o, _F16)

    def _typed(self, n: ir.Node, j: int, dtype: ir.DataType, graph: ir.Graph, casts, consts) -> None:
        """Make input ``j`` of ``n`` a ``dtype`` value: a converted constant, or a Cast."""
        v = n.inputs[j]
        if v is None or v.dtype == dtype or v.dtype not in (_F32, _F16):
            return
        if v.const_value is not None:
            key = (v.name, dtype)
            if key not in consts:
                name = v.name if not v.uses() or len(v.uses()) == 1 else f"{v.name}_{dtype.name.lower()}"
                arr = _to_fp16(v.const_value.numpy()) if dtype == _F16 else v.const_value.numpy().astype(np.float32)
                if name == v.name:
                    v.const_value = ir.tensor(arr, name=name)
                    set_dtype(v, dtype)
                    consts[key] = v
                else:
                    nv = ir.Value(name=name, const_value=ir.tensor(arr, name=name), shape=v.shape, type=ir.TensorType(dtype))
                    graph.register_initializer(nv)
                    consts[key] = nv
            n.replace_input_with(j, consts[key])
            return
        n.replace_input_with(j, self._cast(v, dtype, graph, casts))

    @staticmethod
    def _cast(v: ir.Value, dtype: ir.DataType, graph: ir.Graph, casts) -> ir.Value:
        key = (v.name, dtype)
        if key not in casts:
            c = ir.node("Cast", [v], {"to": int(dtype)}, name=f"{v.name}_to_{dtype.name.lower()}")
            out = c.outputs[0]
            out.name, out.shape = f"{v.name}_{dtype.name.lower()}", v.shape
            set_dtype(out, dtype)
            producer = v.producer()
            if producer is None:
                graph.insert_before(next(iter(graph)), [c])
            else:
                graph.insert_after(producer, [c])
            casts[key] = out
        return casts[key]

    @staticmethod
    def _outputs_keep_types(graph: ir.Graph) -> None:
        """A graph output computed in FP16 gets a final Cast back to FP32, under its own name."""
        for i, v in enumerate(list(graph.outputs)):
            if v.dtype != _F16:
                continue
            name = v.name
            v.name = f"{name}_fp16"
            c = ir.node("Cast", [v], {"to": int(_F32)}, name=f"{name}_to_float")
            c.outputs[0].name, c.outputs[0].shape = name, v.shape
            set_dtype(c.outputs[0], _F32)
            graph.insert_after(v.producer(), [c])
            graph.outputs[i] = c.outputs[0]


def _fp16_scale(scale: np.ndarray) -> np.ndarray:
    """Each scale as the float16 value it will be stored as, never below :data:`FP16_MIN_SCALE`,
    rounded up (so a weight's largest integer never grows past its range)."""
    s = np.maximum(scale.astype(np.float32), np.float32(FP16_MIN_SCALE))
    big = s > FP16_MAX  # a tensor beyond float16 itself: its Q/DQ stay in an FP32 island, as they are
    half = np.where(big, 1.0, s).astype(np.float16)
    low = half.astype(np.float32) < np.where(big, 1.0, s)
    half[low] = np.nextafter(half[low], np.float16(np.inf))
    return np.where(big, s, half.astype(np.float32)).astype(np.float32)


def _requantized(q: np.ndarray, old: np.ndarray, new: np.ndarray, axis: int | None) -> np.ndarray:
    """Integer weights ``q`` (dequantized with ``old``) re-rounded for the scale ``new`` (>= old)."""
    shape = [1] * q.ndim
    if axis is not None and old.ndim == 1 and old.size > 1:
        shape[axis % q.ndim] = -1
    w = q.astype(np.float32) * old.reshape(shape)
    info = np.iinfo(q.dtype)
    return np.clip(np.round(w / new.reshape(shape)), info.min, info.max).astype(q.dtype)


def legal_fp16_scales(model: ir.Model) -> int:
    """Give every Q/DQ scale a value float16 holds exactly and that is a normal number; the integer
    weights a changed scale dequantizes are re-rounded for it. Scales are replaced (new tensors),
    never edited: conversions of one float model share their weight tensors.

    Returns:
        How many scale entries changed by more than float16 rounding (raised to the minimum).
    """
    raised = 0
    done: set[str] = set()
    for n in model.graph:
        if n.op_type not in _QDQ or len(n.inputs) < 2 or n.inputs[1] is None or n.inputs[1].const_value is None:
            continue
        sv = n.inputs[1]
        if sv.name in done or sv.dtype != _F32:
            continue
        done.add(sv.name)
        old = sv.const_value.numpy()
        new = _fp16_scale(old)
        if np.array_equal(new, old):
            continue
        raised += int(np.count_nonzero(old < FP16_MIN_SCALE))
        sv.const_value = ir.tensor(new.reshape(old.shape), name=sv.name)
        x = n.inputs[0]
        if n.op_type == "DequantizeLinear" and x is not None and x.const_value is not None:
            q = x.const_value.numpy()
            x.const_value = ir.tensor(_requantized(q, old, new, attr(n, "axis", 1)), name=x.name)
    return raised


def weight_bytes(model: ir.Model) -> dict[str, int]:
    """Bytes of the file's constant tensors (initializers and Constant nodes) by data type
    (``{"INT8": ..., "FLOAT16": ..., "INT32": ...}``): what the file's size is made of."""
    out: dict[str, int] = {}
    consts = [*model.graph.initializers.values(),
              *(n.outputs[0] for n in model.graph if n.op_type == "Constant" and n.outputs[0].const_value is not None)]
    seen: set[str] = set()
    for v in consts:
        t = v.const_value
        if t is None or v.name in seen:
            continue
        seen.add(v.name)
        out[t.dtype.name] = out.get(t.dtype.name, 0) + int(t.nbytes)
    return out


def reads_int8(n: ir.Node) -> bool:
    """Whether a GEMM/Conv reads both its activation and its weight through DequantizeLinear (runs INT8
    where the runtime honours the file's Q/DQ)."""
    return all(i is not None and i.producer() is not None and i.producer().op_type == "DequantizeLinear"
               for i in n.inputs[:2])


def precision_summary(model: ir.Model) -> dict[str, Any]:
    """What the engine will run, from the file alone: the INT8 share of GEMM/Conv multiply-accumulates,
    the bytes of FP16 and FP32 tensors (weights and every activation of one run, summed: not a memory
    peak), the weights' bytes by data type (:func:`weight_bytes`) and the GEMM/Conv nodes without Q/DQ
    inputs (``float_gemms``: node, op, MACs, largest first)."""
    int8_macs = float_macs = 0
    float_gemms = []
    for n in model.graph:
        if n.op_type not in MAC_OPS:
            continue
        macs = node_macs(n)  # the plan's formula: groups and Gemm's transB counted as annotate counts them
        quantized = reads_int8(n)
        int8_macs, float_macs = (int8_macs + macs, float_macs) if quantized else (int8_macs, float_macs + macs)
        if not quantized:
            float_gemms.append({"node": n.name, "op": n.op_type, "macs": macs})
    sizes = {_F16: 0, _F32: 0}
    seen: set[str] = set()
    values = [*model.graph.initializers.values(), *(o for n in model.graph for o in n.outputs)]
    for v in values:
        shape = static_shape(v)
        if v.dtype in sizes and shape is not None and v.name not in seen:
            seen.add(v.name)
            sizes[v.dtype] += int(np.prod(shape)) * (2 if v.dtype == _F16 else 4)
    total = int8_macs + float_macs
    return {"int8_gemm_macs_share": int8_macs / total if total else 0.0, "int8_gemm_macs": int8_macs,
            "float_gemm_macs": float_macs, "fp16_bytes": sizes[_F16], "fp32_bytes": sizes[_F32],
            "weight_bytes": weight_bytes(model), "float_gemms": sorted(float_gemms, key=lambda f: -f["macs"])}
