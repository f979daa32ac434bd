"""Run a float model over a sample set and feed chosen intermediate tensors to observers.

The tensors are exposed as extra graph outputs of an ONNX Runtime session and consumed batch by
batch, so nothing is kept across batches. When the tensors of one batch would exceed
``budget_bytes`` they are observed in chunks, one session (and one pass over the data) per chunk;
ONNX Runtime prunes the nodes a chunk does not need.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Protocol

import numpy as np
import onnx_ir as ir

from ..runners.sessions import CALIBRATION, LOW_MEMORY, Session
from ..errors import BadInput
from ..graph.query import static_shape
from .data import SampleSet
from .feeds import FeedSet, feed_size
from .observers import MinMaxObserver
from .progress import progress

__all__ = ["Observer", "collect", "collect_absmax", "check_samples", "DEFAULT_BUDGET"]

DEFAULT_BUDGET = 384 << 20


class Observer(Protocol):
    def update(self, x: np.ndarray) -> None: ...


def _data_inputs(model: ir.Model) -> list[ir.Value]:
    return [v for v in model.graph.inputs if not v.is_initializer()]


def check_samples(model: ir.Model, samples: SampleSet, what: str = "calibration") -> None:
    """BadInput when the samples lack a model input or disagree with its trailing dims or dtype kind."""
    names = [v.name for v in _data_inputs(model)]
    missing = sorted(set(names) - set(samples.input_names))
    if missing:
        raise BadInput(f"{what} data has no array for model input(s) {missing}; it has {samples.input_names}")
    first = next(iter(samples.batches(1)), None)
    if first is None:
        return
    for v in _data_inputs(model):
        want = tuple(d if isinstance(d, int) else -1 for d in (v.shape or ()))
        got = np.asarray(first[v.name])
        if got.ndim != len(want) or any(w > 0 and w != g for w, g in zip(want[1:], got.shape[1:])):
            raise BadInput(f"{what} input '{v.name}' has samples of shape {tuple(got.shape[1:])}, "
                           f"the model wants {tuple(want[1:])}")
        want_np = v.dtype.numpy() if v.dtype is not None else np.dtype(np.float32)
        if np.dtype(want_np).kind != got.dtype.kind and not (np.dtype(want_np).kind in "iu" and got.dtype.kind in "iub"):
            raise BadInput(f"{what} input '{v.name}' holds {got.dtype}, the model wants {np.dtype(want_np)}")


def _chunks(names: list[str], sizes: dict[str, int], budget: int) -> list[list[str]]:
    out: list[list[str]] = []
    cur: list[str] = []
    total = 0
    for n in names:
        s = sizes.get(n, 0)
        if cur and total + s > budget:
            out.append(cur)
            cur, total = [], 0
        cur.append(n)
        total += s
    if cur:
        out.append(cur)
    return out


def _batch_bytes(model: ir.Model, names: list[str]) -> dict[str, int]:
    values = ir.convenience.create_value_mapping(model.graph)
    out = {}
    for n in names:
        shape = static_shape(values.get(n))
        out[n] = int(np.prod(shape, dtype=np.int64)) * 4 if shape else 0
    return out


def collect(
    model: ir.Model,
    samples: SampleSet,
    observers: dict[str, list[Observer]],
    *,
    batch_size: int = 8,
    budget_bytes: int = DEFAULT_BUDGET,
    threads: int = 0,
    description: str = "calibrating",
    on_run: Callable[[int], None] | None = None,
) -> int:
    """Feed each observed tensor of every batch to its observers.

    Args:
        model: the float model (not modified; its weights are fed to ONNX Runtime without a copy).
        samples: the calibration data.
        observers: tensor name → observers (``update(ndarray)``).
        batch_size: samples per run when the model's batch is dynamic.
        budget_bytes: most bytes of observed tensors fetched per run (more: one pass per chunk).
        threads: ONNX Runtime intra-op threads (0: its default).
        on_run: called after each ``session.run`` with the samples it carried (a caller's profile).
    Returns:
        The number of samples seen.
    Raises:
        BadInput: the samples do not fit the model's inputs.
    """
    check_samples(model, samples)
    names = list(observers)
    feeds = FeedSet.for_model(samples, model, batch_size)
    chunks = _chunks(names, _batch_bytes(model, names), budget_bytes)
    config = replace(CALIBRATION, threads=threads)
    with progress(description, feeds.num_batches * len(chunks)) as bar:
        for chunk in chunks:
            sess = Session(model, config, outputs=chunk)
            for feed in feeds:
                for name, value in zip(chunk, sess.run(chunk, feed)):
                    for ob in observers[name]:
                        ob.update(value)
                if on_run is not None:
                    on_run(feed_size(feed))
                bar.advance()
            del sess
    return len(feeds)


def _reductions(model: ir.Model, names: list[str]) -> tuple[list[ir.Node], dict[str, str]]:
    """``ReduceMax(Abs(t))`` nodes appended to ``model`` for each named tensor of known, non-empty static
    shape; returns the nodes (to remove again) and tensor → the scalar output's name."""
    values = ir.convenience.create_value_mapping(model.graph)
    nodes: list[ir.Node] = []
    scalars: dict[str, str] = {}
    for i, name in enumerate(names):
        shape = static_shape(values.get(name))
        if not shape or not all(d > 0 for d in shape):
            continue
        a = ir.Node("", "Abs", [values[name]], name=f"vitexport_absmax_abs_{i}")
        r = ir.Node("", "ReduceMax", [a.outputs[0]], attributes=[ir.AttrInt64("keepdims", 0)],
                    name=f"vitexport_absmax_{i}")
        a.outputs[0].name, r.outputs[0].name = f"vitexport_absmax_abs_{i}", f"vitexport_absmax_{i}"
        r.outputs[0].dtype = a.outputs[0].dtype = ir.DataType.FLOAT
        nodes += [a, r]
        scalars[name] = r.outputs[0].name
    return nodes, scalars


def collect_absmax(model: ir.Model, samples: SampleSet, names: list[str], *, batch_size: int = 8,
                   budget_bytes: int = DEFAULT_BUDGET, threads: int = 0, description: str = "ranges",
                   on_run: Callable[[int], None] | None = None) -> dict[str, float]:
    """Largest finite ``|value|`` of each named float tensor over ``samples`` (tensors never seen, or
    empty, are left out), as :class:`~.observers.MinMaxObserver` would give it.

    The maxima are reduced inside the graph (``ReduceMax(Abs(t))`` appended for the session, removed
    again), so each run hands back one scalar per tensor instead of every tensor: ViT-B/16's float16
    evidence, ~600 tensors, is one pass of plain runs instead of two passes fetching ~0.4 GB a sample. A
    tensor with a non-finite value (a mask filled with −inf) or without a static shape is observed the
    fetching way (:func:`collect`), which skips non-finite values.
    """
    check_samples(model, samples)
    nodes, scalars = _reductions(model, names)
    out: dict[str, float] = {}
    bad: set[str] = set()
    if scalars:
        model.graph.extend(nodes)
        try:
            sess = Session(model, replace(LOW_MEMORY, threads=threads), outputs=list(scalars.values()))
        finally:
            model.graph.remove(nodes, safe=True)
        feeds = FeedSet.for_model(samples, model, batch_size)
        with progress(description, feeds.num_batches) as bar:
            for feed in feeds:
                for t, v in zip(scalars, sess.run(list(scalars.values()), feed)):
                    v = float(v)
                    if not np.isfinite(v):
                        bad.add(t)
                    elif v > out.get(t, -1.0):
                        out[t] = v
                if on_run is not None:
                    on_run(feed_size(feed))
                bar.advance()
        del sess
    rest = [n for n in names if n not in scalars or n in bad]
    if rest:
        observers = {t: [MinMaxObserver()] for t in rest}
        collect(model, samples, observers, batch_size=batch_size, budget_bytes=budget_bytes, threads=threads,
                description=description, on_run=on_run)
        for t, (ob,) in observers.items():
            out.pop(t, None)
            if ob.count:
                out[t] = max(abs(ob.min), abs(ob.max))
    return {n: out[n] for n in names if n in out}
