"""Mixed-precision fallback: when INT8 misses the parity budget, keep the fewest layers in float.

Decided honestly: on a held-out part of the *calibration* data (never the parity data the gate
then scores), with the gate's own arithmetic (the target's :class:`~vitexport.runners.sessions.
SessionConfig`) on the very graph that is written.

1. *Rank* every quantized node by its local sensitivity: the node alone, as a one-node model, run
   on its true float inputs with and without Q/DQ; the score is the relative error it adds
   (noise / signal power of its output).
2. *Grow*: keep the k most sensitive nodes in float for k = 1, 2, … until the whole model meets the
   budget on the selection data (or ``max_float_layers`` is reached).
3. *Prune*: try putting each kept node back into INT8, least sensitive first; keep it INT8 if the
   budget still holds. What remains is reported with what it costs (share of MACs left in float).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import onnx_ir as ir

from ..calibration.feeds import FeedSet
from ..runners.sessions import LOW_MEMORY, Session, SessionConfig
from ..graph.query import const_array
from ..parity.metrics import CompareResult, compare
from ..recipe import Tolerance
from .convert import WeightCache, convert
from .spec import NodeSpec, QuantPlan

__all__ = ["run_outputs", "evaluate", "rank_sensitivity", "FallbackResult", "search_fallback"]


def run_outputs(model: ir.Model, feeds: FeedSet, config: SessionConfig = LOW_MEMORY) -> np.ndarray:
    """The model's first output over ``feeds`` (padding trimmed), float32."""
    sess = Session(model, config)
    out = [sess.run(None, f)[0] for f in feeds]
    del sess
    return feeds.trim(np.concatenate(out, axis=0)).astype(np.float32)


def evaluate(model: ir.Model, feeds: FeedSet, reference: np.ndarray, tolerance: Tolerance,
             config: SessionConfig) -> CompareResult:
    """Compare the model's outputs on ``feeds`` with ``reference`` under ``tolerance`` — the gate's
    own comparison, in the arithmetic ``config`` runs (the target's)."""
    out = run_outputs(model, feeds, config)
    ref = np.asarray(reference, np.float32)
    if ref.shape != out.shape and ref.size == out.size:
        ref = ref.reshape(out.shape)
    return compare(ref, out, tolerance, labels=feeds.labels)


def _one_node_model(model: ir.Model, node: ir.Node, acts: list[str]) -> ir.Model:
    """``node`` alone: its activation inputs as graph inputs, its constants as initializers."""
    inputs, inits, args = [], [], []
    for v in node.inputs:
        if v is None:
            args.append(None)
            continue
        nv = ir.Value(name=v.name, shape=v.shape, type=v.type)
        if v.name in acts:
            inputs.append(nv)
        else:
            arr = const_array(v)
            nv.const_value = v.const_value if v.const_value is not None else ir.tensor(arr, name=v.name)
            inits.append(nv)
        args.append(nv)
    copy = ir.Node(node.domain, node.op_type, args, list(node.attributes.values()), name=node.name)
    copy.outputs[0].name = node.outputs[0].name
    graph = ir.Graph(inputs, [copy.outputs[0]], nodes=[copy], initializers=inits,
                     opset_imports=dict(model.opset_imports), name="probe")
    return ir.Model(graph, ir_version=model.ir_version)


def rank_sensitivity(model: ir.Model, plan: QuantPlan, ranges: Mapping[str, Mapping[str, float]], feeds: FeedSet,
                     config: SessionConfig, cache: WeightCache) -> list[tuple[str, float]]:
    """(node name, relative error its own quantization adds), most sensitive first."""
    tensors = plan.tensors()
    sess = Session(model, LOW_MEMORY, outputs=tensors)
    values: dict[str, list[np.ndarray]] = {t: [] for t in tensors}
    for f in feeds:
        for t, v in zip(tensors, sess.run(tensors, f)):
            values[t].append(v)
    del sess
    nodes = {n.name: n for n in model.graph}
    scores = [(spec.node, _node_error(model, nodes[spec.node], spec, plan, ranges, values, config, cache))
              for spec in plan.nodes]
    scores.sort(key=lambda x: (-x[1], x[0]))
    return scores


def _node_error(model: ir.Model, node: ir.Node, spec: NodeSpec, plan: QuantPlan, ranges, values, config, cache) -> float:
    acts = [a.tensor for a in spec.acts]
    float_m = _one_node_model(model, node, acts)
    sub = QuantPlan(plan.target, (spec,), plan.encoding)
    q_m, _ = convert(float_m, sub, {t: ranges[t] for t in acts}, cache)
    fs, qs = Session(float_m, LOW_MEMORY), Session(q_m, config)
    noise = signal = 0.0
    for i in range(len(values[acts[0]])):
        feed = {t: values[t][i] for t in acts}
        ref = fs.run(None, feed)[0].astype(np.float64)
        out = qs.run(None, feed)[0].astype(np.float64)
        noise += float(((out - ref) ** 2).sum())
        signal += float((ref**2).sum())
    return noise / max(signal, 1e-30)


@dataclass
class FallbackResult:
    """What the search kept in float and what that achieved on the selection data."""

    float_nodes: list[str]
    before: CompareResult
    after: CompareResult
    ranking: list[tuple[str, float]]
    evaluations: int
    met: bool
    macs_float_share: float
    per_node: list[dict] = field(default_factory=list)


def search_fallback(plan: QuantPlan, check: Callable[[QuantPlan], CompareResult], ranking: list[tuple[str, float]],
                    max_float: int, first: CompareResult) -> FallbackResult:
    """Grow then prune the set of float nodes (see the module docstring).

    Args:
        plan: the full plan.
        check: builds the Q/DQ model of a plan and compares it on the selection data.
        ranking: nodes, most sensitive first.
        max_float: most nodes kept in float.
        first: the full plan's result.
    """
    order = [n for n, _ in ranking]
    total = plan.total_macs or 1
    macs = {n.node: n.macs for n in plan.nodes}
    evaluations, met = 0, bool(first)
    best: tuple[list[str], CompareResult] = ([], first)
    for k in range(1, min(max_float, len(order)) + 1) if not met else ():
        res = check(plan.without(set(order[:k])))
        evaluations += 1
        if res or _better(res, best[1]):
            best = (order[:k], res)
        if res:
            met = True
            break
    if met and len(best[0]) > 1:
        kept = list(best[0])
        for name in reversed(best[0]):  # least sensitive first
            trial = [n for n in kept if n != name]
            res = check(plan.without(set(trial)))
            evaluations += 1
            if res:
                kept, best = trial, (trial, res)
    sens = dict(ranking)
    per_node = [{"node": n, "sensitivity": float(sens.get(n, 0.0)), "macs_share": macs.get(n, 0) / total} for n in best[0]]
    return FallbackResult(list(best[0]), first, best[1], ranking, evaluations, met,
                          sum(macs.get(n, 0) for n in best[0]) / total, per_node)


def _better(a: CompareResult, b: CompareResult) -> bool:
    ta, tb = a.metrics.top1_agreement or 0.0, b.metrics.top1_agreement or 0.0
    return (ta, a.metrics.cosine_min) > (tb, b.metrics.cosine_min)
