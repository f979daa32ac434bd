"""Run a float ONNX model over a sample set and feed chosen intermediate tensors to observers.

The tensors are exposed as extra graph outputs of an ONNX Runtime session and consumed batch by
batch, so nothing is kept across batches. When the tensors of one batch would exceed
``budget_bytes`` they are observed in chunks, one session (and one pass over the data) per chunk;
ONNX Runtime prunes the nodes a chunk does not need.
"""
from __future__ import annotations

from typing import Iterator, Protocol

import numpy as np
import onnx
import onnxruntime as ort

from ..errors import BadInput
from .data import SampleSet
from .progress import progress
from .session import FloatSession, session_options

__all__ = ["Observer", "collect", "model_batches", "make_session", "static_batch"]

DEFAULT_BUDGET = 384 << 20


class Observer(Protocol):
    def update(self, x: np.ndarray) -> None: ...


def make_session(model: onnx.ModelProto | bytes | str, threads: int = 0, low_memory: bool = True,
                 config: dict[str, str] | None = None) -> ort.InferenceSession:
    """A CPU session on a complete model.

    Args:
        low_memory: no arena, no weight pre-packing.
        config: extra session config entries (e.g. ``session.disable_quant_qdq``).
    """
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    opts = session_options(threads, low_memory)
    for k, v in (config or {}).items():
        opts.add_session_config_entry(k, v)
    sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    del data
    return sess


def static_batch(model: onnx.ModelProto) -> int | None:
    """The first data input's fixed batch size, or None when it is dynamic."""
    init = {i.name for i in model.graph.initializer}
    for i in model.graph.input:
        if i.name in init:
            continue
        dims = i.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value"):
            return int(dims[0].dim_value)
        return None
    return None


def model_batches(samples: SampleSet, batch_size: int, model_batch: int | None) -> Iterator[dict[str, np.ndarray]]:
    """Batches of ``samples`` re-cut to the model's static batch (when it has one).

    A trailing remainder smaller than a static batch is padded by repeating its last sample, so every
    sample is seen; the padding counts twice in the statistics, which only a histogram notices.
    """
    if model_batch is None:
        yield from samples.batches(batch_size)
        return
    pending: dict[str, list[np.ndarray]] = {}
    count = 0
    for feed in samples.batches(max(batch_size, model_batch)):
        for k, v in feed.items():
            pending.setdefault(k, []).append(v)
        count += len(next(iter(feed.values())))
        while count >= model_batch:
            cat = {k: np.concatenate(v) if len(v) > 1 else v[0] for k, v in pending.items()}
            yield {k: v[:model_batch] for k, v in cat.items()}
            pending = {k: [v[model_batch:]] for k, v in cat.items()}
            count -= model_batch
    if count:
        cat = {k: np.concatenate(v) if len(v) > 1 else v[0] for k, v in pending.items()}
        reps = model_batch - count
        yield {k: np.concatenate([v, np.repeat(v[-1:], reps, axis=0)]) for k, v in cat.items()}


def _check_feed_shapes(model: onnx.ModelProto, names: list[str], samples: SampleSet) -> None:
    """BadInput when the samples' trailing dims or dtype kind disagree with the model's inputs."""
    first = next(iter(samples.batches(1)), None)
    if first is None:
        return
    for i in model.graph.input:
        if i.name not in names:
            continue
        tt = i.type.tensor_type
        want = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
        got = np.asarray(first[i.name])
        want_np = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if got.ndim != len(want) or any(w > 0 and w != g for w, g in zip(want[1:], got.shape[1:])):
            raise BadInput(f"calibration input '{i.name}' has samples of shape {tuple(got.shape[1:])}, "
                           f"the model wants {tuple(want[1:])}")
        if np.dtype(want_np).kind != got.dtype.kind and not (np.dtype(want_np).kind in "iu" and got.dtype.kind in "iub"):
            raise BadInput(f"calibration input '{i.name}' holds {got.dtype}, the model wants {np.dtype(want_np)}")


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


def collect(
    model: onnx.ModelProto,
    samples: SampleSet,
    observers: dict[str, list[Observer]],
    *,
    batch_size: int = 8,
    bytes_per_sample: dict[str, int] | None = None,
    budget_bytes: int = DEFAULT_BUDGET,
    threads: int = 0,
    description: str = "calibrating",
    weights: dict[str, np.ndarray] | None = None,
) -> int:
    """Feed each observed tensor of every batch to its observers.

    Args:
        model: the float model, or a skeleton whose large weights are in ``weights``
            (:mod:`vitexport.calibration.session`); it is not modified.
        samples: the calibration data.
        observers: tensor name → observers (``update(ndarray)``).
        batch_size: samples per run (re-cut to the model's static batch when it has one).
        bytes_per_sample: tensor name → bytes for one model batch, for chunking (0 if unknown).
        budget_bytes: most bytes of observed tensors fetched per run.
        weights: the skeleton's weights (None for a complete model).
    Returns:
        The number of samples seen.
    Raises:
        BadInput: the samples do not fit the model's inputs.
    """
    names = list(observers)
    model_batch = static_batch(model)
    chunks = _chunks(names, bytes_per_sample or {}, budget_bytes)
    n_runs = -(-len(samples) // (model_batch or batch_size)) if len(samples) else 0
    graph_inputs = [i.name for i in model.graph.input if i.name not in {x.name for x in model.graph.initializer}]
    missing = sorted(set(graph_inputs) - set(samples.input_names))
    if missing:
        raise BadInput(f"calibration data has no array for model input(s) {missing}; it has {samples.input_names}")
    _check_feed_shapes(model, graph_inputs, samples)
    seen = 0
    with progress(description, n_runs * len(chunks)) as bar:
        for ci, chunk in enumerate(chunks):
            sess = FloatSession(model, weights or {}, outputs=chunk, threads=threads)
            for feed in model_batches(samples, batch_size, model_batch):
                feed = {k: v for k, v in feed.items() if k in graph_inputs}
                outs = sess.run(chunk, feed)
                for name, value in zip(chunk, outs):
                    for ob in observers[name]:
                        ob.update(value)
                del outs
                if ci == 0:
                    seen += len(next(iter(feed.values())))
                bar.advance()
            del sess
    return min(seen, len(samples)) if model_batch else seen
