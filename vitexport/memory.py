"""Peak resident memory, per stage and for the whole process (Linux ``/proc``; None elsewhere).

The kernel keeps one high-water mark per process (``VmHWM``); writing ``5`` to
``/proc/self/clear_refs`` resets it. :class:`PeakMeter` resets it at a stage's start and reads it at
the end, so each stage gets its own peak, and remembers every reading, so :func:`process_peak_bytes`
still answers for the whole process after any number of resets.

Keeping it low: :func:`release_memory` hands freed heap pages back (``malloc_trim``), and inside
:func:`bounded_heap` large buffers are returned to the OS as soon as they are freed.
"""
from __future__ import annotations

import contextlib
import ctypes
from pathlib import Path
from typing import Iterator

__all__ = ["PeakMeter", "process_peak_bytes", "resident_bytes", "release_memory", "bounded_heap"]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_seen_peak = 0  # the largest high-water mark read before a reset


def _status_kb(key: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def resident_bytes() -> int | None:
    """Resident memory now (``VmRSS``)."""
    return _status_kb("VmRSS")


def process_peak_bytes() -> int | None:
    """The whole process's peak resident memory, across every :class:`PeakMeter` reset."""
    hwm = _status_kb("VmHWM")
    if hwm is None:
        try:  # resource is POSIX-only: imported where this fallback needs it
            import resource
            import sys

            r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return r if sys.platform == "darwin" else r * 1024  # bytes on macOS, KiB elsewhere
        except (ImportError, OSError):
            return None
    return max(hwm, _seen_peak)


class PeakMeter:
    """Peak resident memory of consecutive stretches of work.

    ``lap()`` returns the peak since the meter started or since the previous lap, and starts the
    next stretch; ``with PeakMeter() as m: ...`` measures one stretch into ``m.peak_bytes``. Where
    the high-water mark cannot be reset, a lap is the process peak so far (an upper bound) and
    ``exact`` is False.
    """

    def __init__(self) -> None:
        self.peak_bytes: int | None = None
        self.exact = _reset()

    def lap(self) -> int | None:
        global _seen_peak
        self.peak_bytes = _status_kb("VmHWM")
        if self.peak_bytes is not None:
            _seen_peak = max(_seen_peak, self.peak_bytes)
        self.exact = _reset()
        return self.peak_bytes

    def __enter__(self) -> PeakMeter:
        self.exact = _reset()
        return self

    def __exit__(self, *exc) -> None:
        self.lap()


def _reset() -> bool:
    """Remember the high-water mark, then reset it; False where it cannot be reset."""
    global _seen_peak
    before = _status_kb("VmHWM")
    if before is None:
        return False
    _seen_peak = max(_seen_peak, before)
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def release_memory() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them after large frees); no-op elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
#: inside :func:`bounded_heap`, allocations from this size on get their own mapping
MMAP_THRESHOLD_BYTES = 1 << 20
#: glibc's own ceiling for its dynamic threshold: buffers below it are recycled inside the heap
POOLED_THRESHOLD_BYTES = 32 << 20


def _mmap_threshold(nbytes: int) -> bool:
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, nbytes))
    except (OSError, AttributeError):
        return False


@contextlib.contextmanager
def bounded_heap() -> Iterator[None]:
    """Inside, a buffer of 1 MiB or more is its own mapping, handed back to the OS when freed; on
    exit buffers are recycled within the heap again (glibc's 32 MiB ceiling) and the heap is trimmed.
    No-op where glibc's ``mallopt`` is missing.

    For phases that open session after session on a large model: glibc raises its threshold after
    each large free, after which activation-sized buffers come from the heap and stay there (a
    ViT-B/16 fallback evaluation, a float then a Q/DQ session, kept ~0.35 GB it no longer used).
    Not for a whole run: torch's exporter and onnxsim make many weight-sized temporaries, and a
    mapping each makes them 1.7x slower.
    """
    bounded = _mmap_threshold(MMAP_THRESHOLD_BYTES)
    try:
        yield
    finally:
        if bounded:
            _mmap_threshold(POOLED_THRESHOLD_BYTES)
            release_memory()
