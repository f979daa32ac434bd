"""Mixed-precision fallback: when INT8 misses the parity budget, keep the fewest layers in float.

1. *Rank* every quantized node by its local sensitivity: the node alone, as a one-node model, run
   on its true float inputs with and without Q/DQ; the score is the relative error it adds
   (noise / signal power of its output).
2. *Grow*: keep the k most sensitive nodes in float for k = 1, 2, … until the whole model meets the
   budget on the parity feeds (or ``max_float_layers`` is reached).
3. *Prune*: try putting each kept node back into INT8, least sensitive first; keep it INT8 if the
   budget still holds. What remains is reported with what it costs (share of MACs left in float).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import helper

from ..calibration.collect import make_session
from ..engines.ort_runner import QDQ_AS_FLOAT
from ..calibration.session import FloatSession, materialize, release_memory
from ..parity.metrics import CompareResult, compare
from ..recipe import Tolerance
from .convert import to_qdq
from .graph import GraphIndex
from .targets import QuantPlan

__all__ = ["run_outputs", "evaluate", "rank_sensitivity", "FallbackResult", "search_fallback"]


def run_outputs(model: onnx.ModelProto | bytes, feeds: list[dict[str, np.ndarray]], threads: int = 0,
                arrays: dict[str, np.ndarray] | None = None, fused: bool = True) -> np.ndarray:
    """The model's first output over ``feeds``, concatenated on axis 0 (float32).

    Args:
        arrays: the weights of a skeleton model (see :mod:`vitexport.calibration.session`).
        fused: let ONNX Runtime fuse Q/DQ into integer kernels; False runs Q/DQ as float ops.
    """
    if arrays is not None:
        fs = FloatSession(model, arrays, threads=threads)
        out = [fs.run(None, f)[0] for f in feeds]
    else:
        # no arena: an unfused Q/DQ graph dequantizes its weights on every run (330 MB for a ViT-B)
        sess = make_session(model, threads=threads, low_memory=True,
                            config={} if fused else QDQ_AS_FLOAT)
        names = {i.name for i in sess.get_inputs()}
        out = [sess.run(None, {k: v for k, v in f.items() if k in names})[0] for f in feeds]
        del sess
        release_memory()
    return np.concatenate(out, axis=0).astype(np.float32)


def evaluate(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], reference: np.ndarray,
             tolerance: Tolerance, threads: int = 0, fused: bool = False) -> CompareResult:
    """Compare the model's outputs on ``feeds`` with ``reference`` under ``tolerance``.

    Args:
        fused: run ONNX Runtime's integer kernels (the cpu target's deployment runtime). Otherwise
            the Q/DQ graph runs with float semantics (``session.disable_quant_qdq``): what TensorRT or
            an NPU computes, free of ONNX Runtime's x86 kernel effects (measured here: its fused S8S8
            MatMul on an AVX2 CPU without VNNI saturated and dropped a model's cosine from 0.997 to 0.915).
    """
    out = run_outputs(model, feeds, threads, fused=fused)
    ref = np.asarray(reference, np.float32)
    if ref.shape != out.shape and ref.size == out.size:
        ref = ref.reshape(out.shape)
    return compare(ref, out, tolerance)


def _one_node_model(index: GraphIndex, node: onnx.NodeProto, act_inputs: list[str]) -> onnx.ModelProto:
    g = helper.make_graph([node], "probe", [], [])
    for t in act_inputs:
        shp, et = index.shapes[t]
        g.input.append(helper.make_tensor_value_info(t, et, list(shp)))
    for t in node.input:
        if t and t not in act_inputs:
            if t in index.initializers:
                g.initializer.append(materialize(index.initializers[t], index.arrays))
            else:
                v = index.const_value(t)
                g.initializer.append(onnx.numpy_helper.from_array(v, t))
    g.output.append(onnx.ValueInfoProto(name=node.output[0]))
    m = helper.make_model(g, opset_imports=list(index.model.opset_import))
    m.ir_version = index.model.ir_version
    return m


def rank_sensitivity(model: onnx.ModelProto, index: GraphIndex, plan: QuantPlan,
                     ranges: dict[str, dict[str, float]], feeds: list[dict[str, np.ndarray]],
                     fused: bool = False) -> list[tuple[str, float]]:
    """(node name, relative error its own quantization adds), most sensitive first."""
    tensors = plan.tensors()
    sess = FloatSession(model, index.arrays, outputs=tensors)
    values: dict[str, list[np.ndarray]] = {t: [] for t in tensors}
    for f in feeds:
        outs = sess.run(tensors, f)
        for t, v in zip(tensors, outs):
            values[t].append(v)
    del sess
    scores = []
    for q in plan.nodes:
        node = index.by_name[q.name]
        acts = [a.tensor for a in q.acts]
        float_m = _one_node_model(index, node, acts)
        sub_index = GraphIndex(float_m, shapes=index.shapes)
        sub_plan = QuantPlan(plan.target, [q], {}, plan.symmetric_activations, plan.per_channel_weights,
                             plan.dedicated_pairs, plan.forbid_float16, plan.int32_bias, plan.weight_qmax)
        q_m, _ = to_qdq(float_m, sub_plan, {t: ranges[t] for t in acts}, sub_index)
        fs = make_session(float_m)
        qs = make_session(q_m, config={} if fused else QDQ_AS_FLOAT)
        noise = signal = 0.0
        for i in range(len(feeds)):
            feed = {t: values[t][i] for t in acts}
            ref = fs.run(None, feed)[0].astype(np.float64)
            out = qs.run(None, feed)[0].astype(np.float64)
            noise += float(((out - ref) ** 2).sum())
            signal += float((ref**2).sum())
        scores.append((q.name, noise / max(signal, 1e-30)))
    scores.sort(key=lambda x: (-x[1], x[0]))
    return scores


@dataclass
class FallbackResult:
    """What the search kept in float and what that achieved."""

    float_nodes: list[str]
    before: CompareResult
    after: CompareResult
    ranking: list[tuple[str, float]]
    evaluations: int
    met: bool
    macs_float_share: float
    per_node: list[dict] = field(default_factory=list)


def search_fallback(
    plan: QuantPlan,
    build: Callable[[QuantPlan], onnx.ModelProto],
    check: Callable[[onnx.ModelProto], CompareResult],
    ranking: list[tuple[str, float]],
    max_float: int,
    first: CompareResult,
) -> FallbackResult:
    """Grow then prune the set of float nodes (see the module docstring)."""
    order = [n for n, _ in ranking]
    total_macs = sum(n.macs for n in plan.nodes) or 1
    macs = {n.name: n.macs for n in plan.nodes}
    evaluations = 0
    best: tuple[list[str], CompareResult] = ([], first)
    met = bool(first)
    kept: list[str] = []
    if not met:
        for k in range(1, min(max_float, len(order)) + 1):
            kept = order[:k]
            res = check(build(plan.without(set(kept))))
            evaluations += 1
            if _better(res, best[1]):
                best = (kept, res)
            if res:
                met = True
                best = (kept, res)
                break
    if met and len(best[0]) > 1:
        kept = list(best[0])
        for name in reversed(best[0]):  # least sensitive first
            trial = [n for n in kept if n != name]
            res = check(build(plan.without(set(trial))))
            evaluations += 1
            if res:
                kept = trial
                best = (kept, res)
    per_node = [{"node": n, "sensitivity": float(dict(ranking).get(n, 0.0)), "macs_share": macs.get(n, 0) / total_macs}
                for n in best[0]]
    return FallbackResult(list(best[0]), first, best[1], ranking, evaluations, met,
                          sum(macs.get(n, 0) for n in best[0]) / total_macs, per_node)


def _better(a: CompareResult, b: CompareResult) -> bool:
    ca, cb = a.metrics.cosine_min, b.metrics.cosine_min
    ta, tb = a.metrics.top1_agreement or 0.0, b.metrics.top1_agreement or 0.0
    return (ta, ca) > (tb, cb)
