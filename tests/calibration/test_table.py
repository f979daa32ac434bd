"""The scale table (calibration.json) and the TensorRT calibration cache."""
from __future__ import annotations

import struct

import pytest

from vitexport.calibration.table import ScaleTable, hex_to_scale, read_trt_cache, scale_to_hex, write_trt_cache
from vitexport.errors import BadInput


def test_trt_cache_format(tmp_path):
    p = write_trt_cache(tmp_path / "calibration.cache", {"b": 0.5, "a:0": 1.0 / 127})
    lines = p.read_text().splitlines()
    assert lines[0] == "TRT-8501-EntropyCalibration2"
    assert lines[1] == f"a:0: {struct.pack('>f', 1.0 / 127).hex()}"
    assert lines[2] == "b: 3f000000"
    header, scales = read_trt_cache(p)
    assert scales == {"a:0": pytest.approx(1.0 / 127), "b": 0.5}
    assert hex_to_scale(scale_to_hex(0.0123)) == pytest.approx(0.0123)


def test_table_round_trip_and_match(tmp_path):
    t = ScaleTable(method="percentile", num_samples=64, model_hash="m" * 64, data_hash="d" * 16,
                   settings={"target": "orin", "percentile": 99.99},
                   tensors={"x": {"amax": 2.0, "scale": 2.0 / 127, "lo": -1.0, "hi": 2.0, "min": -1.0, "max": 2.0}},
                   equalization={"ln": [1.0, 2.0]})
    t.save(tmp_path / "calibration.json")
    u = ScaleTable.load(tmp_path / "calibration.json")
    assert u.tensors == t.tensors and u.equalization == t.equalization and u.num_samples == 64
    assert u.matches("m" * 64, "d" * 16, "percentile", {"target": "orin", "percentile": 99.99})
    assert not u.matches("m" * 64, "e" * 16, "percentile", {"target": "orin", "percentile": 99.99})
    assert not u.matches("m" * 64, "d" * 16, "entropy", {"target": "orin", "percentile": 99.99})
    assert not u.matches("m" * 64, "d" * 16, "percentile", {"target": "orin", "percentile": 99.9})


def test_unreadable_table(tmp_path):
    (tmp_path / "c.json").write_text("{not json")
    with pytest.raises(BadInput):
        ScaleTable.load(tmp_path / "c.json")
    (tmp_path / "d.json").write_text('{"version": 99}')
    with pytest.raises(BadInput, match="version"):
        ScaleTable.load(tmp_path / "d.json")
    (tmp_path / "e.json").write_text('{"version": 1, "method": "minmax", "unknown": 3}')
    with pytest.raises(BadInput, match="e.json"):  # a table missing keys or with unknown ones
        ScaleTable.load(tmp_path / "e.json")
