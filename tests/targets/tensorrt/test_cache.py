"""TensorRT's calibration cache (calibration.cache), written from the scale table."""
from __future__ import annotations

import struct

import pytest

from vitexport.targets.tensorrt.cache import hex_to_scale, read_trt_cache, scale_to_hex, write_trt_cache


def test_trt_cache_format(tmp_path):
    p = write_trt_cache(tmp_path / "calibration.cache", {"b": 0.5, "a:0": 1.0 / 127})
    lines = p.read_text().splitlines()
    assert lines[0] == "TRT-8501-EntropyCalibration2"
    assert lines[1] == f"a:0: {struct.pack('>f', 1.0 / 127).hex()}"
    assert lines[2] == "b: 3f000000"
    header, scales = read_trt_cache(p)
    assert scales == {"a:0": pytest.approx(1.0 / 127), "b": 0.5}
    assert hex_to_scale(scale_to_hex(0.0123)) == pytest.approx(0.0123)
