"""Mixed-precision fallback: the fewest layers in float until the parity budget holds, chosen on
held-out calibration data in the target's arithmetic on the very bytes that are written."""
from __future__ import annotations

import pytest

import numpy as np

from qcases import target
from qgraph import dq_fed, load
from vitexport.calibration.feeds import FeedSet, split_samples
from vitexport.runners import OnnxRuntimeRunner
from vitexport.runners.sessions import LOW_MEMORY, Session
from vitexport.parity.metrics import compare
from vitexport.quantize import quantize_int8

FALLBACK = ("quantization.smooth=false", "quantization.fallback.max_float_layers=6",
            "parity.quantize_int8.cosine_min=0.99", "parity.quantize_int8.top1_agreement=0.9")


def test_fallback_meets_budget_with_few_float_layers(outlier_vit, tmp_path):
    # no equalisation: INT8 misses cosine 0.99, a few Linears in float bring it back
    out = tmp_path / "m.onnx"
    rep = quantize_int8(outlier_vit.path, out, outlier_vit.calib, target("orin", *FALLBACK), tmp_path)
    assert rep.parity_before_fallback and not rep.parity_before_fallback["passed"]
    assert rep.budget_met and rep.parity["passed"]
    names = [f["node"] for f in rep.float_fallback]
    assert 1 <= len(names) <= 6
    assert all(0 < f["macs_share"] < 1 and f["sensitivity"] >= 0 for f in rep.float_fallback)
    assert 0 < rep.float_macs_share < 1
    nodes = {n.name: n for n in load(out).graph}
    assert all(not dq_fed(nodes[n]) for n in names), "fallback nodes must have no Q/DQ inputs"
    assert rep.selection and "held-out calibration" in rep.selection
    assert any("fallback" in n for n in rep.notes)


@pytest.mark.slow
def test_no_fallback_when_budget_holds(vit17, tmp_path):
    rep = quantize_int8(vit17.path, tmp_path / "m.onnx", vit17.calib, target("orin"), tmp_path)
    assert rep.budget_met and rep.float_fallback == []


@pytest.mark.slow
def test_fallback_verdict_equals_the_gate_on_the_written_file(outlier_vit, tmp_path):
    """What the fallback predicted on its selection data is what the gate's runner measures on the
    written file, on the same samples: the same arithmetic, the same bytes."""
    r = target("orin", *FALLBACK)
    out = tmp_path / "m.onnx"
    rep = quantize_int8(outlier_vit.path, out, outlier_vit.calib, r, tmp_path)
    _, select = split_samples(outlier_vit.calib, r.recipe.quantization.fallback.eval_samples)
    feeds = FeedSet(select, 1)
    float_sess = Session(outlier_vit.path, LOW_MEMORY)
    ref = np.concatenate([float_sess.run(None, f)[0] for f in feeds])
    with OnnxRuntimeRunner(out, config=r.gate_config) as runner:
        got = np.concatenate([runner.infer(f)["output"] for f in feeds])
    gate = compare(ref, got, r.recipe.tolerance("quantize_int8"))
    assert bool(gate) == rep.parity["passed"]
    assert gate.metrics.cosine_min == rep.parity["metrics"]["cosine_min"]
    assert gate.metrics.top1_agreement == rep.parity["metrics"]["top1_agreement"]
