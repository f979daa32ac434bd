"""Mixed-precision fallback: when INT8 misses the parity budget, keep the fewest layers in float.

Decided honestly: on the *calibration* data (a held-out part never calibrated on, plus a screen of
calibrated samples; never the parity data the gate then scores), with the gate's own arithmetic (the
target's :class:`~vitexport.runners.sessions.SessionConfig`) on the very graph that is written, and
judged by the gate's *predicted* figures over as many samples as the gate scores (:mod:`.judge`,
:mod:`.tail`), not by the selection samples' minimum.

1. *Rank* every quantized node by its local sensitivity: the node alone, as a one-node model, run
   on its true float inputs with and without Q/DQ; the score is the relative error it adds
   (noise / signal power of its output). attn·V (both inputs quantized) is a node like any other:
   keeping it float is one candidate, with its MACs as its cost. On a network with conv stages the
   growth below takes its order from :func:`rank_output_error` instead (``quantization.fallback.ranking``):
   the error each node alone adds to the model's outputs, which sees what later layers amplify.
2. *Grow*: keep the k most sensitive nodes in float for k = 1, 2, … :data:`LINEAR_STEPS`, then k grows
   by half again per step (12, 18, 27, …), until the whole model is predicted to meet the budget (or
   ``max_float_layers`` is reached, when a recipe sets one; by default there is no cap); a size met
   after a jump is bisected down to the fewest nodes that meet it. Beyond :data:`LINEAR_STEPS` the search
   also stops when two steps in a row cut the predicted worst-case error ``1 − cos`` by less than
   :data:`STALL` and keeps the fewest nodes within it of the lowest error (more float buys nothing; the
   target's INT8-share gate judges what the float layers cost). When only the predicted top-1 flips
   miss and two more steps cut them by less than 10 % (:data:`STALL`), more float buys nothing (the bench's Swin: 9 nodes, 27.9 % of MACs float for a flip rate that did not move): the search
   stops and keeps the fewest nodes that reach the lowest flips (within 10 %). When the predicted flips
   are all that misses, the order is not the output error's but each node's own cut of the flips per
   MAC (the ``max_float_layers`` most sensitive nodes, :data:`LINEAR_STEPS` without a cap, tried alone
   once each, those cutting less than 10 % left out).
3. *Prune*: try putting each kept node back into INT8, least sensitive first (at most
   :data:`PRUNE_TRIES` of them); keep it INT8 if the prediction still holds. What remains is reported
   with what it costs (its MACs, its share of the MACs left in float).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from ..calibration.feeds import FeedSet, feed_size
from ..runners.sessions import LOW_MEMORY, Session, SessionConfig
from ..graph.query import const_array, conv_stages
from .convert import WeightCache, convert
from .judge import Verdict
from .spec import NodeSpec, QuantPlan

__all__ = ["rank_sensitivity", "rank_output_error", "output_ranked", "OUTPUT_RANK_MACS", "FallbackResult",
           "search_fallback", "STALL", "LINEAR_STEPS", "PRUNE_TRIES", "step_sizes"]

#: a step that cuts the predicted flip rate (or, beyond :data:`LINEAR_STEPS`, the predicted worst-case
#: error 1 − cos) by less than this share is no progress
STALL = 0.1
#: the search grows one node per step up to this many float nodes (the former fixed cap: every choice
#: it made is made the same way), then by :data:`GROWTH` per step: a ViT-B's 98 quantized nodes take at
#: most 8 + 6 steps, and a bisection after the step that meets the budget
LINEAR_STEPS = 8
GROWTH = 1.5
#: a prune tries at most this many kept nodes back in INT8 (one verdict each, least sensitive first)
PRUNE_TRIES = 8
_FLIP_CHECK = "predicted accuracy_drop"
#: ``auto`` ranks by the outputs only while that costs at most this many multiply-accumulates (quantized layers ×
#: sensitivity samples × the model's GEMM/Conv MACs): a trained MobileViT-XXS at 64 px, 58 layers × 4 samples,
#: takes 4.6 G and 2 s on 2 cores; a ViT-B/16-sized hybrid would take 7 T, and keeps the per-node order
OUTPUT_RANK_MACS = 500_000_000_000


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
                     config: SessionConfig, cache: WeightCache,
                     on_run: Callable[[int], None] | None = None) -> list[tuple[str, float]]:
    """(node name, relative error its own quantization adds), most sensitive first; ``on_run`` counts
    the full-model runs (the one-node models' runs are not)."""
    tensors = plan.tensors()
    sess = Session(model, LOW_MEMORY, outputs=tensors)
    values: dict[str, list[np.ndarray]] = {t: [] for t in tensors}
    for f in feeds:
        for t, v in zip(tensors, sess.run(tensors, f)):
            values[t].append(v)
        if on_run is not None:
            on_run(feed_size(f))
    del sess
    nodes = {n.name: n for n in model.graph}
    scores = [(spec.node, _node_error(model, nodes[spec.node], spec, plan, ranges, values, config, cache))
              for spec in plan.nodes]
    scores.sort(key=lambda x: (-x[1], x[0]))
    return scores


def output_ranked(ranking: str, plan: QuantPlan, model: ir.Model, samples: int = 1) -> bool:
    """Whether the fallback orders its candidates by :func:`rank_output_error`: ``output``, or ``auto`` on a
    network with conv stages (a quantized Conv whose kernel is not its stride, i.e. more than a patch embedding:
    MobileViT, EfficientViT, …), where a residual sum early in the net can pass an ordinary INT8 error on to layers
    that amplify it, within :data:`OUTPUT_RANK_MACS` for ``samples`` sensitivity samples; ``auto`` keeps
    :func:`rank_sensitivity`'s order on transformers, where it was measured."""
    if ranking != "auto":
        return ranking == "output"
    if len(plan.nodes) * samples * plan.total_macs > OUTPUT_RANK_MACS:
        return False
    return conv_stages(model, (spec.node for spec in plan.nodes if spec.op_type == "Conv"))


def rank_output_error(model: ir.Model, plan: QuantPlan, build: Callable[[QuantPlan], ir.Model], feeds: FeedSet,
                      config: SessionConfig, on_run: Callable[[int], None] | None = None) -> list[tuple[str, float]]:
    """(node name, relative error its quantization alone adds to the model's outputs), most harmful first: the
    whole model built with that one node quantized (``build``: its float parts in float32), its outputs against the
    float model's on ``feeds``. Unlike :func:`rank_sensitivity` it sees what the layers downstream make of a node's
    error: on a trained MobileViT-XXS the 1x1 conv that reads the residual sum ending stage 0 adds an ordinary 1.6 %
    error on its input and ranks 25th by its own output, yet alone it costs the logits more than any other node, and
    in float it lifts the held-out worst cosine from 0.934 to 0.991. One model run per node and sample
    (:data:`OUTPUT_RANK_MACS` bounds what ``auto`` spends)."""
    ref_sess = Session(model, LOW_MEMORY)
    refs = [[o.astype(np.float64) for o in ref_sess.run(None, f)] for f in feeds]
    del ref_sess

    def error(sub: QuantPlan) -> float:
        sess = Session(build(sub), config)
        noise = signal = 0.0
        for f, ref in zip(feeds, refs):
            for out, r in zip(sess.run(None, f), ref):
                noise += float(((out.astype(np.float64) - r) ** 2).sum())
                signal += float((r**2).sum())
            if on_run is not None:
                on_run(feed_size(f))
        return noise / max(signal, 1e-30)

    scores = [(spec.node, error(QuantPlan(plan.target, (spec,), plan.encoding))) for spec in plan.nodes]
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
    #: why the search stopped short of the budget ("" when it met it or tried every size)
    stopped: str = ""


def step_sizes(n: int, cap: int | None) -> list[int]:
    """How many of the ``n`` ranked nodes each growth step keeps float: 1 … :data:`LINEAR_STEPS`, then
    half again per step, never past ``cap`` (None: no cap) or ``n``; the last size is the limit."""
    limit = n if cap is None else min(cap, n)
    sizes = list(range(1, min(LINEAR_STEPS, limit) + 1))
    k = sizes[-1] if sizes else 0
    while k < limit:
        k = min(limit, max(k + 1, math.ceil(k * GROWTH)))
        sizes.append(k)
    return sizes


def _fit_steps(steps: list[list[str]], candidates: list[str], macs: Mapping[str, int], room: int) -> list[list[str]]:
    """Each step as many nodes as it names within ``room`` multiply-accumulates: a node that does not fit is
    passed over for the next-ranked ones that do (a large conv ranked high no longer ends the search while
    smaller sensitive layers would fit); a step that adds nothing new is dropped."""
    out: list[list[str]] = []
    for step in steps:
        kept, used = [], 0
        for n in [*step, *(c for c in candidates if c not in step)]:
            if len(kept) == len(step):
                break
            if used + macs.get(n, 0) <= room:
                kept.append(n)
                used += macs.get(n, 0)
        if kept and (not out or set(kept) != set(out[-1])):
            out.append(kept)
    return out


def search_fallback(plan: QuantPlan, check: Callable[[QuantPlan], Verdict], ranking: list[tuple[str, float]],
                    max_float: int | None, first: Verdict, cheap: Sequence[str] = (),
                    max_float_macs: int | None = None, pass_over: bool = True) -> FallbackResult:
    """Grow then prune the set of float nodes (see the module docstring), cheapest first.

    Args:
        plan: the full plan.
        check: builds the Q/DQ model of a plan and judges it (:class:`~.judge.Judge`).
        ranking: nodes, most sensitive first.
        max_float: most nodes kept in float, besides ``cheap`` (None: no cap; the stall rule ends the search).
        first: the full plan's verdict.
        cheap: nodes tried first, as one step (attn·V: a few per cent of the MACs), before any Linear.
        max_float_macs: most multiply-accumulates the float nodes may take (the target's INT8-share gate
            leaves that much room; None: no limit).
        pass_over: a step past the room passes over the nodes that do not fit for the next-ranked ones that do
            (the room is exact: the gate measures the written file); False: a step past it is not tried and the
            search stops there (the room is an upper bound: a backend may run more in float than the file says,
            and filling it to the brim fails the backend's gate — OpenVINO on EfficientViT-B0: 94.0 % < 95 %).
    """
    memo: dict[frozenset, Verdict] = {}

    def judged(nodes) -> Verdict:
        key = frozenset(nodes)
        if key not in memo:
            memo[key] = check(plan.without(set(nodes)))
        return memo[key]

    group = [n for n in cheap if plan.node(n) is not None]
    order = [n for n, _ in ranking if n not in group]
    steps = ([group] if group else []) + [group + order[:k] for k in step_sizes(len(order), max_float)]
    if not first and first.failing() == {_FLIP_CHECK} and first.flips:
        # only the flips miss: grow by what cuts them, per MAC, not by the output error (each candidate
        # costs a verdict alone: at most LINEAR_STEPS of them without a cap)
        group, order = [], _flip_order(plan, judged, order[:LINEAR_STEPS if max_float is None else max_float], first)
        steps = [order[:k] for k in range(1, len(order) + 1)]
    share_cut = False
    if max_float_macs is not None:
        macs = {n.node: n.macs for n in plan.nodes}
        fits = (_fit_steps(steps, [*group, *order], macs, max_float_macs) if pass_over
                else [st for st in steps if sum(macs.get(n, 0) for n in st) <= max_float_macs])
        share_cut, steps = fits != steps, fits
    met = bool(first)
    best: tuple[list[str], Verdict] = ([], first)
    tried, stalled, stopped = [best], False, ""
    for step in steps if not met else ():
        res = judged(step)
        tried.append((step, res))
        if res or res.rank() > best[1].rank():
            best = (step, res)
        if res:
            met = True
            best = _bisect(judged, group, tried, best)
            break
        if _flips_stalled(tried):
            best, stalled = _fewest_at_lowest_flips(tried), True
            stopped = f"the predicted flips fell by less than {STALL:.0%} over two steps"
            break
        if _error_stalled(tried, len(group)):
            best = _fewest_at_lowest_error(tried)
            stopped = (f"tried up to {len(step)} float node(s): two steps in a row cut the predicted error 1 − cos by "
                       f"less than {STALL:.0%}")
            break
    if not met and not stopped and share_cut:
        stopped = "the target's INT8-share gate leaves no room for more float layers"
    if not met and not stopped and max_float is not None and len(order) > max_float and tried[-1][0]:
        stopped = f"quantization.fallback.max_float_layers={max_float} reached"
    if met or (stalled and best[0]):
        # stalled: a node goes back to INT8 if all but the flip check still pass and the flips stay as low
        limit = None if met else best[1].flips / (1.0 - STALL)
        best, _ = _prune(plan, judged, best, group, limit)
    out = _result(plan, ranking, first, best, len(memo), met)
    out.stopped = stopped
    return out


def _bisect(judged: Callable[[Sequence[str]], Verdict], group: list[str],
            tried: list[tuple[list[str], Verdict]], best: tuple[list[str], Verdict]) -> tuple[list[str], Verdict]:
    """After a jump (more than one node added by the step that met the budget), the fewest of the
    ranked nodes that still meet it, by bisection between the last size that missed and the one that met
    (over prefixes of the set that met it: within the INT8-share room as that set is)."""
    met = best[0]
    hi = len(met) - len(group)
    lo = len(tried[-2][0]) - len(group) if len(tried) >= 2 else 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        res = judged(met[:len(group) + mid])
        if res:
            hi, best = mid, (met[:len(group) + mid], res)
        else:
            lo = mid
    return best


def _error_stalled(tried: list[tuple[list[str], Verdict]], group: int) -> bool:
    """Beyond :data:`LINEAR_STEPS` ranked nodes: the last two steps each cut the predicted worst-case
    error ``1 − cos`` by less than :data:`STALL` against the best step before them."""
    if len(tried) < 4 or any(len(s) - group <= LINEAR_STEPS for s, _ in tried[-2:]):
        return False
    earlier = min(1.0 - r.prediction.cosine_min for _, r in tried[:-2])
    return all(1.0 - r.prediction.cosine_min > (1.0 - STALL) * earlier for _, r in tried[-2:])


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


def _fewest_at_lowest_error(tried: list[tuple[list[str], Verdict]]) -> tuple[list[str], Verdict]:
    """The first step (fewest float nodes) with the most checks met and a predicted error 1 − cos within
    :data:`STALL` of the lowest: float nodes that bought nothing are not kept."""
    most = max(len(r.checks) - len(r.failing()) for _, r in tried)
    pool = [(s, r) for s, r in tried if len(r.checks) - len(r.failing()) == most]
    low = min(1.0 - r.prediction.cosine_min for _, r in pool)
    return next((s, r) for s, r in pool if 1.0 - r.prediction.cosine_min <= low / (1.0 - STALL))


def _prune(plan: QuantPlan, check: Callable[[Sequence[str]], Verdict], best: tuple[list[str], Verdict],
           group: list[str], flips_limit: float | None = None) -> tuple[tuple[list[str], Verdict], int]:
    """Put kept nodes back into INT8 while the verdict holds: the cheap group as a whole, then each other
    node, least sensitive first. ``flips_limit``: the search stalled on the flip check; a trial holds when
    only that check fails and its flips stay at most this."""
    kept, evaluations = list(best[0]), 0
    trials = ([group] if group and set(group) <= set(kept) and len(kept) > len(group) else [])
    trials += [[n] for n in reversed(kept) if n not in group][:PRUNE_TRIES] if len(kept) > 1 else []
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
    per_node = [{"node": n, "sensitivity": float(sens.get(n, 0.0)), "macs": int(macs.get(n, 0)),
                 "macs_share": macs.get(n, 0) / total} for n in best[0]]
    return FallbackResult(list(best[0]), first, best[1], ranking, evaluations, met,
                          sum(macs.get(n, 0) for n in best[0]) / total, per_node)
