"""Mixed-precision fallback: the fewest layers in float until the parity budget holds."""
from __future__ import annotations

import onnx

from qcases import recipe
from vitexport.quantize import quantize_int8
from vitexport.quantize.graph import GraphIndex


def _float_inputs(path, names):
    idx = GraphIndex(onnx.load(str(path)))
    out = {}
    for n in names:
        node = idx.by_name[n]
        out[n] = all(idx.producer.get(t) is None or idx.producer[t].op_type != "DequantizeLinear" for t in node.input)
    return out


def test_fallback_meets_budget_with_few_float_layers(outlier_vit, tmp_path):
    # no equalisation: INT8 misses cosine 0.99, a few Linears in float bring it back
    r = recipe("orin", "quantization.equalize=false", "quantization.fallback.max_float_layers=6",
               "parity.quantize_int8.cosine_min=0.99", "parity.quantize_int8.top1_agreement=0.9")
    out = tmp_path / "m.onnx"
    rep = quantize_int8(outlier_vit.path, out, outlier_vit.calib, r, tmp_path,
                        parity_feeds=outlier_vit.feeds, reference=outlier_vit.reference)
    assert rep.parity_before_fallback and not rep.parity_before_fallback["passed"]
    assert rep.budget_met and rep.parity["passed"]
    names = [f["node"] for f in rep.float_fallback]
    assert 1 <= len(names) <= 6
    assert all(0 < f["macs_share"] < 1 and f["sensitivity"] >= 0 for f in rep.float_fallback)
    assert all(_float_inputs(out, names).values()), "fallback nodes must have no Q/DQ inputs"
    assert any("fallback" in n for n in rep.notes)


def test_no_fallback_when_budget_holds(vit17, tmp_path):
    rep = quantize_int8(vit17.path, tmp_path / "m.onnx", vit17.calib, recipe("orin"), tmp_path,
                        parity_feeds=vit17.feeds, reference=vit17.reference)
    assert rep.budget_met and rep.float_fallback == []


def test_fallback_without_reference_uses_float_onnx(outlier_vit, tmp_path):
    r = recipe("orin", "quantization.equalize=false", "parity.quantize_int8.cosine_min=0.99",
               "quantization.fallback.max_float_layers=6", "quantization.fallback.eval_samples=8")
    rep = quantize_int8(outlier_vit.path, tmp_path / "m.onnx", outlier_vit.calib, r, tmp_path)
    assert rep.budget_met is not None
    assert any("reference" in n for n in rep.notes)
