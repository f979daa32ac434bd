"""Per-stretch peak memory, and the whole-process peak kept across the meter's resets."""
from __future__ import annotations

import numpy as np
import pytest

from vitexport.memory import PeakMeter, process_peak_bytes


def _touch(mb: int) -> None:
    a = np.ones(mb * 2**20 // 8)
    a += 1
    del a


def test_laps_measure_their_own_stretch_and_the_process_keeps_the_max():
    meter = PeakMeter()
    if not meter.exact:
        pytest.skip("the kernel's high-water mark cannot be reset here")
    _touch(300)
    big = meter.lap()
    _touch(20)
    small = meter.lap()
    assert big - small > 200 * 2**20  # the second lap does not inherit the first one's peak
    assert process_peak_bytes() >= big  # ...but the process peak remembers it
