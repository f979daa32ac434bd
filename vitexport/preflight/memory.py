"""Memory a run will need, estimated before anything is allocated, against what the machine has.

Inputs, histograms and references are counted exactly; one forward is measured on the model's own
geometry with fake tensors (:mod:`.geometry`). Each need names the setting that changes it, so the
one-line error says what to do, and ``VITEXPORT_MEMORY_LIMIT`` overrides what the machine reports
(either way) when the user knows better.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BadInput, ResourceLimit
from .geometry import forward_peak_bytes

if TYPE_CHECKING:  # pragma: no cover - torch is imported only by the estimates that need it
    import torch
    from torch import nn

__all__ = ["Need", "available_memory", "require", "forward_need", "histogram_need", "format_bytes", "MEMORY_ENV"]

#: environment variable setting the memory vitexport plans with (``8G``, ``512M``, bytes): lower
#: than the machine's on one shared with other jobs, higher to override a refusal the user knows
#: to be wrong
MEMORY_ENV = "VITEXPORT_MEMORY_LIMIT"
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclass(frozen=True)
class Need:
    """``nbytes`` needed by ``what``; ``setting`` is what the user changes to need less."""

    what: str
    nbytes: int
    setting: str


def format_bytes(n: float) -> str:
    """``1536`` → ``'1.5 KB'``; binary units, one decimal."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1024 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PB"  # pragma: no cover


def _env_limit() -> int | None:
    text = os.environ.get(MEMORY_ENV, "").strip().upper().removesuffix("B").removesuffix("I")
    if not text:
        return None
    unit = text[-1] if text[-1] in _UNITS else ""
    try:
        value = float(text[: len(text) - len(unit)]) * _UNITS[unit]
    except ValueError:
        raise BadInput(f"{MEMORY_ENV}={os.environ[MEMORY_ENV]!r}: expected a size like 8G, 512M or a byte count") from None
    return int(value)


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().split()[0]
    except (OSError, IndexError):
        return None
    return int(text) if text.isdigit() else None


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_memory() -> int | None:
    """Bytes this run may plan with: ``VITEXPORT_MEMORY_LIMIT`` when set (the user's word: a cap on
    a machine shared with other jobs, or more than the machine reports when they know the run fits,
    e.g. with swap), else the least of ``MemAvailable`` and the cgroup's headroom; None where none
    of them can be read."""
    stated = _env_limit()
    if stated is not None:
        return stated
    known = [v for v in (_meminfo_available(),) if v is not None]
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < 2**60:
            known.append(max(limit - usage, 0))
    return min(known) if known else None


def require(needs: list[Need], context: str = "") -> None:
    """Raise :class:`ResourceLimit` when the needs together exceed the available memory.

    The message names the largest need, its size and its setting.
    """
    avail = available_memory()
    total = sum(n.nbytes for n in needs)
    if avail is None or not needs or total <= avail:
        return
    big = max(needs, key=lambda n: n.nbytes)
    prefix = f"{context}: " if context else ""
    stated = os.environ.get(MEMORY_ENV, "").strip()
    has = f"{MEMORY_ENV}={stated} allows {format_bytes(avail)}" if stated else f"this machine has {format_bytes(avail)} available"
    raise ResourceLimit(
        f"{prefix}{big.what} needs about {format_bytes(big.nbytes)} of memory"
        + (f" ({format_bytes(total)} in all)" if total > big.nbytes * 1.05 else "")
        + f", {has}; {big.setting} (or set {MEMORY_ENV}=SIZE if you know it fits)"
    )


#: what one forward's peak costs the run, against the live tensors of a torch forward alone: the
#: TorchScript tracer, ONNX Runtime's arena (it plans all intermediates of a session) and a parity
#: session beside it
_FORWARD_FACTOR = 4


def forward_need(model: "nn.Module", shapes: dict[str, tuple[int, ...]], dtypes: "dict[str, torch.dtype]",
                 setting: str, keyword: bool = True) -> list[Need]:
    """What one forward over inputs of ``shapes`` needs: the inputs, and the tensors the forward
    keeps alive at once, measured on the model's own geometry with fake tensors
    (:func:`~.geometry.forward_peak_bytes`), times the tracer's and ONNX Runtime's copies.

    Args:
        model: the module as built; ``keyword``: its inputs are passed by name (else by position).
        shapes, dtypes: input name → shape / dtype.
        setting: what the user changes to need less (for the message).
    """
    import torch  # torch on first use: preflight loads with calibration, which ONNX-only work imports

    needs = []
    for name, shape in shapes.items():
        itemsize = torch.empty((), dtype=dtypes[name]).element_size()
        needs.append(Need(f"input '{name}' of shape {','.join(map(str, shape))}", math.prod(shape) * itemsize, setting))
    if sum(n.nbytes for n in needs) > (available_memory() or 2**62):
        return needs  # the inputs alone do not fit: no forward to measure
    peak = forward_peak_bytes(model, shapes, dtypes, keyword)
    if peak is not None:
        shown = "; ".join(f"{k} {','.join(map(str, s))}" for k, s in shapes.items())
        needs.append(Need(f"one forward pass on input shape {shown} ({format_bytes(peak)} of activations alive at "
                          "once, with the exporter's and ONNX Runtime's copies)", peak * _FORWARD_FACTOR, setting))
    return needs


def histogram_need(model: "nn.Module", num_bins: int, method: str) -> list[Need]:
    """Calibration histograms: ``2 * num_bins`` int64 counts (and float work arrays) for each
    observed tensor, about three per Linear / Conv layer."""
    from torch import nn  # torch on first use: preflight loads with calibration, which ONNX-only work imports

    if method == "minmax":
        return []
    layers = sum(1 for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)))
    tensors = 3 * max(layers, 1) + 1
    return [Need(f"calibration histograms ({tensors} tensors x {num_bins} bins)", tensors * num_bins * 2 * 8 * 2,
                 f"lower calibration.num_bins (now {num_bins}; 2048 is the default)")]
