"""INT8 gates at deployment strictness (issue 23): with labels a default export may lose at most 0.3
points, and a failed gate says what to try.

The model is the bundled demo (a ViT trained on handwritten digits), exported with the default orin
recipe. Its held-out digits are too clear for INT8 to flip any, so a quarter of the parity set is made
of ambiguous digits — two held-out images averaged — labelled with the float model's own answer, and
of those the first ``TIES`` are blended exactly where the float model's answer turns from one digit to
the other: INT8's error decides each of those as a coin would, so about half of them cost a real point
of accuracy whatever the quantizer's choices (the 0.5 blends alone flipped 1.4–1.7 expected, and a
change of GPTQ's rounding was enough for none to flip). The margin-aware top-1 gate excuses those flips
(it is built to), the 0.3-point accuracy gate does not.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vitexport.cli import main
from vitexport.demo import DEMO_HELDOUT, DEMO_MODEL_URI, DEMO_WEIGHTS
from vitexport.parity import Check
from vitexport.parity.metrics import compare
from vitexport.recipe import Tolerance
from vitexport.parity.advice import accepting_limit, failure_advice
from vitexport.sources import load_model
from vitexport.targets import load_recipe

AMBIGUOUS = 100  # of the 400 held-out samples
TIES = 20  # of the ambiguous ones: blended at the float model's own decision boundary


def _ambiguous_parity_set(path) -> None:
    d = np.load(DEMO_HELDOUT)
    x = d["x"].copy()
    rng = np.random.default_rng(0)
    a, b = rng.permutation(len(x))[:AMBIGUOUS], rng.permutation(len(x))[:AMBIGUOUS]
    model = load_model(DEMO_MODEL_URI, weights=DEMO_WEIGHTS)

    def predict(images: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return torch.cat([model.module(torch.from_numpy(images[i:i + 100])) for i in range(0, len(images), 100)]
                             ).argmax(1).numpy()

    ends = predict(np.concatenate([x[a], x[b]]))
    ties = np.flatnonzero(ends[:AMBIGUOUS] != ends[AMBIGUOUS:])[:TIES]  # pairs read as two digits
    assert len(ties) == TIES
    lo, hi = np.zeros(TIES, np.float32), np.ones(TIES, np.float32)  # weight of image a: 0 reads b, 1 reads a
    for _ in range(30):  # bisect each pair's blend to where the answer turns
        mid = (lo + hi) / 2
        reads_a = predict(mid[:, None, None, None] * x[a[ties]] + (1 - mid[:, None, None, None]) * x[b[ties]]) == ends[ties]
        lo, hi = np.where(reads_a, lo, mid), np.where(reads_a, mid, hi)
    weight = np.full(AMBIGUOUS, 0.5, np.float32)
    weight[ties] = hi
    x[:AMBIGUOUS] = weight[:, None, None, None] * x[a] + (1 - weight[:, None, None, None]) * x[b]
    np.savez(path, x=x, y=predict(x).astype(np.int64))


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
    assert 0.003 < drop <= (TIES + 8) / 400  # about half the ties lost, and a few of the other blends
    assert m["top1_agreement_gated"] >= 0.9 and m["cosine_min"] >= 0.98  # the other gates hold
    assert m["top1_agreement"] < m["top1_agreement_gated"]  # the raw agreement, reported beside the gated one
    lost = round(drop * 400)
    assert f"; {lost} of 400 labelled samples lost; try: calibration.num_samples=256 (now 128" in err[0]
    assert "max_float_layers" not in err[0]  # no cap by default: the fallback went as far as more float helped
    assert f"or accept it: parity.quantize_int8.accuracy_drop={lost / 400:.4g}" in err[0]  # k/400: ≤ 4 digits
    assert any("quantize_int8 failed its gate; " in n for n in json.loads((out / "parity.json").read_text())["notes"])
    # what it says to accept is accepted: the same run with that limit passes. (Whether a quantizer step
    # wins the point back is a coin toss here, not a property to test: the flips are near-ties the INT8
    # noise crosses at random, Σ Φ(−margin/(√2·σ)) over the parity set expects 1.4–1.7 of them for every
    # setting tried (128 or 256 calibration samples, attn·V INT8 or float, GPTQ), and 1.2 pass the gate.)
    accept = err[0].split("or accept it: ")[1].split()[0]
    again = ["--set", accept, "--no-resume"]
    assert main(["export", "--target", "orin", "--out", str(tmp_path / "accepted"), *common, *again]) == 0, \
        capsys.readouterr().err


def test_advice_follows_the_recipe_and_the_data():
    r = load_recipe("orin")
    drop = Check("accuracy_drop", 0.01, 0.003, "<=", False)
    text = failure_advice("quantize_int8", drop, r, calib_samples=40, labelled=200)
    assert text.startswith("2 of 200 labelled samples lost; try: more calibration data (--calib gave 40 sample(s)")
    assert "counts accuracy only when they are labelled" in text
    labelled = failure_advice("quantize_int8", drop, r, calib_samples=128, labelled_calib=True)
    assert "calibration.num_samples=256" in labelled and "labelled" not in labelled.split("num_samples")[1]
    capped = failure_advice("quantize_int8", drop, load_recipe("orin", ["quantization.fallback.max_float_layers=8"]),
                            calib_samples=128, labelled_calib=True)
    assert "quantization.fallback.max_float_layers=16 (now 8)" in capped
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
    # the limit to accept is rounded to the side that passes, and the gate counts samples, not float differences
    assert failure_advice("quantize_int8", Check("accuracy_drop", 1 / 334, 0.003, "<=", False), r,
                          calib_samples=128).endswith("accuracy_drop=0.002995")
    assert failure_advice("quantize_int8", Check("cosine_min", 0.99126, 0.995, ">=", False), r,
                          calib_samples=128).endswith("cosine_min=0.9912")
    ref = np.eye(10, dtype=np.float32)[np.arange(400) % 10]
    out = ref.copy()
    out[:2] = np.roll(out[:2], 1, axis=1)  # 2 of 400 flipped: 1.0 − 0.995 in floats is 0.0050000000000000044
    assert compare(ref, out, Tolerance(accuracy_drop=0.005), labels=np.arange(400) % 10)
    assert not compare(ref, out, Tolerance(accuracy_drop=0.0049), labels=np.arange(400) % 10)


def _flipped(n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One-hot logits of ``n`` labelled samples, all right, and a copy with the first ``k`` wrong."""
    labels = np.arange(n) % 10
    ref = np.eye(10, dtype=np.float32)[labels]
    out = ref.copy()
    out[:k] = np.roll(out[:k], 1, axis=1)
    return ref, out, labels


@pytest.mark.parametrize("n", [397, 400, 334, 1000, 61])
def test_the_gate_counts_samples_and_the_advised_limit_passes_with_no_flip_to_spare(n):
    """The drop is lost/n exactly (1 of 397 is 0.252 pt and passes the 0.3-point default), and the limit
    the advice quotes passes the very run it was quoted for while a run losing one more sample still
    fails it: rounded up for ``<=``, down for ``>=``, at 4 digits never so far as to admit a flip."""
    ref, out, labels = _flipped(n, 1)
    one = compare(ref, out, Tolerance(accuracy_drop=0.003), labels=labels)
    assert one.checks[0].value == 1 / n and bool(one) == (1 / n <= 0.003)
    for k in range(1, 8):
        ref, out, labels = _flipped(n, k)
        drop = compare(ref, out, Tolerance(accuracy_drop=0.0), labels=labels).failed_check
        assert drop.metric == "accuracy_drop" and drop.value == k / n
        limit = float(accepting_limit(drop))
        assert compare(ref, out, Tolerance(accuracy_drop=limit), labels=labels)
        more = _flipped(n, k + 1)
        assert not compare(more[0], more[1], Tolerance(accuracy_drop=limit), labels=labels)
        agree = compare(ref, out, Tolerance(top1_agreement=1.0, top1_margin_z=0.0)).failed_check
        assert agree.metric == "top1_agreement_gated" and agree.value == (n - k) / n
        limit = float(accepting_limit(agree))
        assert compare(ref, out, Tolerance(top1_agreement=limit, top1_margin_z=0.0))
        assert not compare(more[0], more[1], Tolerance(top1_agreement=limit, top1_margin_z=0.0))
