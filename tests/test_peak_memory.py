"""Per-stretch peak memory, and the whole-process peak kept across the meter's resets."""
from __future__ import annotations

from pathlib import Path

import pytest

_LAPS = """
import numpy as np
from vitexport.memory import PeakMeter, process_peak_bytes

def touch(mb):
    a = np.ones(mb * 2**20 // 8)
    a += 1
    del a

meter = PeakMeter()
if not meter.exact:
    print("inexact")
    raise SystemExit
touch(300)
big = meter.lap()
touch(20)
small = meter.lap()
print(big, small, process_peak_bytes())
"""


def test_laps_measure_their_own_stretch_and_the_process_keeps_the_max():
    # in a fresh process: one that already holds freed heap (a test worker after other tests) serves
    # the 300 MB from pages that are resident already, and its high-water mark does not move
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _LAPS], capture_output=True, text=True, check=True).stdout.split()
    if out == ["inexact"]:
        pytest.skip("the kernel's high-water mark cannot be reset here")
    big, small, peak = map(int, out)
    assert big - small > 200 * 2**20  # the second lap does not inherit the first one's peak
    assert peak >= big  # ...but the process peak remembers it


_CHURN = """
import sys
import numpy as np
from vitexport.memory import bounded_heap

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) * 1024

big = np.ones(20 << 20, np.uint8)
del big  # glibc raises its mmap threshold past 2 MiB: such buffers now come from the heap

def churn():
    keep, bufs = [], []
    for _ in range(64):
        bufs.append(np.ones(2 << 20, np.uint8))  # 2 MiB each, touched
        keep.append(np.ones(100 << 10, np.uint8))  # a live block above each one pins the heap
    before = anon()
    del bufs
    return before - anon(), keep

if sys.argv[1] == "bounded":
    with bounded_heap():
        freed, keep = churn()
else:
    freed, keep = churn()
print(freed)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssAnon from /proc")
def test_bounded_heap_hands_freed_buffers_back():
    import ctypes.util
    import subprocess
    import sys

    if not ctypes.util.find_library("c") or "glibc" not in " ".join(__import__("platform").libc_ver()):
        pytest.skip("glibc's mallopt is needed")

    def freed(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, check=True)
        return int(out.stdout.strip())

    total = 64 * (2 << 20)
    assert freed("bounded") > 0.9 * total  # each buffer was its own mapping: freeing it returned it
    assert freed("plain") < 0.5 * total  # glibc's own behaviour here: the freed buffers stay resident
