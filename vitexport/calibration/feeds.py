"""Samples cut into the batches a model takes: the one place feeds are batched.

A fixed-shape model takes exactly its static batch per call. :class:`FeedSet` re-cuts any
:class:`~.data.SampleSet` into such batches, padding the last one by repeating its last sample, and
remembers how many samples are real so outputs can be trimmed back (:meth:`FeedSet.trim`): what
calibration and the fallback need (every sample seen). A model with a dynamic batch gets
``batch_size`` samples per call and no padding. :meth:`FeedSet.whole_batches` is what a parity
comparison needs instead: only samples that fill whole batches, so none is counted twice.
:func:`feed_size` is the number of samples in one feed.

:func:`split_samples` carves a held-out part off a sample set (the fallback chooses its float layers
on it, never on the data the parity gate scores).
"""
from __future__ import annotations

import hashlib
from typing import Iterator

import numpy as np
import onnx
import onnx_ir as ir

from .data import NpzSamples, SampleSet, feed_size

__all__ = ["FeedSet", "feed_size", "static_batch", "split_samples", "SliceSamples"]


def static_batch(model: ir.Model | onnx.ModelProto) -> int | None:
    """The first data input's fixed batch size, or None when it is dynamic."""
    if isinstance(model, onnx.ModelProto):
        inits = {i.name for i in model.graph.initializer}
        for i in model.graph.input:
            if i.name not in inits:
                dims = i.type.tensor_type.shape.dim
                return int(dims[0].dim_value) if dims and dims[0].HasField("dim_value") else None
        return None
    for v in model.graph.inputs:
        if v.is_initializer():
            continue
        dims = tuple(v.shape) if v.shape is not None else ()
        return dims[0] if dims and isinstance(dims[0], int) else None
    return None


class FeedSet:
    """``samples`` as the feeds a model with static batch ``batch`` takes.

    Args:
        samples: the samples.
        batch: the model's static batch (see :func:`static_batch`); None for a dynamic batch.
        batch_size: samples per feed when the batch is dynamic (and read-ahead otherwise).
    """

    def __init__(self, samples: SampleSet, batch: int | None = None, batch_size: int = 8):
        self.samples = samples
        self.batch = batch
        self.batch_size = batch or batch_size
        self.labels = samples.labels

    @classmethod
    def for_model(cls, samples: SampleSet, model: ir.Model | onnx.ModelProto, batch_size: int = 8) -> "FeedSet":
        return cls(samples, static_batch(model), batch_size)

    def __len__(self) -> int:
        """Real samples (padding excluded)."""
        return len(self.samples)

    @property
    def num_batches(self) -> int:
        return -(-len(self) // self.batch_size) if len(self) else 0

    @property
    def padded(self) -> int:
        """Samples added to fill the last static batch."""
        return self.num_batches * self.batch_size - len(self) if self.batch else 0

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if self.batch is None:
            yield from self.samples.batches(self.batch_size)
            return
        pending: dict[str, list[np.ndarray]] = {}
        count = 0
        for feed in self.samples.batches(max(self.batch_size, 8)):
            for k, v in feed.items():
                pending.setdefault(k, []).append(v)
            count += feed_size(feed)
            while count >= self.batch:
                cat = {k: np.concatenate(v) if len(v) > 1 else v[0] for k, v in pending.items()}
                yield {k: v[: self.batch] for k, v in cat.items()}
                pending = {k: [v[self.batch :]] for k, v in cat.items()}
                count -= self.batch
        if count:
            cat = {k: np.concatenate(v) if len(v) > 1 else v[0] for k, v in pending.items()}
            reps = self.batch - count
            yield {k: np.concatenate([v, np.repeat(v[-1:], reps, axis=0)]) for k, v in cat.items()}

    def trim(self, outputs: np.ndarray) -> np.ndarray:
        """Outputs concatenated over :meth:`__iter__`'s feeds, without the padding rows."""
        return outputs[: len(self)]

    def whole_batches(self) -> SampleSet:
        """The samples that fill whole static batches (the rest left out, never padded: a parity
        metric counts each sample once); fewer than one batch are repeated up to one.

        Returns:
            ``self.samples`` itself when nothing needs cutting, else a set of a multiple of ``batch``.
        """
        n, batch = len(self.samples), self.batch
        if not batch or batch == 1 or n % batch == 0:
            return self.samples
        if n >= batch:
            return SliceSamples(self.samples, 0, n - n % batch)
        whole = concat(self.samples)
        idx = np.arange(batch) % n
        labels = whole.labels[idx] if whole.labels is not None else None
        return NpzSamples({k: v[idx] for k, v in whole.arrays.items()}, labels, whole.source)


class SliceSamples(SampleSet):
    """Samples ``start:stop`` of another set, read lazily through its ``batches``."""

    def __init__(self, base: SampleSet, start: int, stop: int):
        self.base, self.start, self.stop = base, max(0, start), min(stop, len(base))
        self.input_names = list(base.input_names)
        self.labels = None if base.labels is None else base.labels[self.start : self.stop]
        self.source = base.source

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        pos = 0
        for feed in self.base.batches(batch_size):
            n = feed_size(feed)
            lo, hi = max(self.start - pos, 0), min(self.stop - pos, n)
            pos += n
            if hi > lo:
                yield {k: v[lo:hi] for k, v in feed.items()}
            if pos >= self.stop:
                return

    def fingerprint(self) -> str:
        return hashlib.sha256(f"{self.base.fingerprint()}:{self.start}:{self.stop}".encode()).hexdigest()[:16]


def split_samples(samples: SampleSet, holdout: int) -> tuple[SampleSet, SampleSet | None]:
    """``(rest, held_out)``: the last ``holdout`` samples set apart (None when there are too few).

    The sets vitexport loads are seeded random draws, so their tail is a random held-out part.
    At least three quarters of the samples stay for calibration.
    """
    n = len(samples)
    k = min(holdout, n // 4)
    if k < 1:
        return samples, None
    return SliceSamples(samples, 0, n - k), SliceSamples(samples, n - k, n)


def concat(samples: SampleSet) -> NpzSamples:
    """All of ``samples`` in memory (small sets only: tests and parity subsets)."""
    parts: dict[str, list[np.ndarray]] = {}
    for feed in samples.batches(64):
        for k, v in feed.items():
            parts.setdefault(k, []).append(v)
    return NpzSamples({k: np.concatenate(v) for k, v in parts.items()}, samples.labels, samples.source)
