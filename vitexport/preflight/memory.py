"""Memory a run will need, estimated before anything is allocated, against what the machine has.

The estimates are rough on purpose (they only have to catch the orders of magnitude: an input
shape of 100000 x 100000, a batch of 10⁹, a billion histogram bins); each names the setting that
changes it, so the one-line error says what to do.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BadInput, ResourceLimit

if TYPE_CHECKING:  # pragma: no cover - torch is imported only by the estimates that need it
    import torch
    from torch import nn

__all__ = ["Need", "available_memory", "require", "forward_need", "histogram_need", "format_bytes", "MEMORY_ENV"]

#: environment variable capping the memory vitexport plans with (``8G``, ``512M``, bytes):
#: for machines shared with other jobs, where "available" overstates what this run may take
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
    """Bytes this process can still allocate: the least of ``MemAvailable``, the cgroup's headroom
    and ``VITEXPORT_MEMORY_LIMIT``; None where none of them can be read."""
    known = [v for v in (_meminfo_available(), _env_limit()) if v is not None]
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
    raise ResourceLimit(
        f"{prefix}{big.what} needs about {format_bytes(big.nbytes)} of memory"
        + (f" ({format_bytes(total)} in all)" if total > big.nbytes * 1.05 else "")
        + f", this machine has {format_bytes(avail)} available; {big.setting}"
    )


def _heads(model: "nn.Module") -> int:
    heads = [getattr(m, a) for m in model.modules() for a in ("num_heads", "num_attention_heads", "heads")
             if isinstance(getattr(m, a, None), int) and getattr(m, a) > 0]
    return max(heads, default=0)


def _patch_conv(model: "nn.Module") -> "nn.Conv2d | None":
    """The first convolution: a ViT's patch embedding (stride = kernel), a CNN's stem."""
    from torch import nn  # torch on first use: preflight loads with calibration, which ONNX-only work imports

    return next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)


def forward_need(model: "nn.Module", shapes: dict[str, tuple[int, ...]], dtypes: "dict[str, torch.dtype]",
                 setting: str) -> list[Need]:
    """What one forward over inputs of ``shapes`` needs: the inputs, and the largest activation
    (a ViT's attention matrix over its tokens, or a CNN stem's output)."""
    import torch  # torch on first use: preflight loads with calibration, which ONNX-only work imports

    needs = []
    for name, shape in shapes.items():
        itemsize = torch.empty((), dtype=dtypes[name]).element_size()
        needs.append(Need(f"input '{name}' of shape {','.join(map(str, shape))}", math.prod(shape) * itemsize, setting))
    image = next((s for s in shapes.values() if len(s) == 4), None)
    heads = _heads(model)
    if image is not None:
        conv = _patch_conv(model)
        if conv is not None:
            sh, sw = conv.stride if isinstance(conv.stride, tuple) else (conv.stride, conv.stride)
            tokens = max(image[2] // max(sh, 1), 1) * max(image[3] // max(sw, 1), 1)
            acts = image[0] * tokens * conv.out_channels * 4 * 8  # stem output, MLP hidden, residuals
            if heads:
                acts = max(acts, image[0] * heads * tokens * tokens * 4 * 3)  # scores, softmax, a copy
            needs.append(Need(f"one forward pass on input shape {','.join(map(str, image))} ({tokens} tokens or "
                              "positions per image)", acts, setting))
    else:
        seq = next((s for s in shapes.values() if len(s) == 2), None)
        if seq is not None and heads:
            needs.append(Need(f"attention on input shape {seq[0]},{seq[1]}", seq[0] * heads * seq[1] ** 2 * 4 * 3, setting))
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
