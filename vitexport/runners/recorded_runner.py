"""Outputs an engine computed in another process, replayed behind the runner interface.

Some engines cannot be driven from here: RKNN's x86 simulator runs a model only inside the process
that built it (its worker, with its own numpy), so the worker computes every parity input at build
time. :func:`record_outputs` stores those outputs with a digest of each input; a
:class:`RecordedRunner` answers a feed only when its digest was recorded (any other feed is an
error, never a guess), so the pipeline's parity check gates the engine's own numbers.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..errors import BadInput
from ..io import atomic_path
from .base import BaseRunner, InputSpec

__all__ = ["RecordedRunner", "record_outputs", "feed_digest"]


def feed_digest(feed: Mapping[str, np.ndarray]) -> str:
    """A digest of a feed: its names, dtypes, shapes and bytes."""
    h = hashlib.sha256()
    for name in sorted(feed):
        arr = np.ascontiguousarray(feed[name])
        h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()[:32]


def record_outputs(path: str | Path, feeds: Sequence[Mapping[str, np.ndarray]], outputs: Sequence[Mapping[str, np.ndarray]],
                   engine: str) -> Path:
    """Write what ``engine`` returned for each feed (``outputs[i]`` for ``feeds[i]``) to ``path`` (``.npz``, atomic).

    Raises:
        ValueError: ``feeds`` and ``outputs`` differ in length.
    """
    if len(feeds) != len(outputs):
        raise ValueError(f"{len(feeds)} feeds but {len(outputs)} outputs")
    meta = {"engine": engine, "digests": [feed_digest(f) for f in feeds],
            "inputs": [[k, list(np.shape(v)[1:]), np.asarray(v).dtype.str] for k, v in feeds[0].items()] if feeds else [],
            "outputs": list(outputs[0]) if outputs else []}
    arrays = {f"o{i}_{j}": np.asarray(v) for i, out in enumerate(outputs) for j, v in enumerate(out.values())}
    with atomic_path(path, suffix=".npz") as tmp:
        np.savez(tmp, meta=np.array(json.dumps(meta)), **arrays)
    return Path(path)


class RecordedRunner(BaseRunner):
    """The outputs :func:`record_outputs` stored, one recorded feed at a time.

    Args:
        path: the ``.npz`` written by :func:`record_outputs`.
        name: the runner's name in reports (default: the recording engine's).
    """

    engine = "recorded"

    def __init__(self, path: str | Path, name: str | None = None):
        super().__init__(name)
        self.path = Path(path)
        self._meta: dict = {}
        self._index: dict[str, int] = {}
        self._arrays: dict[str, np.ndarray] = {}

    def activate_impl(self) -> None:
        if not self.path.is_file():
            raise BadInput(f"{self.path}: no recorded outputs (run the stage that records them)")
        with np.load(self.path) as z:
            self._meta = json.loads(str(z["meta"]))
            self._arrays = {k: z[k] for k in z.files if k != "meta"}
        self._index = {d: i for i, d in enumerate(self._meta["digests"])}
        self.engine = self._meta.get("engine", self.engine)
        if self.name == RecordedRunner.engine:
            self.name = self.engine

    def deactivate_impl(self) -> None:
        self._arrays = {}

    def input_specs_impl(self) -> list[InputSpec]:
        return [InputSpec(n, (-1, *shape), np.dtype(dt)) for n, shape, dt in self._meta.get("inputs", [])]

    def infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        i = self._index.get(feed_digest(feed))
        if i is None:
            raise BadInput(f"{self.path}: {self.engine} computed no output for this input (only the "
                           f"{len(self._index)} inputs it was run on are recorded)")
        return {name: self._arrays[f"o{i}_{j}"] for j, name in enumerate(self._meta["outputs"])}
