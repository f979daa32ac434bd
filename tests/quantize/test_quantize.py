"""quantize_int8 end to end on tiny models: outliers, masked encoders, scale-table reuse, artifacts."""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from qcases import target
from vitexport.calibration import NpzSamples
from vitexport.targets.tensorrt.cache import read_trt_cache, scale_to_hex
from vitexport.parity.metrics import compute_metrics
from qgraph import consumers, load
from vitexport.runners.sessions import Session
from vitexport.quantize import quantize_int8
from vitexport.quantize.quantizer import prepare_model
from vitexport.quantize.smooth import SmoothPass, compute_factors, find_sites

NO_FALLBACK = "quantization.fallback.enabled=false"


def _outputs(path, feeds):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, f)[0] for f in feeds])


def _cosine(case, path) -> float:
    return compute_metrics(case.reference, _outputs(path, case.feeds)).cosine_min


@pytest.mark.slow
@pytest.mark.parametrize("name", ["orin", "npu"])
def test_outlier_vit_reaches_cosine_099_with_equalisation(outlier_vit, outlier_vit13, tmp_path, name):
    case = outlier_vit if name == "orin" else outlier_vit13
    plain = quantize_int8(case.path, tmp_path / "plain.onnx", case.calib,
                          target(name, NO_FALLBACK, "quantization.smooth=false"), tmp_path / "plain")
    eq = quantize_int8(case.path, tmp_path / "eq.onnx", case.calib, target(name, NO_FALLBACK), tmp_path / "eq")
    c_plain, c_eq = _cosine(case, tmp_path / "plain.onnx"), _cosine(case, tmp_path / "eq.onnx")
    assert plain.smoothed == 0 and eq.smoothed >= 4  # norm1 + norm2 of 2 blocks folded, plus inserted Muls
    assert c_plain < 0.97, f"the outliers should hurt plain INT8 (cosine {c_plain})"
    assert c_eq >= 0.99, f"equalised INT8 cosine {c_eq}"


def test_equalisation_keeps_the_float_function(outlier_vit):
    orin = target("orin")
    m = prepare_model(outlier_vit.path, orin)
    plan = orin.annotate(m)
    sites, _ = find_sites(m, plan)
    kinds = [s.kind.value for s in sites]
    assert kinds.count("fold") == 4 and kinds.count("insert") >= 2  # norm1/norm2 of 2 blocks; fc2 inputs
    rng = np.random.default_rng(0)
    factors = {s.tensor: compute_factors(m, s, rng.uniform(0.5, 300, s.channels), 0.5) for s in sites}
    assert SmoothPass(sites, factors)(m).report.changed == len(sites)
    assert sum(n.op_type == "Mul" and n.name.endswith("_smooth_Mul") for n in m.graph) == kinds.count("insert")
    ref = _outputs(outlier_vit.path, outlier_vit.feeds[:4])
    sess = Session(m)
    out = np.concatenate([sess.run(None, f)[0] for f in outlier_vit.feeds[:4]])
    assert np.abs(out - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())
    # onnxsim shares one all-ones gamma between LayerNorms; equalising one must not touch the others
    nodes = {n.name: n for n in m.graph}
    gammas = [nodes[s.scale_ref[0]].inputs[s.scale_ref[1]].name if s.scale_ref else None for s in sites]
    gammas = [g for g, s in zip(gammas, sites) if s.kind.value == "fold"]
    assert len(set(gammas)) == len(gammas)


@pytest.mark.slow
def test_masked_multi_input_encoder(bert, tmp_path):
    rep = quantize_int8(bert.path, tmp_path / "bert.int8.onnx", bert.calib, target("orin", NO_FALLBACK), tmp_path)
    assert rep.quantized_nodes >= 12
    c = _cosine(bert, tmp_path / "bert.int8.onnx")
    assert c >= 0.99, f"embedding cosine {c}"
    # the mask path (Cast/Sub/Mul/Add into the scores) is never quantized
    m = load(tmp_path / "bert.int8.onnx")
    mask = next(v for v in m.graph.inputs if v.name == "attention_mask")
    assert consumers(mask) and all(c.op_type != "QuantizeLinear" for c in consumers(mask))
    padded = [f for f in bert.feeds if f["attention_mask"].min() == 0]
    assert padded, "the parity set must exercise padding"


@pytest.mark.slow
def test_second_run_reuses_scale_table(vit17, tmp_path):
    # GPTQ's integer weights are not in the table: a run that rounds with it calibrates afresh (below)
    r = target("orin", NO_FALLBACK, "calibration.reuse=true", "quantization.weight_rounding=nearest")
    first = quantize_int8(vit17.path, tmp_path / "a.onnx", vit17.calib, r, tmp_path)
    table = json.loads((tmp_path / "calibration.json").read_text())
    assert not first.reused_table and table["num_samples"] == len(vit17.calib)
    assert table["method"] == "auto" and table["model_hash"] and table["data_hash"]
    second = quantize_int8(vit17.path, tmp_path / "b.onnx", vit17.calib, r, tmp_path)
    assert second.reused_table
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    # other data: calibrate again
    other = NpzSamples({"x": vit17.calib.arrays["x"][:20]})
    third = quantize_int8(vit17.path, tmp_path / "c.onnx", other, r, tmp_path)
    assert not third.reused_table and third.num_samples == 20
    # other method: calibrate again
    fourth = quantize_int8(vit17.path, tmp_path / "d.onnx", other, target("orin", NO_FALLBACK, "calibration.method=minmax",
                                                                       "calibration.reuse=true"), tmp_path)
    assert not fourth.reused_table and fourth.method == "minmax"
    gptq = target("orin", NO_FALLBACK, "calibration.reuse=true", "quantization.weight_rounding=gptq")
    for name in ("e", "f"):
        assert not quantize_int8(vit17.path, tmp_path / f"{name}.onnx", vit17.calib, gptq, tmp_path).reused_table


@pytest.mark.slow
def test_deterministic_bytes(vit17, tmp_path):
    r = target("orin", NO_FALLBACK)
    quantize_int8(vit17.path, tmp_path / "a.onnx", vit17.calib, r, tmp_path / "a")
    quantize_int8(vit17.path, tmp_path / "b.onnx", vit17.calib, r, tmp_path / "b")
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    assert (tmp_path / "a" / "calibration.cache").read_bytes() == (tmp_path / "b" / "calibration.cache").read_bytes()


@pytest.mark.slow
def test_trt_calibration_cache_format(vit17, tmp_path):
    quantize_int8(vit17.path, tmp_path / "m.onnx", vit17.calib, target("orin", NO_FALLBACK), tmp_path)
    lines = (tmp_path / "calibration.cache").read_text().splitlines()
    assert lines[0].startswith("TRT-") and lines[0].endswith("EntropyCalibration2")
    table = json.loads((tmp_path / "calibration.json").read_text())["tensors"]
    header, scales = read_trt_cache(tmp_path / "calibration.cache")
    assert set(scales) <= set(table) and len(scales) == len(lines) - 1
    for ln in lines[1:]:
        name, hx = ln.rsplit(": ", 1)
        assert len(hx) == 8 and int(hx, 16) >= 0
        assert hx == scale_to_hex(np.float32(table[name]["amax"] / 127.0))
    assert scale_to_hex(1.0) == "3f800000"  # big-endian IEEE float32


@pytest.mark.slow
@pytest.mark.parametrize("method", ["minmax", "entropy", "mse"])
def test_every_method_quantizes(vit17, tmp_path, method):
    rep = quantize_int8(vit17.path, tmp_path / "m.onnx", vit17.calib,
                        target("orin", NO_FALLBACK, f"calibration.method={method}"), tmp_path)
    assert rep.method == method
    assert _cosine(vit17, tmp_path / "m.onnx") >= 0.98


@pytest.mark.slow
def test_latency_is_measured_and_reported(vit17, tmp_path):
    r = target("cpu", NO_FALLBACK, "quantization.measure_latency=true")
    rep = quantize_int8(vit17.path, tmp_path / "m.onnx", vit17.calib, r, tmp_path)
    assert rep.latency_ratio is not None and rep.latency_ratio > 0
    d = rep.to_dict()
    for key in ("method", "num_samples", "reused_table", "quantized_nodes", "qdq_pairs", "float_fallback",
                "smoothed", "latency_ratio", "notes"):
        assert key in d
    if rep.latency_ratio < 1.0:
        assert any("SLOWER" in n for n in rep.notes)


def test_unreadable_model_is_bad_input(vit17, tmp_path):
    from vitexport.errors import BadInput

    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx model")
    with pytest.raises(BadInput):
        quantize_int8(bad, tmp_path / "m.onnx", vit17.calib, target("orin"), tmp_path)
    assert not (tmp_path / "m.onnx").exists()


def test_calibration_data_that_does_not_fit_the_model(vit17, bert, tmp_path):
    from vitexport.calibration import random_samples
    from vitexport.errors import BadInput

    wrong_shape = random_samples({"x": np.zeros((1, 3, 48, 48), np.float32)}, 4)
    with pytest.raises(BadInput, match="shape"):
        quantize_int8(vit17.path, tmp_path / "m.onnx", wrong_shape, target("orin"), tmp_path)
    wrong_names = random_samples({"pixels": np.zeros((1, 3, 32, 32), np.float32)}, 4)
    with pytest.raises(BadInput, match="no array"):
        quantize_int8(vit17.path, tmp_path / "m.onnx", wrong_names, target("orin"), tmp_path)
    floats = NpzSamples({"input_ids": np.zeros((4, 32), np.float32), "attention_mask": np.ones((4, 32), np.int64)})
    with pytest.raises(BadInput, match="holds float32"):
        quantize_int8(bert.path, tmp_path / "b.onnx", floats, target("orin"), tmp_path)
    assert not (tmp_path / "m.onnx").exists() and not (tmp_path / "b.onnx").exists()


@pytest.mark.slow
def test_attention_probabilities_keep_their_exact_range(vit17, tmp_path):
    # entropy clips long tails; applied to softmax outputs it would cut the few large probabilities
    quantize_int8(vit17.path, tmp_path / "m.onnx", vit17.calib,
                  target("orin", NO_FALLBACK, "calibration.method=entropy"), tmp_path)
    table = json.loads((tmp_path / "calibration.json").read_text())["tensors"]
    probs = {k: v for k, v in table.items() if "Softmax" in k}
    assert len(probs) == 2
    for v in probs.values():
        assert v["amax"] == v["max"] and 0 < v["max"] <= 1.0 and v["min"] >= 0.0


@pytest.mark.slow
def test_fallback_evaluates_in_the_targets_arithmetic(vit17, tmp_path, monkeypatch):
    import vitexport.quantize.quantizer as quantizer

    seen = []

    class Spy(quantizer.Judge):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            seen.append(self.config.qdq_as_float)

    monkeypatch.setattr(quantizer, "Judge", Spy)
    for name in ("orin", "npu", "cpu"):
        quantize_int8(vit17.path, tmp_path / f"{name}.onnx", vit17.calib, target(name), tmp_path / name)
    assert seen == [True, True, False]  # float Q/DQ semantics except on cpu, whose runtime is ONNX Runtime
