"""Calibration / parity data: ``.npz`` files (one array per model input, optional ``y`` labels).

A :class:`SampleSet` yields batches lazily, so memory does not grow with the number of samples.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import BadInput

__all__ = ["SampleSet", "NpzSamples", "load_samples", "random_samples"]


class SampleSet:
    """Base: ``input_names``, ``len()``, ``batches(batch_size)``, ``labels`` (or None), ``fingerprint()``."""

    input_names: list[str]
    labels: np.ndarray | None = None
    source: str = ""

    def __len__(self) -> int:
        raise NotImplementedError

    def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        raise NotImplementedError

    def fingerprint(self) -> str:
        raise NotImplementedError


@dataclass
class NpzSamples(SampleSet):
    arrays: dict[str, np.ndarray]
    labels: np.ndarray | None = None
    source: str = ""
    input_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.input_names = list(self.arrays)

    def __len__(self) -> int:
        return int(next(iter(self.arrays.values())).shape[0])

    def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        n = len(self)
        for i in range(0, n, batch_size):
            yield {k: v[i : i + batch_size] for k, v in self.arrays.items()}

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for k in sorted(self.arrays):
            h.update(k.encode())
            h.update(np.ascontiguousarray(self.arrays[k]).tobytes())
        return h.hexdigest()[:16]


def _check_shapes(arrays: dict[str, np.ndarray], example: dict[str, "np.ndarray"], path: Path) -> dict[str, np.ndarray]:
    names = list(example)
    if len(names) == 1 and names[0] not in arrays and "x" in arrays:
        arrays = {names[0]: arrays["x"]}
    missing = [n for n in names if n not in arrays]
    if missing:
        raise BadInput(f"{path}: no array for model input(s) {missing}; the file has {sorted(arrays)}")
    out = {}
    for n in names:
        a, want = arrays[n], tuple(example[n].shape)
        if a.ndim != len(want) or tuple(a.shape[1:]) != want[1:]:
            raise BadInput(f"{path}: array '{n}' has shape {tuple(a.shape)}, the model input wants (N, {', '.join(map(str, want[1:]))})")
        out[n] = a.astype(np.asarray(example[n]).dtype, copy=False)
    lengths = {a.shape[0] for a in out.values()}
    if len(lengths) != 1:
        raise BadInput(f"{path}: inputs have different sample counts {sorted(lengths)}")
    return out


def load_samples(path: str | Path, example_inputs: dict, *, num_samples: int | None = None, seed: int = 0) -> SampleSet:
    """Load samples for a model whose inputs look like ``example_inputs`` (name → tensor/array).

    Args:
        path: an ``.npz`` file.
        example_inputs: the model's example inputs (names, trailing shapes, dtypes).
        num_samples: keep at most this many, chosen by a seeded permutation (deterministic).
        seed: the sampling seed.
    Raises:
        BadInput: missing/unreadable file, wrong names or shapes.
    """
    p = Path(path)
    if not p.exists():
        raise BadInput(f"data path not found: {p}")
    example = {k: (v.numpy() if hasattr(v, "numpy") else np.asarray(v)) for k, v in example_inputs.items()}
    if p.suffix != ".npz":
        raise BadInput(f"{p}: unsupported data (expected an .npz file or an image folder)")
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError) as exc:
        raise BadInput(f"{p}: not a readable .npz file ({str(exc).splitlines()[0][:120]})") from None
    labels = arrays.pop("y", None)
    inputs = _check_shapes(arrays, example, p)
    n = len(next(iter(inputs.values())))
    if n == 0:
        raise BadInput(f"{p}: holds no samples")
    if labels is not None and len(labels) != n:
        raise BadInput(f"{p}: 'y' has {len(labels)} labels for {n} samples")
    if num_samples is not None and num_samples < n:
        idx = np.sort(np.random.default_rng(seed).permutation(n)[:num_samples])
        inputs = {k: v[idx] for k, v in inputs.items()}
        labels = labels[idx] if labels is not None else None
    return NpzSamples(inputs, labels, str(p))


def random_samples(example_inputs: dict, num_samples: int, seed: int = 0) -> NpzSamples:
    """Seeded synthetic samples shaped like ``example_inputs`` (used only when no data is given)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for k, v in example_inputs.items():
        a = v.numpy() if hasattr(v, "numpy") else np.asarray(v)
        shape = (num_samples, *a.shape[1:])
        if np.issubdtype(a.dtype, np.integer):
            hi = max(int(a.max()) + 1, 2)
            arrays[k] = rng.integers(0, hi, size=shape).astype(a.dtype) if "mask" not in k else np.ones(shape, a.dtype)
        else:
            arrays[k] = rng.standard_normal(shape).astype(a.dtype)
    return NpzSamples(arrays, None, "synthetic")
