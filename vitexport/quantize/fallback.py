"""Mixed-precision fallback: when INT8 misses the parity budget, keep the fewest layers in float.

Decided honestly: on the *calibration* data (a held-out part never calibrated on, plus a screen of
calibrated samples; never the parity data the gate then scores), with the gate's own arithmetic (the
target's :class:`~vitexport.runners.sessions.SessionConfig`) on the very graph that is written, and
judged by the gate's *predicted* figures over as many samples as the gate scores (:mod:`.judge`,
:mod:`.tail`), not by the selection samples' minimum.

1. *Rank* every quantized node by its local sensitivity: the node alone, as a one-node model, run
   on its true float inputs with and without Q/DQ; the score is the relative error it adds
   (noise / signal power of its output). attn·V (both inputs quantized) is a node like any other:
   keeping it float is one candidate, with its MACs as its cost.
2. *Grow*: keep the k most sensitive nodes in float for k = 1, 2, … until the whole model is
   predicted to meet the budget (or ``max_float_layers`` is reached). When only the predicted top-1
   flips miss and two more steps cut them by less than 10 % (:data:`STALL`), more float buys nothing
   (the bench's Swin: 9 nodes, 27.9 % of MACs float for a flip rate that did not move): the search
   stops and keeps the fewest nodes that reach the lowest flips (within 10 %). When the predicted flips
   are all that misses, the order is not the output error's but each node's own cut of the flips per
   MAC (the ``max_float_layers`` most sensitive nodes tried alone once each, those cutting less than
   10 % left out).
3. *Prune*: try putting each kept node back into INT8, least sensitive first; keep it INT8 if the
   prediction still holds. What remains is reported with what it costs (share of MACs left in float).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from ..calibration.feeds import FeedSet
from ..runners.sessions import LOW_MEMORY, Session, SessionConfig
from ..graph.query import const_array
from .convert import WeightCache, convert
from .judge import Verdict
from .spec import NodeSpec, QuantPlan

__all__ = ["rank_sensitivity", "FallbackResult", "search_fallback", "STALL"]

#: a step that cuts the predicted flip rate by less than this share is no progress
STALL = 0.1
_FLIP_CHECK = "predicted accuracy_drop"


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
    before: Verdict
    after: Verdict
    ranking: list[tuple[str, float]]
    evaluations: int
    met: bool
    macs_float_share: float
    per_node: list[dict] = field(default_factory=list)


def search_fallback(plan: QuantPlan, check: Callable[[QuantPlan], Verdict], ranking: list[tuple[str, float]],
                    max_float: int, first: Verdict, cheap: Sequence[str] = ()) -> FallbackResult:
    """Grow then prune the set of float nodes (see the module docstring), cheapest first.

    Args:
        plan: the full plan.
        check: builds the Q/DQ model of a plan and judges it (:class:`~.judge.Judge`).
        ranking: nodes, most sensitive first.
        max_float: most nodes kept in float, besides ``cheap``.
        first: the full plan's verdict.
        cheap: nodes tried first, as one step (attn·V: a few per cent of the MACs), before any Linear.
    """
    memo: dict[frozenset, Verdict] = {}

    def judged(nodes) -> Verdict:
        key = frozenset(nodes)
        if key not in memo:
            memo[key] = check(plan.without(set(nodes)))
        return memo[key]

    group = [n for n in cheap if plan.node(n) is not None]
    order = [n for n, _ in ranking if n not in group]
    steps = ([group] if group else []) + [group + order[:k] for k in range(1, min(max_float, len(order)) + 1)]
    if not first and first.failing() == {_FLIP_CHECK} and first.flips:
        # only the flips miss: grow by what cuts them, per MAC, not by the output error
        group, order = [], _flip_order(plan, judged, order[:max_float], first)
        steps = [order[:k] for k in range(1, len(order) + 1)]
    met = bool(first)
    best: tuple[list[str], Verdict] = ([], first)
    tried, stalled = [best], False
    for step in steps if not met else ():
        res = judged(step)
        tried.append((step, res))
        if res or res.rank() > best[1].rank():
            best = (step, res)
        if res:
            met = True
            break
        if _flips_stalled(tried):
            best, stalled = _fewest_at_lowest_flips(tried), True
            break
    if met or (stalled and best[0]):
        # stalled: a node goes back to INT8 if all but the flip check still pass and the flips stay as low
        limit = None if met else best[1].flips / (1.0 - STALL)
        best, _ = _prune(plan, judged, best, group, limit)
    return _result(plan, ranking, first, best, len(memo), met)


def _flip_order(plan: QuantPlan, judged: Callable[[Sequence[str]], Verdict], candidates: Sequence[str],
                first: Verdict) -> list[str]:
    """The candidates that, kept float alone, cut the predicted flips by at least :data:`STALL`, the
    largest cut per MAC first (one evaluation each; the text encoder: layer 0's fused QKV, 6.1 % of the
    MACs, took the expected flips from 1.07 to 0.16, the most error-sensitive nodes did not)."""
    macs = {n.node: max(n.macs, 1) for n in plan.nodes}
    cut = {n: first.flips - (judged([n]).flips or first.flips) for n in candidates}
    keep = [n for n in candidates if cut[n] >= STALL * first.flips]
    return sorted(keep, key=lambda n: (-cut[n] / macs.get(n, 1), n))


def _flips_stalled(tried: list[tuple[list[str], Verdict]]) -> bool:
    """The last two steps missed only the flip check and cut the flips by less than :data:`STALL`."""
    if len(tried) < 3 or any(r.flips is None or r.failing() != {_FLIP_CHECK} for _, r in tried[-2:]):
        return False
    earlier = [r.flips for _, r in tried[:-2] if r.flips is not None]
    return bool(earlier) and all(r.flips > (1.0 - STALL) * min(earlier) for _, r in tried[-2:])


def _fewest_at_lowest_flips(tried: list[tuple[list[str], Verdict]]) -> tuple[list[str], Verdict]:
    """The first step (fewest float nodes) with the most checks met and flips within :data:`STALL` of the lowest."""
    most = max(len(r.checks) - len(r.failing()) for _, r in tried)
    pool = [(s, r) for s, r in tried if len(r.checks) - len(r.failing()) == most and r.flips is not None]
    low = min(r.flips for _, r in pool)
    return next((s, r) for s, r in pool if r.flips <= low / (1.0 - STALL))


def _prune(plan: QuantPlan, check: Callable[[Sequence[str]], Verdict], best: tuple[list[str], Verdict],
           group: list[str], flips_limit: float | None = None) -> tuple[tuple[list[str], Verdict], int]:
    """Put kept nodes back into INT8 while the verdict holds: the cheap group as a whole, then each other
    node, least sensitive first. ``flips_limit``: the search stalled on the flip check; a trial holds when
    only that check fails and its flips stay at most this."""
    kept, evaluations = list(best[0]), 0
    trials = ([group] if group and set(group) <= set(kept) and len(kept) > len(group) else [])
    trials += [[n] for n in reversed(kept) if n not in group] if len(kept) > 1 else []
    for drop in trials:
        trial = [n for n in kept if n not in drop]
        res = check(trial)
        evaluations += 1
        if res or (flips_limit is not None and res.failing() <= {_FLIP_CHECK} and res.flips is not None
                   and res.flips <= flips_limit):
            kept, best = trial, (trial, res)
    return best, evaluations


def _result(plan: QuantPlan, ranking: list[tuple[str, float]], first: Verdict, best: tuple[list[str], Verdict],
            evaluations: int, met: bool) -> FallbackResult:
    total = plan.total_macs or 1
    macs = {n.node: n.macs for n in plan.nodes}
    sens = dict(ranking)
    per_node = [{"node": n, "sensitivity": float(sens.get(n, 0.0)), "macs_share": macs.get(n, 0) / total} for n in best[0]]
    return FallbackResult(list(best[0]), first, best[1], ranking, evaluations, met,
                          sum(macs.get(n, 0) for n in best[0]) / total, per_node)
