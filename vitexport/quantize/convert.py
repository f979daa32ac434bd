"""Write Q/DQ: the conversion step that turns a float graph, a plan and calibrated ranges into a
QDQ model.

Activations get ``QuantizeLinear → DequantizeLinear`` in front of each quantized input (one pair
per consumer when the target wants dedicated pairs, else one per tensor). Weights are stored as
int8 initializers followed by a ``DequantizeLinear`` (with ``axis`` when per channel). Names are
derived from tensor and node names only, so identical inputs give identical bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..calibration.session import materialize
from .graph import GraphIndex
from .targets import QuantPlan

__all__ = ["ActParams", "act_params", "quantize_weight", "to_qdq", "QdqStats", "INT8_MAX"]

INT8_MAX = 127
_MIN_SCALE = 1e-8


@dataclass(frozen=True)
class ActParams:
    scale: float
    zero_point: int
    signed: bool  # int8 (True) or uint8


def act_params(rng: dict[str, float], symmetric: bool) -> ActParams:
    """int8 symmetric (``amax / 127``, zero point 0) or uint8 asymmetric parameters from a range."""
    if symmetric:
        return ActParams(max(float(rng["amax"]) / INT8_MAX, _MIN_SCALE), 0, True)
    lo, hi = min(float(rng["lo"]), 0.0), max(float(rng["hi"]), 0.0)
    scale = max((hi - lo) / 255.0, _MIN_SCALE)
    zp = int(np.clip(np.round(-lo / scale), 0, 255))
    return ActParams(scale, zp, False)


def quantize_weight(w: np.ndarray, axis: int | None, qmax: int = INT8_MAX) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 (−qmax..qmax) weights and their float32 scale (per channel along ``axis``)."""
    w = np.asarray(w, dtype=np.float32)
    if axis is None:
        amax = np.asarray(np.abs(w).max() if w.size else 0.0, dtype=np.float32)
        scale = np.maximum(amax / qmax, _MIN_SCALE).astype(np.float32)
        q = np.clip(np.round(w / scale), -qmax, qmax).astype(np.int8)
        return q, scale.reshape(())
    red = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.abs(w).max(axis=red) if w.size else np.zeros(w.shape[axis], np.float32)
    scale = np.maximum(amax / qmax, _MIN_SCALE).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.round(w / scale.reshape(shape)), -qmax, qmax).astype(np.int8)
    return q, scale


@dataclass
class QdqStats:
    quantized_nodes: int
    qdq_pairs: int
    weights: int


def _int32_bias(node, b: np.ndarray, a_scale: float, w_scale: np.ndarray, new_inits: list) -> list:
    """An int32 bias (zero point 0, scale = activation scale × weight scale) and its DequantizeLinear."""
    b = np.asarray(b, np.float32).reshape(-1)
    scale = (np.float32(a_scale) * np.asarray(w_scale, np.float32)).astype(np.float32)
    if scale.size == 1:
        scale = np.full(b.shape, float(scale.reshape(())), np.float32)
    scale = np.maximum(scale, _MIN_SCALE).astype(np.float32)
    qb = np.clip(np.round(b / scale), -(2**31) + 1, 2**31 - 1).astype(np.int32)
    stem = f"{node.name}_bias"
    new_inits.append(numpy_helper.from_array(qb, f"{stem}_quantized"))
    new_inits.append(numpy_helper.from_array(scale, f"{stem}_scale"))
    new_inits.append(numpy_helper.from_array(np.zeros(b.shape, np.int32), f"{stem}_zero_point"))
    return [helper.make_node("DequantizeLinear", [f"{stem}_quantized", f"{stem}_scale", f"{stem}_zero_point"],
                             [f"{stem}_dequantized"], name=f"{stem}_DequantizeLinear", axis=0)]


def _copy_header(src: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.ir_version = src.ir_version
    m.producer_name = src.producer_name
    m.producer_version = src.producer_version
    m.domain = src.domain
    m.model_version = src.model_version
    m.doc_string = src.doc_string
    m.opset_import.extend(src.opset_import)
    m.metadata_props.extend(src.metadata_props)
    g = m.graph
    g.name = src.graph.name
    g.doc_string = src.graph.doc_string
    g.input.extend(src.graph.input)
    g.output.extend(src.graph.output)
    return m


def to_qdq(model: onnx.ModelProto, plan: QuantPlan, ranges: dict[str, dict[str, float]],
           index: GraphIndex | None = None) -> tuple[onnx.ModelProto, QdqStats]:
    """A new QDQ model; ``model`` is left untouched.

    Args:
        model: the float model (after equalisation, if any); a skeleton's placeholders are read
            from ``index.arrays`` and written out as real initializers.
        plan: the target's plan (nodes kept in float are simply absent from it).
        ranges: tensor → {amax, lo, hi} from the scale table.
    Raises:
        KeyError: a planned tensor has no calibrated range.
    """
    index = index or GraphIndex(model)
    opset = index.opset()
    per_channel_ok = opset >= 13
    out = _copy_header(model)
    g = out.graph
    by_node = {n.name: n for n in plan.nodes}
    new_inits: list[TensorProto] = []
    act_cache: dict[str, ActParams] = {}
    shared_dq: dict[str, str] = {}  # tensor -> dequantized name (shared pairs)
    weight_dq: dict[tuple[str, int | None], str] = {}
    weight_scales: dict[tuple[str, int | None], np.ndarray] = {}
    weight_stems: set[str] = set()
    pairs = 0

    def params_for(tensor: str) -> ActParams:
        if tensor not in act_cache:
            p = act_params(ranges[tensor], plan.symmetric_activations)
            act_cache[tensor] = p
            zp_type = TensorProto.INT8 if p.signed else TensorProto.UINT8
            new_inits.append(numpy_helper.from_array(np.asarray(p.scale, np.float32), f"{tensor}_scale"))
            new_inits.append(helper.make_tensor(f"{tensor}_zero_point", zp_type, [], [p.zero_point]))
        return act_cache[tensor]

    for node in index.nodes:
        q = by_node.get(node.name)
        if q is None:
            g.node.append(node)
            continue
        new_node = onnx.NodeProto()
        new_node.CopyFrom(node)
        for a in q.acts:
            params_for(a.tensor)
            if plan.dedicated_pairs:
                stem = f"{node.name}_in{a.index}"
                g.node.append(helper.make_node("QuantizeLinear", [a.tensor, f"{a.tensor}_scale", f"{a.tensor}_zero_point"],
                                               [f"{stem}_quantized"], name=f"{stem}_QuantizeLinear"))
                g.node.append(helper.make_node("DequantizeLinear", [f"{stem}_quantized", f"{a.tensor}_scale", f"{a.tensor}_zero_point"],
                                               [f"{stem}_dequantized"], name=f"{stem}_DequantizeLinear"))
                new_node.input[a.index] = f"{stem}_dequantized"
                pairs += 1
            else:
                if a.tensor not in shared_dq:
                    g.node.append(helper.make_node("QuantizeLinear", [a.tensor, f"{a.tensor}_scale", f"{a.tensor}_zero_point"],
                                                   [f"{a.tensor}_quantized"], name=f"{a.tensor}_QuantizeLinear"))
                    g.node.append(helper.make_node("DequantizeLinear", [f"{a.tensor}_quantized", f"{a.tensor}_scale", f"{a.tensor}_zero_point"],
                                                   [f"{a.tensor}_dequantized"], name=f"{a.tensor}_DequantizeLinear"))
                    shared_dq[a.tensor] = f"{a.tensor}_dequantized"
                    pairs += 1
                new_node.input[a.index] = shared_dq[a.tensor]
        if q.weight is not None:
            w = q.weight
            axis = w.axis if per_channel_ok else None
            key = (w.initializer, axis)
            if key not in weight_dq:
                # one initializer quantized two ways (per tensor and per channel, or on two axes) gets two names
                stem = w.initializer if w.initializer not in weight_stems else f"{w.initializer}_axis{axis}"
                weight_stems.add(w.initializer)
                qw, scale = quantize_weight(index.const_value(w.initializer), axis, plan.weight_qmax)
                weight_scales[key] = scale
                new_inits.append(numpy_helper.from_array(qw, f"{stem}_quantized"))
                new_inits.append(numpy_helper.from_array(scale, f"{stem}_scale"))
                zp = np.zeros(scale.shape, np.int8)
                new_inits.append(numpy_helper.from_array(zp, f"{stem}_zero_point"))
                attrs = {"axis": axis} if axis is not None else {}
                g.node.append(helper.make_node("DequantizeLinear", [f"{stem}_quantized", f"{stem}_scale", f"{stem}_zero_point"],
                                               [f"{stem}_dequantized"], name=f"{stem}_DequantizeLinear", **attrs))
                weight_dq[key] = f"{stem}_dequantized"
            new_node.input[w.index] = weight_dq[key]
            if plan.int32_bias and node.op_type in ("Gemm", "Conv") and len(node.input) > 2 and node.input[2]:
                b = index.const_value(node.input[2])
                if b is not None and b.dtype == np.float32 and len(q.acts) == 1:
                    a_scale = act_cache[q.acts[0].tensor].scale
                    g.node.extend(_int32_bias(node, b, a_scale, weight_scales[key], new_inits))
                    new_node.input[2] = f"{node.name}_bias_dequantized"
        g.node.append(new_node)

    # float initializers still used by some node or graph output stay; fully replaced weights go
    used = {t for n in g.node for t in n.input} | {o.name for o in g.output}
    for init in model.graph.initializer:
        if init.name in used:
            g.initializer.append(materialize(init, index.arrays))
    g.initializer.extend(new_inits)
    # value_info of the float graph is still true for the float tensors; keep what remains
    produced = {o for n in g.node for o in n.output}
    g.value_info.extend(v for v in model.graph.value_info if v.name in produced)
    return out, QdqStats(len(plan.nodes), pairs, len(weight_dq))
