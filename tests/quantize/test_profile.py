"""The quantize stage's profile: seconds and full-model ONNX Runtime runs per step, in the report the
quantizer returns, the manifest, parity.md / parity.html and the ``-v`` log."""
from __future__ import annotations

import json
import logging

from qcases import target

from vitexport.api import prepare
from vitexport.pipeline import run_pipeline
from vitexport.quantize import quantize_int8
from vitexport.quantize.profile import STEPS, QuantProfile

STEPS_RUN = ("calibration", "smoothing_search", "range_search", "reference", "parity", "fallback_probes", "conversion", "write")


def test_profile_steps_nest_and_count_runs_where_they_happen():
    prof = QuantProfile()
    with prof.step("fallback_probes"):
        prof.ran(2)
        with prof.step("conversion"):
            pass
    d = prof.to_dict()
    assert d["steps"]["fallback_probes"] == {**d["steps"]["fallback_probes"], "runs": 1, "samples": 2, "calls": 1}
    assert d["steps"]["conversion"]["runs"] == 0 and d["runs"] == 1
    assert abs(d["seconds"] - sum(s["seconds"] for s in d["steps"].values())) < 1e-2  # nested time counted once


def test_quantize_reports_every_step_and_reuses_the_calibration_pass_for_the_judges_screen(vit17, tmp_path, caplog):
    with caplog.at_level(logging.DEBUG, logger="vitexport.quantize"):
        rep = quantize_int8(vit17.path, tmp_path / "m.onnx", vit17.calib, target("orin", "quantization.measure_latency=false"),
                            tmp_path)
    prof = rep.profile["steps"]
    assert set(STEPS_RUN) <= set(prof) <= set(STEPS)
    n_select = 12  # a quarter of the 48 calibration samples is held out
    calib_part = len(vit17.calib) - n_select
    # statistics pass, ranges pass and the float16 ranges (orin: 16 samples): one run per sample (static batch 1)
    assert prof["calibration"]["runs"] > 0 and prof["calibration"]["samples"] == 2 * calib_part + 16
    # the judge's float reference: the held-out samples only; its screen's came with the ranges pass
    assert prof["reference"]["samples"] == n_select
    assert prof["parity"]["samples"] == n_select + calib_part  # one verdict: held-out and screened samples
    assert prof["smoothing_search"]["runs"] == prof["range_search"]["runs"] == prof["conversion"]["runs"] == 0
    assert rep.profile["runs"] == sum(s["runs"] for s in prof.values())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("profile: ")]
    assert lines[0].split()[1:] == ["step", "seconds", "runs", "samples"] and lines[-1].split()[1] == "total"
    assert any(line.split()[1] == "calibration" for line in lines)


def test_a_model_over_the_compute_cap_runs_the_statistics_pass_on_fewer_samples(vit17, tmp_path, monkeypatch):
    import vitexport.quantize.calibrate as calibrate

    assert calibrate.statistics_size(64, int(17.5e9)) == calibrate.MIN_STAT_SAMPLES  # ViT-B/16 at 224
    assert calibrate.statistics_size(64, int(4.6e9)) == calibrate.statistics_size(64, 0) == 64  # ViT-S/16; unknown
    monkeypatch.setattr(calibrate, "_STAT_MACS", 1.0)  # this small ViT as costly as a large one
    rep = quantize_int8(vit17.path, tmp_path / "m.onnx", vit17.calib, target("orin", "quantization.measure_latency=false"),
                        tmp_path)
    calib_part = len(vit17.calib) - 12
    assert calib_part > calibrate.MIN_STAT_SAMPLES
    # statistics pass on the cap's 32 samples (not all 36 the default 64 allows), then the ranges and float16 passes
    assert rep.profile["steps"]["calibration"]["samples"] == calibrate.MIN_STAT_SAMPLES + calib_part + 16
    assert any(n.startswith(f"statistics (smoothing factors, search rows) from the first {calibrate.MIN_STAT_SAMPLES} ")
               for n in rep.notes)
    assert rep.smoothed > 0


def test_manifest_and_reports_carry_the_profile(tiny_vit_file, tmp_path):
    model, tgt, calib, parity, _ = prepare(f"python:{tiny_vit_file}:build_with_inputs", "orin",
                                           overrides=("calibration.num_samples=16", "parity_data.synthetic_samples=8",
                                                      "quantization.measure_latency=false"))
    run_pipeline(model, tgt, tmp_path, calib=calib, parity_data=parity)
    prof = json.loads((tmp_path / "manifest.json").read_text())["stages"]["quantize_int8"]["profile"]
    assert set(STEPS_RUN) <= set(prof["steps"])
    assert prof["steps"]["calibration"]["runs"] > 0 and prof["gate_seconds"] > 0
    md = (tmp_path / "parity.md").read_text()
    section = md.split("## Stage `quantize_int8`")[1]
    assert "### Quantize profile" in section and "| calibration |" in section and "| gate (this stage's check) |" in section
    assert "Quantize profile" in (tmp_path / "parity.html").read_text()
