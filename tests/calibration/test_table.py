"""The scale table (calibration.json)."""
from __future__ import annotations

import pytest

from vitexport.calibration.table import ScaleTable
from vitexport.errors import BadInput


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
