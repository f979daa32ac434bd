"""What this machine's CPU does to INT8 arithmetic: the host runtimes' parity depends on it.

x86 CPUs without VNNI (AVX2, AVX-512 before Cascade Lake, AMD before Zen 4) compute a u8 x s8 dot
product with ``vpmaddubsw``, whose pairwise sums saturate at int16: 255 x 127 x 2 overflows, so
OpenVINO's CPU plugin and ONNX Runtime's integer kernels clip whenever two large activations meet two
large weights (OpenVINO's "saturation issue"; ONNX Runtime's ``reduce_range``). 7-bit weights
(|q| <= 63) keep every pair sum inside int16 on any CPU. VNNI (``vpdpbusd``) and AMX accumulate in int32.
"""
from __future__ import annotations

import functools
import platform
from pathlib import Path

__all__ = ["int8_dot_saturates", "cpu_int8_isa"]

#: /proc/cpuinfo flags of the instructions that accumulate u8 x s8 products in int32
_VNNI = ("avx512_vnni", "avx_vnni", "amx_int8")


@functools.lru_cache(maxsize=1)
def _x86_flags() -> frozenset[str] | None:
    """This x86 CPU's flags (None: not x86, or not readable here)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return None
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), None)
    return frozenset(line.split(":", 1)[1].split()) if line else None


def cpu_int8_isa() -> str:
    """The instruction the host's INT8 kernels multiply with: 'VNNI', 'AVX2, no VNNI', 'SSE, no VNNI' or 'unknown'."""
    flags = _x86_flags()
    if flags is None:
        return "unknown"
    return "VNNI" if flags & set(_VNNI) else ("AVX2, no VNNI" if "avx2" in flags else "SSE, no VNNI")


def int8_dot_saturates() -> bool:
    """True where this CPU is x86 without VNNI/AMX: its u8 x s8 int16 pair sums saturate on 8-bit weights."""
    flags = _x86_flags()
    return flags is not None and not flags & set(_VNNI)
