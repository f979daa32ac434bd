"""Which calibration rows a tool gets: the seeded draw vitexport itself makes from an ``.npz``, shared by the
case preparation (:mod:`bench.cases`) and the child tasks (:mod:`bench.worker`)."""
from __future__ import annotations

import numpy as np

__all__ = ["select_calibration", "LABEL_KEYS", "inputs_only"]

#: an ``.npz``'s label arrays, never a model input: classes (or a detector's class per box) and a detector's boxes
LABEL_KEYS = ("y", "y_boxes")


def inputs_only(z) -> dict[str, np.ndarray]:
    """The model inputs of an open ``.npz`` (its label arrays left out)."""
    return {k: z[k] for k in z.files if k not in LABEL_KEYS}


def select_calibration(n_total: int, num_samples: int, seed: int = 0) -> np.ndarray:
    """The sample indices vitexport draws from an ``.npz`` (``calibration.data._load_npz``).

    The plain path is fed exactly the samples vitexport calibrates on: a sorted, seeded permutation.
    """
    if num_samples >= n_total:
        return np.arange(n_total)
    return np.sort(np.random.default_rng(seed).permutation(n_total)[:num_samples])
