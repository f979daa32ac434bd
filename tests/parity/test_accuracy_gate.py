"""INT8 gates at deployment strictness (issue 23): with labels a default export may lose at most 0.3
points, and a failed gate says what to try.

The model is the bundled demo (a ViT trained on handwritten digits), exported with the default orin
recipe. Its held-out digits are too clear for INT8 to flip any, so a quarter of the parity set is made
of ambiguous digits — two held-out images averaged — labelled with the float model's own answer:
a real INT8 error on a near-tie then costs a real point of accuracy. The margin-aware top-1 gate
excuses those flips (it is built to), the 0.3-point accuracy gate does not; under the old 2-point
default this export passed.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vitexport.cli import main
from vitexport.demo import DEMO_HELDOUT, DEMO_MODEL_URI, DEMO_WEIGHTS
from vitexport.parity import Check
from vitexport.parity.advice import failure_advice
from vitexport.sources import load_model
from vitexport.targets import load_recipe

AMBIGUOUS = 100  # of the 400 held-out samples


def _ambiguous_parity_set(path) -> None:
    d = np.load(DEMO_HELDOUT)
    x = d["x"].copy()
    rng = np.random.default_rng(0)
    a, b = rng.permutation(len(x))[:AMBIGUOUS], rng.permutation(len(x))[:AMBIGUOUS]
    x[:AMBIGUOUS] = 0.5 * x[a] + 0.5 * x[b]
    model = load_model(DEMO_MODEL_URI, weights=DEMO_WEIGHTS)
    with torch.no_grad():
        logits = torch.cat([model.module(torch.from_numpy(x[i:i + 100])) for i in range(0, len(x), 100)])
    np.savez(path, x=x, y=logits.argmax(1).numpy().astype(np.int64))


@pytest.mark.slow
def test_a_default_export_losing_half_a_point_exits_1_and_says_what_to_try(tmp_path, capsys):
    data = tmp_path / "ambiguous.npz"
    _ambiguous_parity_set(data)
    out = tmp_path / "out"
    common = ["--parity-data", str(data), "--set", "quantization.measure_latency=false"]
    assert main(["export", "--target", "orin", "--out", str(out), *common]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitexport: error: parity gate failed at stage 'quantize_int8': "
                                               "accuracy_drop="), err
    int8 = next(s for s in json.loads((out / "parity.json").read_text())["stages"] if s["stage"] == "quantize_int8")
    m = int8["metrics"]
    drop = m["reference_accuracy"] - m["accuracy"]
    assert 0.003 < drop < 0.02  # a loss the 2-point default let through
    assert m["top1_agreement_gated"] >= 0.9 and m["cosine_min"] >= 0.98  # the other gates hold
    assert m["top1_agreement"] < m["top1_agreement_gated"]  # the raw agreement, reported beside the gated one
    lost = round(drop * 400)
    assert f"; {lost} of 400 labelled samples lost; try: calibration.num_samples=256 (now 128" in err[0]
    assert "quantization.fallback.max_float_layers=16 (now 8" in err[0]
    assert f"or accept it: parity.quantize_int8.accuracy_drop={drop:.4g}" in err[0]
    assert any("quantize_int8 failed its gate; " in n for n in json.loads((out / "parity.json").read_text())["notes"])
    # the first thing it says to try is enough here
    again = ["--set", "calibration.num_samples=256", "--no-resume"]
    assert main(["export", "--target", "orin", "--out", str(tmp_path / "fixed"), *common, *again]) == 0, \
        capsys.readouterr().err


def test_advice_follows_the_recipe_and_the_data():
    r = load_recipe("orin")
    drop = Check("accuracy_drop", 0.01, 0.003, "<=", False)
    text = failure_advice("quantize_int8", drop, r, calib_samples=40, labelled=200)
    assert text.startswith("2 of 200 labelled samples lost; try: more calibration data (--calib gave 40 sample(s)")
    assert "counts accuracy only when they are labelled" in text
    labelled = failure_advice("quantize_int8", drop, r, calib_samples=128, labelled_calib=True)
    assert "calibration.num_samples=256" in labelled and "labelled" not in labelled.split("max_float_layers")[1]
    off = load_recipe("orin", ["quantization.fallback.enabled=false"])
    cos = Check("cosine_min", 0.9, 0.98, ">=", False)
    text = failure_advice("build_engine", cos, off, calib_samples=128)
    assert text.startswith("try: quantization.fallback.enabled=true") and "max_float_layers" not in text
    assert text.endswith("or accept it: parity.build_engine.cosine_min=0.9")
    gated = Check("top1_agreement_gated", 0.8, 0.9, ">=", False)
    assert failure_advice("quantize_int8", gated, r, calib_samples=128).endswith("parity.quantize_int8.top1_agreement=0.8")
    passes = failure_advice("fuse_qkv", Check("max_abs/ref_scale", 3e-4, 1e-5, "<=", False), r, calib_samples=1)
    assert passes == ("try: stages.fuse_qkv.enabled=false (export without this rewrite), --layers to find the first "
                      "block that diverges, or accept it: parity.fuse_qkv.max_abs=0.0003")
    assert "export.exporter=dynamo" in failure_advice("export_onnx", None, r, calib_samples=1)
