"""Convert: a float graph, a plan and calibrated ranges become a Q/DQ graph (an onnx-ir pass).

Activations get ``QuantizeLinear → DequantizeLinear`` in front of each quantized input (one pair per
consumer when the plan's encoding wants dedicated pairs, else one per tensor). Weights are stored as
int8 initializers followed by a ``DequantizeLinear`` (with ``axis`` when per channel). Names are
derived from tensor and node names only, so identical inputs give identical bytes.

The conversion works on a clone of the float model (onnx-ir clones share tensor data), so one float
model can be converted under several plans — the fallback's candidates — without copying weights;
quantized weights are cached across conversions in a :class:`WeightCache`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import onnx_ir as ir

from ..graph.query import const_array, opset_version
from .spec import ActSpec, NodeKind, NodeSpec, QuantPlan, WeightSpec

__all__ = ["ActParams", "act_params", "quantize_weight", "WeightCache", "QdqStats", "convert", "INT8_MAX", "MIN_SCALE"]

INT8_MAX = 127
#: the least float32 scale written (a dead weight channel gets it: any positive scale is exact there)
MIN_SCALE = 1e-8


@dataclass(frozen=True)
class ActParams:
    scale: float
    zero_point: int
    signed: bool  # int8 (True) or uint8


def act_params(rng: Mapping[str, float], symmetric: bool, qmax: int = INT8_MAX) -> ActParams:
    """int8 symmetric (``amax / qmax``, zero point 0) or uint8 asymmetric parameters from a range."""
    if symmetric:
        return ActParams(max(float(rng["amax"]) / qmax, MIN_SCALE), 0, True)
    lo, hi = min(float(rng["lo"]), 0.0), max(float(rng["hi"]), 0.0)
    scale = max((hi - lo) / 255.0, MIN_SCALE)
    zp = int(np.clip(np.round(-lo / scale), 0, 255))
    return ActParams(scale, zp, False)


def quantize_weight(w: np.ndarray, axis: int | None, qmax: int = INT8_MAX) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 (−qmax..qmax) weights and their float32 scale (per channel along ``axis``)."""
    w = np.asarray(w, dtype=np.float32)
    if axis is None:
        amax = np.asarray(np.abs(w).max() if w.size else 0.0, dtype=np.float32)
        scale = np.maximum(amax / qmax, MIN_SCALE).astype(np.float32)
        return np.clip(np.round(w / scale), -qmax, qmax).astype(np.int8), scale.reshape(())
    red = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.abs(w).max(axis=red) if w.size else np.zeros(w.shape[axis], np.float32)
    scale = np.maximum(amax / qmax, MIN_SCALE).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    return np.clip(np.round(w / scale.reshape(shape)), -qmax, qmax).astype(np.int8), scale


def _dead_channels(w: np.ndarray, axis: int | None) -> int:
    """Output channels of ``w`` (along ``axis``; the whole tensor when per tensor) that are all zero."""
    if w.size == 0:
        return 0
    if axis is None:
        return int(not np.any(w))
    red = tuple(i for i in range(w.ndim) if i != axis)
    return int(np.count_nonzero(~np.any(w, axis=red)))


@dataclass
class WeightCache:
    """Quantized weights by (initializer, axis, qmax): shared by every conversion of one float model.

    ``overrides`` holds integer weights chosen by a rounding optimiser (name → (q, scale)) that
    replace plain round-to-nearest for that initializer; ``bias`` the bias correction of each Linear
    node (the mean INT8 output error its float bias absorbs), applied while the node is quantized.
    """

    entries: dict[tuple[str, int | None, int], tuple[ir.Tensor, ir.Tensor, ir.Tensor]] = field(default_factory=dict)
    overrides: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    bias: Mapping[str, list[float]] = field(default_factory=dict)

    def get(self, stem: str, w: np.ndarray, axis: int | None, qmax: int) -> tuple[ir.Tensor, ir.Tensor, ir.Tensor]:
        key = (stem, axis, qmax)
        if key not in self.entries:
            q, scale = self.overrides.get(stem) or quantize_weight(w, axis, qmax)
            self.entries[key] = (ir.tensor(q, name=f"{stem}_quantized"), ir.tensor(scale, name=f"{stem}_scale"),
                                 ir.tensor(np.zeros(scale.shape, np.int8), name=f"{stem}_zero_point"))
        return self.entries[key]


@dataclass
class QdqStats:
    quantized_nodes: int = 0
    qdq_pairs: int = 0
    weights: int = 0
    #: weight output channels that are all zero (a zero-initialised head, BatchNorm γ = 0 folded into
    #: a conv): any positive scale quantizes them exactly; they get the least one
    dead_channels: int = 0


class _Writer:
    """Inserts the Q/DQ of one plan into one (cloned) graph."""

    def __init__(self, model: ir.Model, plan: QuantPlan, ranges: Mapping[str, Mapping[str, float]], cache: WeightCache):
        self.graph, self.enc, self.ranges, self.cache = model.graph, plan.encoding, ranges, cache
        self.per_channel_ok = opset_version(model) >= 13
        self.values = ir.convenience.create_value_mapping(model.graph)
        self.acts: dict[str, tuple[ActParams, ir.Value, ir.Value]] = {}
        # attention's MatMuls where the encoding says so: inputs int8 where two-sided (q, k, v; probabilities stay
        # uint8). The second operand (k, v) is the integer kernel's signed side: int8 within the weights' range,
        # 7-bit where the CPU's u8 x s8 pairwise sums saturate at 8 bits, as a weight's (8-bit v saturated too: a
        # Conditional DETR's plugin cosine 0.971 against its Q/DQ file's 0.9985)
        attn = [n for n in plan.nodes if n.kind == NodeKind.attention] if plan.encoding.symmetric_attention else []
        self.attention_inputs = {a.tensor for n in attn for a in n.acts}
        self.second_operands = {b.tensor for n in attn for b in n.acts if b.index == 1}
        self.shared: dict[str, ir.Value] = {}
        self.weights: dict[tuple[str, int | None], tuple[ir.Value, np.ndarray]] = {}
        self.stats = QdqStats()

    def const(self, name: str, tensor: ir.Tensor | np.ndarray) -> ir.Value:
        if name in self.graph.initializers:
            return self.graph.initializers[name]
        t = tensor if isinstance(tensor, ir.Tensor) else ir.tensor(tensor, name=name)
        v = ir.Value(name=name, const_value=t, shape=ir.Shape(t.shape), type=ir.TensorType(t.dtype))
        self.graph.register_initializer(v)
        return v

    def _two_sided(self, tensor: str) -> bool:
        return float(self.ranges[tensor]["lo"]) < 0.0

    def act(self, tensor: str) -> tuple[ActParams, ir.Value, ir.Value]:
        if tensor not in self.acts:
            rng = self.ranges[tensor]
            if tensor in self.second_operands:
                p = act_params(rng, True, self.enc.weight_qmax)
            else:
                p = act_params(rng, self.enc.symmetric or (tensor in self.attention_inputs and self._two_sided(tensor)))
            zp = np.asarray(p.zero_point, np.int8 if p.signed else np.uint8)
            self.acts[tensor] = (p, self.const(f"{tensor}_scale", np.asarray(p.scale, np.float32)),
                                 self.const(f"{tensor}_zero_point", zp))
        return self.acts[tensor]

    def pair(self, node: ir.Node, a: ActSpec) -> ir.Value:
        """The dequantized value that replaces input ``a`` of ``node`` (a new or a shared pair)."""
        if not self.enc.dedicated_pairs and a.tensor in self.shared:
            return self.shared[a.tensor]
        p, scale, zp = self.act(a.tensor)
        stem = f"{node.name}_in{a.index}" if self.enc.dedicated_pairs else a.tensor
        x = self.values[a.tensor]
        q = ir.node("QuantizeLinear", [x, scale, zp], name=f"{stem}_QuantizeLinear")
        q.outputs[0].name = f"{stem}_quantized"
        q.outputs[0].dtype = ir.DataType.INT8 if p.signed else ir.DataType.UINT8
        dq = ir.node("DequantizeLinear", [q.outputs[0], scale, zp], name=f"{stem}_DequantizeLinear")
        dq.outputs[0].name = f"{stem}_dequantized"
        dq.outputs[0].dtype = ir.DataType.FLOAT
        q.outputs[0].shape = dq.outputs[0].shape = x.shape
        self.graph.insert_before(node, [q, dq])
        self.stats.qdq_pairs += 1
        if not self.enc.dedicated_pairs:
            self.shared[a.tensor] = dq.outputs[0]
        return dq.outputs[0]

    def weight(self, node: ir.Node, w: WeightSpec) -> tuple[ir.Value, np.ndarray]:
        axis = w.axis if self.per_channel_ok else None
        key = (w.initializer, axis)
        if key not in self.weights:
            stems = {k[0] for k in self.weights}
            stem = w.initializer if w.initializer not in stems else f"{w.initializer}_axis{axis}"
            arr = const_array(self.values[w.initializer])
            q, scale, zp = self.cache.get(stem, arr, axis, self.enc.weight_qmax)
            self.stats.dead_channels += _dead_channels(arr, axis)
            qv, sv, zv = (self.const(t.name, t) for t in (q, scale, zp))
            attrs = {"axis": axis} if axis is not None else {}
            dq = ir.node("DequantizeLinear", [qv, sv, zv], attrs, name=f"{stem}_DequantizeLinear")
            dq.outputs[0].name = f"{stem}_dequantized"
            dq.outputs[0].dtype = ir.DataType.FLOAT
            dq.outputs[0].shape = ir.Shape(arr.shape)
            self.graph.insert_before(node, [dq])
            self.weights[key] = (dq.outputs[0], scale.numpy())
            self.stats.weights += 1
        return self.weights[key]

    def bias(self, node: ir.Node, spec: NodeSpec, w_scale: np.ndarray) -> None:
        """int32 bias (zero point 0, scale = activation scale × weight scale) for ONNX Runtime's QGemm."""
        b = const_array(node.inputs[2]) if len(node.inputs) > 2 else None
        if b is None or b.dtype != np.float32 or len(spec.acts) != 1:
            return
        b = b.reshape(-1)
        scale = (np.float32(self.acts[spec.acts[0].tensor][0].scale) * np.asarray(w_scale, np.float32)).astype(np.float32)
        scale = np.maximum(np.broadcast_to(scale, b.shape), MIN_SCALE).astype(np.float32)
        qb = np.clip(np.round(b / scale), -(2**31) + 1, 2**31 - 1).astype(np.int32)
        stem = f"{node.name}_bias"
        dq = ir.node("DequantizeLinear", [self.const(f"{stem}_quantized", qb), self.const(f"{stem}_scale", scale),
                                          self.const(f"{stem}_zero_point", np.zeros(b.shape, np.int32))],
                     {"axis": 0}, name=f"{stem}_DequantizeLinear")
        dq.outputs[0].name = f"{stem}_dequantized"
        self.graph.insert_before(node, [dq])
        node.replace_input_with(2, dq.outputs[0])

    def correct_bias(self, node: ir.Node) -> None:
        """Subtract the node's bias correction from its float bias (a Gemm's or a Conv's, or the Add
        after a MatMul); a Linear without a bias keeps its error (nothing to fold it into)."""
        delta = self.cache.bias.get(node.name)
        if delta is None:
            return
        delta = np.asarray(delta, np.float32)
        has_bias = node.op_type in ("Gemm", "Conv") and len(node.inputs) > 2 and node.inputs[2] is not None
        target = (node, 2) if has_bias else None
        if target is None and node.op_type == "MatMul":
            uses = node.outputs[0].uses()
            add = uses[0].node if len(uses) == 1 and uses[0].node.op_type == "Add" else None
            if add is not None:
                j = 1 - uses[0].idx
                b = const_array(add.inputs[j])
                target = (add, j) if b is not None and b.size == delta.size else None
        if target is None:
            return
        owner, j = target
        b = const_array(owner.inputs[j])
        owner.replace_input_with(j, self.const(f"{node.name}_bias_corrected", (b.astype(np.float32) - delta.reshape(b.shape))))

    def rewrite(self, node: ir.Node, spec: NodeSpec) -> None:
        self.correct_bias(node)
        for a in spec.acts:
            node.replace_input_with(a.index, self.pair(node, a))
        if spec.weight is not None:
            dq, w_scale = self.weight(node, spec.weight)
            node.replace_input_with(spec.weight.index, dq)
            if self.enc.int32_bias and node.op_type in ("Gemm", "Conv"):
                self.bias(node, spec, w_scale)
        self.stats.quantized_nodes += 1

    def drop_unused(self) -> None:
        """Float initializers no node reads any more (replaced weights) leave the graph."""
        outputs = set(self.graph.outputs)
        for name, v in list(self.graph.initializers.items()):
            if not v.uses() and v not in outputs and not v.is_graph_input():
                self.graph.initializers.pop(name)


def convert(model: ir.Model, plan: QuantPlan, ranges: Mapping[str, Mapping[str, float]],
            cache: WeightCache | None = None) -> tuple[ir.Model, QdqStats]:
    """A new Q/DQ model (a clone sharing the float tensors); ``model`` is left untouched.

    Args:
        model: the float model (after smoothing, if any).
        plan: the target's plan (nodes kept in float are simply absent from it).
        ranges: tensor → {amax, lo, hi} from the scale table.
        cache: quantized weights to reuse across conversions of the same float model.
    Raises:
        KeyError: a planned tensor has no calibrated range.
    """
    out = model.clone()
    writer = _Writer(out, plan, ranges, cache if cache is not None else WeightCache())
    by_name = {n.name: n for n in out.graph}
    for spec in plan.nodes:
        writer.rewrite(by_name[spec.node], spec)
    writer.drop_unused()
    return out, writer.stats


