"""The bench harness itself (not the benchmark): child processes, memory cap, data, rendering.

Fast and model-free: the benchmark's figures come from ``make bench``, these check its plumbing.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # ``bench`` is a top-level folder, not part of the installed package
    sys.path.insert(0, str(ROOT))

from bench.plan import full_plan, quick_plan  # noqa: E402
from bench.proc import GB, run_child  # noqa: E402
from bench.report import render  # noqa: E402
from bench.splits import select_calibration  # noqa: E402


def test_child_reports_its_own_peak():
    res = run_child("alloc", {"mb": 200}, cap_bytes=4 * GB, timeout_s=120)
    assert res.ok, res.error
    assert 200 * 2**20 <= res.peak_bytes < 2 * GB


def test_child_above_cap_is_killed_and_says_so():
    res = run_child("alloc", {"mb": 600, "hold_s": 30}, cap_bytes=300 * 2**20, timeout_s=120)
    assert not res.ok and res.exceeded_cap
    assert res.error.startswith("exceeded")
    assert res.wall_s < 30


def test_failing_task_is_one_line():
    res = run_child("quality", {"onnx": "/nonexistent.onnx", "heldout": "/nonexistent.npz", "reference": "x"}, cap_bytes=4 * GB, timeout_s=120)
    assert not res.ok and "\n" not in res.error


def test_plain_path_draws_the_samples_vitexport_draws(tmp_path):
    """Same data for both paths: the bench's selection equals vitexport's ``.npz`` sampling."""
    import torch

    from vitexport.calibration import load_samples

    x = np.random.default_rng(1).standard_normal((20, 3, 4, 4)).astype(np.float32)
    np.savez(tmp_path / "c.npz", x=x)
    got = load_samples(tmp_path / "c.npz", {"x": torch.zeros(1, 3, 4, 4)}, num_samples=7, seed=0)
    ours = x[select_calibration(20, 7, seed=0)]
    theirs = np.concatenate([b["x"] for b in got.batches(7)])
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("plan", [quick_plan(), full_plan()], ids=["quick", "full"])
def test_render_shows_pairs_ratios_and_failures(plan):
    n = plan.num_samples
    model = plan.models[1]  # a timm model
    recs = {
        f"vx|{model}|orin|minmax|{n}": {"ok": True, "wall_s": 10.0, "peak_bytes": 1 * GB,
                                         "data": {"stage_seconds": {"export_onnx": 2.0, "simplify": 1.0, "quantize_int8": 5.0}}},
        f"plain|{model}|minmax|{n}": {"ok": True, "wall_s": 20.0, "peak_bytes": 2 * GB, "data": {"export_s": 2.0, "quantize_s": 15.0}},
        f"q|vx|{model}|orin|minmax|{n}": {"ok": True, "data": {"cosine_mean": 0.99, "cosine_min": 0.98, "top1_agreement": 0.9}},
        f"q|plain|{model}|minmax|{n}": {"ok": True, "data": {"cosine_mean": 0.90, "cosine_min": 0.8, "top1_agreement": 0.5}},
        f"plain|{model}|percentile|{n}": {"ok": False, "exceeded_cap": True, "cap_bytes": 18 * GB, "error": "exceeded 18.0 GB"},
        f"vx|{model}|orin|percentile|{n}": {"ok": False, "error": "RuntimeError: boom"},
    }
    md = render(plan, recs, {"date": "today", "versions": {}}, 18.0)
    assert "1.00 GB / 2.00 GB (0.50×)" in md
    assert "0.9900 / 0.9000 (1.10×)" in md
    assert "exceeded 18.0 GB" in md and "error: RuntimeError: boom" in md
    assert md.index("## Headline") < md.index("## Machine")


def test_latency_times_every_file_the_asked_number_of_times(tmp_path):
    """Blocks of timed runs per round still give each file exactly ``runs`` timings."""
    import onnx
    from onnx import TensorProto, helper

    for name, op in (("a", "Relu"), ("b", "Sigmoid")):
        g = helper.make_graph([helper.make_node(op, ["x"], ["y"])], name,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / f"{name}.onnx"))
    models = {"a": str(tmp_path / "a.onnx"), "b": str(tmp_path / "b.onnx")}
    res = run_child("latency", {"models": models, "runs": 7, "warmup": 1, "threads": 1, "block": 3},
                    cap_bytes=4 * GB, timeout_s=120)
    assert res.ok, res.error
    lat = res.data["latency"]
    assert set(lat) == {"a", "b"} and all(v["runs"] == 7 for v in lat.values())
    assert all(0 < v["p10_ms"] <= v["median_ms"] <= v["p90_ms"] for v in lat.values())


def test_a_reports_hand_written_tail_survives_rendering_again(tmp_path):
    from bench.run import KEPT, kept_tail

    report = tmp_path / "results.md"
    assert kept_tail(report) == ""  # no report yet
    report.write_text("# generated\n\n| a | b |\n")
    assert kept_tail(report) == ""  # nothing marked as kept
    report.write_text(f"# generated\n\nold table\n{KEPT}\n\n## Redesign check\n\nfigures\n")
    tail = kept_tail(report)
    assert tail.startswith(f"\n{KEPT}") and tail.endswith("figures\n") and "old table" not in tail
