"""The bench's quantize-time table (issue 30): vitexport's quantize stage beside nncf.quantize at 128 and 256
samples, with the ratio, the whole export's time and the load, and the done-when rows at both counts."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))  # ``bench`` is a top-level folder, not part of the package
from bench.plan import cases_plan  # noqa: E402
from bench.report_cases import _checks, _R, speed_lines  # noqa: E402


def _records() -> dict:
    def vx(q, whole, load):
        return {"ok": True, "load_before": [load], "data": {"seconds": whole, "stage_seconds": {"quantize_int8": q}}}

    def nncf(q, load):
        return {"ok": True, "load_before": [load], "data": {"quantize_s": q}}

    return {"vx|vit_base_outlier|128": vx(60.0, 180.0, 1.5), "nncf|vit_base_outlier|128": nncf(120.0, 1.7),
            "vx|vit_base_outlier|256": vx(150.0, 270.0, 2.0), "nncf|vit_base_outlier|256": nncf(100.0, 2.1)}


def test_speed_table_shows_both_counts_with_ratio_whole_time_and_load():
    lines = speed_lines(_records(), cases_plan())
    rows = [ln for ln in lines if ln.startswith("| vit_base_outlier")]
    assert rows == ["| vit_base_outlier | 128 | 60.0 s | 120 s | ×0.50 | 180 s | 1.5 / 1.7 |",
                    "| vit_base_outlier | 256 | 150 s | 100 s | ×1.50 | 270 s | 2.0 / 2.1 |"]


def test_done_when_judges_quantize_time_at_both_counts():
    rows = [ln for ln in _checks(_R(_records()), cases_plan()) if "no slower than NNCF" in ln]
    assert len(rows) == 2
    assert "128 samples" in rows[0] and rows[0].endswith("**met** |") and "(×0.50)" in rows[0]
    assert "256 samples" in rows[1] and rows[1].endswith("**not met** |")
