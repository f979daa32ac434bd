"""Ranges of the Q/DQ pairs RKNN's INT8 layout adds (:func:`.routes.qdq_layout`), measured on calibration samples.

The pairs the layout adds (a Linear's or a Conv's output, Q·Kᵀ scores) have no range from vitexport's
quantizer: their tensors were float in its Q/DQ file. One pass of ONNX Runtime over the calibration feeds
measures, per tensor:

- the per-channel (last axis) min and max, whose extremes are its range (:class:`.outliers.ScaledLinearOutputs`
  reads the channels of a Linear's output);
- where the tensor's only reader is an element-wise activation (a Conv's SiLU: RKNN's ``ConvExSwish INT8`` needs
  the Conv's output Q/DQ'd *and* the SiLU's; a Linear's GELU; a HardSwish), a low end cut where the activation
  flattens the values: of the candidates between the minimum and zero, the one whose quantization error measured
  *after* the activation (mean squared, on sampled elements) is least. A SiLU maps [-13, -4] into [-0.07, 0], so
  the levels a min/max range spends there are levels the positive side lacks.

Measured on RKNN's simulator (rk3588, 256 held-out inputs; same weights and calibration samples; worst / mean
cosine, min/max → cut): the trained MobileViT-XXS of bench/results-npu.md 0.8857 / 0.9964 → 0.9158 / 0.9974,
EfficientViT-B0 0.8397 / 0.9949 → 0.9591 / 0.9971, the digits ViT 0.9965 → 0.9987; the text encoders within
±0.0006 (all-MiniLM-L6-v2 and all-mpnet-base-v2 unchanged in the worst case).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from ...graph.query import const_array
from ...runners.sessions import Session, SessionConfig
from .qdq import _qparams

__all__ = ["LayoutRanges", "activation_output", "measure_layout_ranges", "flattened_low", "ELEMENTWISE_OPS"]

#: element-wise ops an activation is written with (SiLU: Sigmoid, Mul; GELU: Div or Mul, Erf, Add, Mul; ...)
ELEMENTWISE_OPS = frozenset({"Sigmoid", "Mul", "Div", "Add", "Sub", "Erf", "Tanh", "HardSigmoid", "HardSwish", "Relu",
                             "Clip", "LeakyRelu", "Elu", "Softplus", "Neg", "Abs"})
#: most nodes an activation's chain may hold (GELU written out: 5)
MAX_CHAIN = 8
#: elements sampled per calibration feed and tensor for the low-end search
SAMPLES_PER_FEED = 4096
#: candidate low ends: these fractions of the measured minimum
LOW_FRACTIONS = np.linspace(1.0, 0.05, 20)


def _scalar(value: ir.Value | None) -> bool:
    arr = const_array(value)
    return arr is not None and arr.size == 1


def activation_output(value: ir.Value) -> ir.Value | None:
    """The output of the element-wise activation through which alone ``value`` is read (``value`` -> Sigmoid,
    Mul: SiLU; -> Div, Erf, Add, Mul, Mul: GELU), whatever reads that output; None when ``value`` has another
    reader, the chain holds a non-element-wise op or a non-scalar input from outside, or it leaves by more than
    one tensor."""
    chain: set[ir.Value] = {value}
    nodes: list[ir.Node] = []
    grown = True
    while grown:
        grown = False
        for v in list(chain):
            for node, _ in v.uses():
                if node in nodes or node.op_type not in ELEMENTWISE_OPS:
                    continue
                if all(i is None or i in chain or _scalar(i) for i in node.inputs) and len(nodes) < MAX_CHAIN:
                    nodes.append(node)
                    chain.update(node.outputs)
                    grown = True
    if not nodes or any(u not in nodes for u, _ in value.uses()):
        return None
    exits = [v for v in chain if v is not value and (v.is_graph_output() or any(u not in nodes for u, _ in v.uses()))]
    if len(exits) != 1 or exits[0].is_graph_output():
        return None
    return exits[0]


def flattened_low(x: np.ndarray, y: np.ndarray, lo: float, hi: float, zp_dtype: np.dtype) -> float:
    """The low end in [``lo``, 0) whose Q/DQ of ``x`` gives the least mean squared error after the activation
    that maps ``x`` to ``y`` element-wise (its function read off the samples themselves, interpolated)."""
    if lo >= 0.0 or x.size == 0:
        return lo
    order = np.argsort(x, kind="stable")
    xs, ys = x[order].astype(np.float64), y[order].astype(np.float64)
    best, best_lo = np.inf, lo
    for f in LOW_FRACTIONS:
        cand = lo * float(f)
        scale, zp = _qparams(cand, hi, zp_dtype)
        s, z = float(scale), float(zp)
        qmin, qmax = (0.0, 255.0) if np.dtype(zp_dtype) == np.uint8 else (-128.0, 127.0)
        q = (np.clip(np.round(xs / s) + z, qmin, qmax) - z) * s
        err = float(np.mean((np.interp(q, xs, ys) - ys) ** 2))
        if err < best:
            best, best_lo = err, cand
    return best_lo


@dataclass
class LayoutRanges:
    """Per-channel ranges and Q/DQ ranges of the tensors the layout adds pairs to (module docstring).

    Attributes:
        per_channel: name -> (per-channel min, per-channel max) over the last axis.
        ranges: name -> (lo, hi) each added pair holds.
        cut: name -> (the minimum, the low end cut to) where an activation's flat side was cut.
    """

    per_channel: dict[str, tuple[np.ndarray, np.ndarray]]
    ranges: dict[str, tuple[float, float]]
    cut: dict[str, tuple[float, float]]


def measure_layout_ranges(model: ir.Model, feeds: Iterable[Mapping[str, np.ndarray]], names: Sequence[str],
                          zp_dtype: np.dtype, seed: int = 0) -> LayoutRanges:
    """One pass of ONNX Runtime on ``model`` over ``feeds``: :class:`LayoutRanges` of ``names``."""
    if not names:
        return LayoutRanges({}, {}, {})
    values = {v.name: v for v in model.graph.inputs}
    values.update({o.name: o for n in model.graph for o in n.outputs})
    acts = {n: a.name for n in names if n in values and (a := activation_output(values[n])) is not None}
    fetch = list(dict.fromkeys([*names, *acts.values()]))
    known = [o.name for o in model.graph.outputs]
    sess = Session(model, SessionConfig(), outputs=known + [n for n in fetch if n not in known])
    rng = np.random.default_rng(seed)
    lo: dict[str, np.ndarray] = {}
    hi: dict[str, np.ndarray] = {}
    pairs: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {n: ([], []) for n in acts}
    for feed in feeds:
        got = dict(zip(fetch, sess.run(fetch, dict(feed))))
        for n in names:
            arr = np.asarray(got[n], np.float32)
            flat = arr.reshape(-1, arr.shape[-1]) if arr.ndim else arr.reshape(1, 1)
            a, b = flat.min(0), flat.max(0)
            lo[n] = np.minimum(lo[n], a) if n in lo else a
            hi[n] = np.maximum(hi[n], b) if n in hi else b
            if n in acts:
                x, y = arr.reshape(-1), np.asarray(got[acts[n]], np.float32).reshape(-1)
                if x.size != y.size:
                    continue
                idx = rng.choice(x.size, SAMPLES_PER_FEED, replace=False) if x.size > SAMPLES_PER_FEED else slice(None)
                pairs[n][0].append(x[idx])
                pairs[n][1].append(y[idx])
    per_channel = {n: (lo[n], hi[n]) for n in names if n in lo}
    ranges = {n: (float(a.min()), float(b.max())) for n, (a, b) in per_channel.items()}
    cut: dict[str, tuple[float, float]] = {}
    for n, (xs, ys) in pairs.items():
        if not xs or n not in ranges:
            continue
        lo_n, hi_n = ranges[n]
        new = flattened_low(np.concatenate(xs), np.concatenate(ys), lo_n, hi_n, zp_dtype)
        if new > lo_n:  # the channels' low ends too: a Linear's outlier channels are scaled from them
            ranges[n], cut[n] = (new, hi_n), (lo_n, new)
            per_channel[n] = (np.maximum(per_channel[n][0], np.float32(new)), per_channel[n][1])
    return LayoutRanges(per_channel, ranges, cut)
