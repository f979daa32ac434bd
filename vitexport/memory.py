"""Peak resident memory, per stage and for the whole process (Linux ``/proc``; None elsewhere).

The kernel keeps one high-water mark per process (``VmHWM``); writing ``5`` to
``/proc/self/clear_refs`` resets it. :class:`PeakMeter` resets it at a stage's start and reads it at
the end, so each stage gets its own peak, and remembers every reading, so :func:`process_peak_bytes`
still answers for the whole process after any number of resets.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["PeakMeter", "process_peak_bytes", "resident_bytes"]

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
        try:
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        except (ImportError, OSError):
            return None
    return max(hwm, _seen_peak)


class PeakMeter:
    """Peak resident memory of one stretch of work: ``with PeakMeter() as m: ...; m.peak_bytes``.

    Where the high-water mark cannot be reset, ``peak_bytes`` is the process peak so far (an upper
    bound) and ``exact`` is False.
    """

    def __init__(self) -> None:
        self.peak_bytes: int | None = None
        self.exact = False

    def __enter__(self) -> PeakMeter:
        global _seen_peak
        before = _status_kb("VmHWM")
        if before is not None:
            _seen_peak = max(_seen_peak, before)
            try:
                _CLEAR_REFS.write_text("5")
                self.exact = True
            except OSError:
                self.exact = False
        return self

    def __exit__(self, *exc) -> None:
        global _seen_peak
        self.peak_bytes = _status_kb("VmHWM")
        if self.peak_bytes is not None:
            _seen_peak = max(_seen_peak, self.peak_bytes)
