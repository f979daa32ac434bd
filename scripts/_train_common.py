"""Helpers the bench's training scripts share: determinism, splits, atomic writes of the outputs."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["ROOT", "deterministic", "split_indices", "save_outputs"]


def deterministic(seed: int) -> None:
    """Seed everything and pin one thread: the same script gives the same bytes on every run
    (a multi-threaded reduction may sum in another order; one thread never does)."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


def split_indices(n: int, sizes: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    """Disjoint index sets of the given sizes from one seeded permutation; ``"rest"`` gets the remainder."""
    order = np.random.default_rng(seed).permutation(n)
    out, start = {}, 0
    for name, size in sizes.items():
        out[name] = np.sort(order[start : start + size])
        start += size
    if start > n:
        raise ValueError(f"splits need {start} items, the data has {n}")
    out["rest"] = np.sort(order[start:])
    return out


def save_outputs(out: Path, state: dict[str, torch.Tensor], arrays: dict[str, dict[str, np.ndarray]], meta: dict) -> None:
    """``weights.safetensors``, one ``NAME.npz`` per split (uncompressed: vitexport reads rows from
    disk) and ``meta.json`` last, so a folder with ``meta.json`` is complete."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "weights.safetensors.tmp"
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp))
    os.replace(tmp, out / "weights.safetensors")
    for name, arrs in arrays.items():
        with open(out / f"{name}.npz.tmp", "wb") as fh:
            np.savez(fh, **arrs)
        os.replace(out / f"{name}.npz.tmp", out / f"{name}.npz")
    (out / "meta.json.tmp").write_text(json.dumps(meta, indent=1))
    os.replace(out / "meta.json.tmp", out / "meta.json")
