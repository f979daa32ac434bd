"""parity.json / parity.md / parity.html: rendered from data, re-renderable from the JSON file."""
from __future__ import annotations

import base64
import json
import math
import shutil
import sys
from pathlib import Path

import pytest

from parity_models import swap_qk
from vitexport.runners import OnnxRuntimeRunner, TorchRunner
from vitexport.errors import BadInput
from vitexport.parity import (
    Check,
    LayerBudget,
    Metrics,
    ParityRun,
    StageResult,
    check_stage,
    load_run,
    localize_layers,
    render_markdown,
    render_reports,
    write_reports,
)
from vitexport.recipe import Recipe, StageName

RECIPE = Recipe(name="test", target="orin")


@pytest.fixture(scope="module")
def run(vit, vit_onnx, vit_reference, vit_example):
    """passes ok → export ok (with layers) → a failing pass stage with layers."""
    r = ParityRun(model="timm:vit_tiny", target="orin", data="synthetic", notes=["synthetic inputs"],
                  skipped=["mask_to_where"])
    with TorchRunner(vit, vit_example) as t:
        r.add(check_stage("freeze_layernorm", t, vit_reference, RECIPE.tolerance("freeze_layernorm"), changed=0,
                          seconds=0.01, notes=["freeze_layernorm: no sites found"]))
    with OnnxRuntimeRunner(vit_onnx) as o:
        res = check_stage("export_onnx", o, vit_reference, RECIPE.tolerance("export_onnx"), seconds=0.5,
                          artifacts={"model.raw.onnx": vit_onnx})
    res.details["export"] = {"exporter": "torchscript", "opset": 17}
    r.add(res.attach_layers(localize_layers(vit, vit_reference.feeds, vit_onnx, tolerance=res.tolerance,
                                            reference_layers=vit_reference.layers)))
    broken = swap_qk(vit, 3)
    with TorchRunner(broken, vit_example) as t:
        bad = check_stage("fuse_qkv", t, vit_reference, RECIPE.tolerance("fuse_qkv"), changed=4)
    r.add(bad.attach_layers(localize_layers(vit, vit_reference.feeds, broken, tolerance=bad.tolerance,
                                            reference_layers=vit_reference.layers)))
    return r


def test_parity_json_schema(run, tmp_path):
    paths = write_reports(tmp_path, run)
    assert set(paths) == {"parity.json", "parity.md", "parity.html"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parity.html", "parity.json", "parity.md"]
    doc = json.loads(paths["parity.json"].read_text())
    assert doc["passed"] is False and doc["failed_stage"] == "fuse_qkv" and doc["first_divergence"] == "blocks.3"
    assert doc["model"] == "timm:vit_tiny" and doc["target"] == "orin" and doc["data"] == "synthetic"
    assert doc["skipped"] == ["mask_to_where"] and doc["notes"] == ["synthetic inputs"]
    for s in doc["stages"]:
        assert s["engine"] in {"torch", "onnxruntime", "tensorrt"}
        assert s["reference"] == "untouched torch model"
        assert isinstance(s["passed"], bool) and isinstance(s["tolerance"], dict)
        for key in ("max_abs", "mean_abs", "cosine_min", "cosine_mean", "top1_agreement", "accuracy", "snr_db", "max_rel"):
            assert isinstance(s["metrics"][key], float), (s["stage"], key)
        for key in ("top1_agreement", "top1_agreement_gated", "top5_overlap", "accuracy"):
            assert 0.0 <= s["metrics"][key] <= 1.0
        assert s["metrics"]["top1_agreement_gated"] >= s["metrics"]["top1_agreement"]
        assert isinstance(s["metrics"]["top1_near_ties"], int)
        assert isinstance(s["histogram"]["counts"], list)
    by = {s["stage"]: s for s in doc["stages"]}
    assert by["freeze_layernorm"]["changed"] == 0 and by["export_onnx"]["changed"] is None
    assert by["export_onnx"]["details"]["export"]["opset"] == 17
    assert by["export_onnx"]["layer_summary"]["method"] == "scope" and len(by["export_onnx"]["layers"]) == 4
    assert by["fuse_qkv"]["failed_metric"] == "max_abs/ref_scale"
    assert by["fuse_qkv"]["checks"][0] == {**by["fuse_qkv"]["checks"][0], "passed": False}


def test_markdown_reads_as_tables(run):
    md = render_markdown(run.to_dict())
    assert md.startswith("# Parity report: FAIL")
    assert "| stage | engine | result |" in md
    assert "| top-1 | gated top-1 | near ties |" in md  # both top-1 figures and the near-tie count
    assert "| fuse_qkv | torch | FAIL | 4 |" in md
    assert "First divergence: **`blocks.3`**" in md
    assert "- skipped stages: mask_to_where" in md


def test_html_is_self_contained_with_four_plots(run, tmp_path):
    had_pyplot = "matplotlib.pyplot" in sys.modules
    html = write_reports(tmp_path, run)["parity.html"].read_text()
    assert had_pyplot or "matplotlib.pyplot" not in sys.modules  # plots drawn on an Agg canvas, no pyplot
    images = html.split('src="data:image/png;base64,')[1:]
    assert len(images) == 4  # cosine per sample (in the summary), error per stage, per-layer SNR, error histograms
    assert html.index("cosine per sample") < html.index("<h2>Stages</h2>") < html.index("error per stage")
    for img in images:
        assert base64.b64decode(img.split('"')[0])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "http://" not in html and "https://" not in html and "<script" not in html
    assert "FIRST DIVERGENCE" in html


def test_rerender_from_json_only(run, tmp_path):
    paths = write_reports(tmp_path, run)
    md_before = paths["parity.md"].read_text()
    paths["parity.md"].unlink()
    paths["parity.html"].unlink()
    again = render_reports(tmp_path)
    assert again["parity.md"].read_text() == md_before
    assert again["parity.html"].stat().st_size > 10_000
    back = load_run(tmp_path)
    assert back.to_dict() == json.loads(paths["parity.json"].read_text())
    assert not back and back.failed_stage.stage == "fuse_qkv" and back.failed_stage.layer_report.first_divergence == "blocks.3"


def test_round_trip_keeps_infinities(tmp_path):
    s = StageResult("export_onnx", "onnxruntime", passed=True)
    from vitexport.parity import Metrics

    s.metrics = Metrics(0.0, 0.0, 0.0, 1.0, 1.0, math.inf)
    write_reports(tmp_path, ParityRun(stages=[s]))
    back = load_run(tmp_path / "parity.json")
    assert back.stages[0].metrics.snr_db == math.inf and back.passed


def test_load_run_errors(tmp_path):
    with pytest.raises(BadInput, match="no parity report"):
        render_reports(tmp_path)
    (tmp_path / "parity.json").write_text("[1, 2]")
    with pytest.raises(BadInput, match="not a parity report"):
        load_run(tmp_path)


def test_run_verdict_and_summary():
    ok = StageResult("simplify", "onnxruntime", passed=True)
    bad = StageResult("quantize_int8", "onnxruntime", passed=False)
    r = ParityRun(stages=[ok])
    assert r and r.failure() is None
    r.add(bad)
    assert not r and not r.passed and r.failed_stage is bad
    assert r.failure().exit_code == 1
    assert r.summary().splitlines()[-1] == "parity: FAIL at stage 'quantize_int8'"
    # a pipeline may set the verdict itself; appending a failed stage is enough either way
    r2 = ParityRun(stages=[ok, bad], passed=True)
    assert r2.to_dict()["passed"] is False


def test_parity_json_round_trips_through_pydantic(run, tmp_path):
    """parity.json → ParityRun → parity.json is the identity, and the objects come back typed."""
    doc = json.loads(write_reports(tmp_path, run)["parity.json"].read_text())
    back = ParityRun.from_dict(doc)
    assert back.to_dict() == doc
    assert [s.stage for s in back.stages] == [StageName.freeze_layernorm, StageName.export_onnx, StageName.fuse_qkv]
    assert back.skipped == [StageName.mask_to_where]
    export = back.stage("export_onnx")
    assert isinstance(export.metrics, Metrics) and export.metrics == run.stage("export_onnx").metrics
    assert export.layer_report == run.stage("export_onnx").layer_report and len(export.layers) == 4
    assert isinstance(export.checks[0], Check) and export and not back.stage("fuse_qkv")
    assert "top1_margin_z" not in doc["stages"][0]["tolerance"]  # it qualifies a top-1 gate only


def test_unknown_top_level_keys_survive_a_round_trip():
    doc = ParityRun(stages=[StageResult("compare", "onnxruntime")], extra={"compare": {"a": "x"}}).to_dict()
    assert doc["compare"] == {"a": "x"} and doc["stages"][0]["stage"] == "compare"
    back = ParityRun.from_dict({**doc, "written_by": "vitexport 9"})
    assert back.extra == {"compare": {"a": "x"}, "written_by": "vitexport 9"} and back.stages[0].stage == "compare"


def test_an_older_demo_report_still_loads_and_renders(tmp_path):
    """A demo parity.json written before the results went through pydantic and before the margin-aware
    top-1 gate (kept in tests/parity/data: the committed demo report is regenerated)."""
    shutil.copy(Path(__file__).parent / "data" / "parity-pre-pydantic.json", tmp_path / "parity.json")
    old = load_run(tmp_path)
    assert old.passed and old.stage("quantize_int8").metrics.top1_agreement is not None
    assert [s.stage for s in old.stages][:3] == [StageName.freeze_layernorm, StageName.mask_to_where, StageName.fuse_qkv]  # before reparameterize existed
    # it gated every top-1 flip: read back that way, not with today's default margin
    assert old.stage("quantize_int8").tolerance.top1_margin_z == 0.0
    md = render_reports(tmp_path)["parity.md"].read_text()
    assert md.startswith("# Parity report: PASS") and "| quantize_int8 | onnxruntime | PASS |" in md


def test_older_layer_rows_without_channel_figures_load():
    row = {"name": "blocks.0", "tensor": None, "max_abs": 0.1, "rel_err": 0.01, "cosine_min": 0.99,
           "cosine_mean": 0.995, "snr_db": 30.0}
    s = StageResult.from_dict({"stage": "export_onnx", "engine": "onnxruntime", "metrics": {}, "layers": [row]})
    r = s.layers[0]
    assert s.metrics is None and (r.ch_cosine_min, r.ch_snr_db) == (0.99, 30.0) and s.layer_report.budget == LayerBudget()
