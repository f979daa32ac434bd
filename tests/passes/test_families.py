"""Every family: site counts per pass, parity after each pass on 8 inputs, and the exported graph.

Parity is against the untouched model: <= 1e-5 of the output's scale after the folds and the fusion;
after ``mask_to_where`` the same bound on unmasked positions (bit-exact where the original attention
was an explicit softmax), and the exported ONNX model within the export tolerance (1e-4).
"""
from __future__ import annotations

import numpy as np
import torch

from passes_zoo import (
    PASS_ORDER,
    float_mask_adds,
    layernorm_affines,
    qkv_matmul_count,
    run_onnx,
    separate_qkv_groups,
    softmax_mask_producers,
)
from vitexport.parity.metrics import compare
from vitexport.recipe import Tolerance

FOLD_TOL = Tolerance(max_abs=1e-5)
MASK_TOL = Tolerance(max_abs=1e-5, exact_unmasked=True)
EXPORT_TOL = Tolerance(max_abs=1e-4)
NUM_VARIANTS = 4  # x batch 2 = 8 inputs, each variant with its own images / padding
# Families whose original attention is an explicit softmax with the mask added: the where must be
# bit-exact on unmasked positions there.
BIT_EXACT = {"seed", "timm_swin", "hf_bert_eager"}


def _outputs(model, case, i):
    with torch.no_grad():
        return model(**case.make_inputs(i)).numpy()


def test_site_counts(family_run):
    case = family_run.case
    for name in PASS_ORDER:
        report, expect = family_run.reports[name], case.expect[name]
        assert report.found == expect["found"], report.summary()
        assert report.changed == expect["changed"], report.summary()
        for action in ("fold", "constants"):
            if action in expect:
                assert report.count(action) == expect[action], (name, [c.__dict__ for c in report.changes])
        # changed counts real rewrites only; everything else found is a skip with a reason
        assert report.changed + len(report.skipped) == report.found, report.to_dict()
        assert all(s.reason for s in report.skipped)
        if report.found == 0:
            assert "no sites found" in report.summary() and report.notes


def test_fold_and_fusion_parity(family_run):
    case = family_run.case
    for name in ("freeze_layernorm", "fuse_qkv"):
        model = family_run.models[name]
        for i in range(NUM_VARIANTS):
            ref, out = _outputs(case.model, case, i), _outputs(model, case, i)
            unmasked = case.unmasked(case.make_inputs(i), ref) if case.unmasked else None
            if unmasked is not None:  # padded positions after mask_to_where may differ (fully masked rows)
                ref, out = ref[unmasked], out[unmasked]
            result = compare(ref, out, FOLD_TOL)
            assert result, (name, i, result.failed_check)


def test_mask_to_where_exact_on_unmasked(family_run):
    case = family_run.case
    model = family_run.models["mask_to_where"]
    before = family_run.models["freeze_layernorm"]  # mask_to_where's own input
    for i in range(NUM_VARIANTS):
        inputs = case.make_inputs(i)
        ref, out = _outputs(before, case, i), _outputs(model, case, i)
        unmasked = case.unmasked(inputs, ref) if case.unmasked else np.ones(ref.shape, bool)
        result = compare(ref, out, MASK_TOL, unmasked=unmasked)
        assert result, (i, result.failed_check)
        assert np.isfinite(out).all()
        if case.name in BIT_EXACT:
            assert np.array_equal(ref[unmasked], out[unmasked]), i


def test_onnx_structure(family_run):
    case, proto = family_run.case, family_run.proto
    # one MatMul/Gemm producing q, k, v per block, and no input read by three separate q/k/v Linears
    assert qkv_matmul_count(proto) == case.blocks
    assert separate_qkv_groups(proto) == 0
    # no LayerNorm with a loaded (non-identity) affine
    affines = layernorm_affines(proto)
    assert affines and all(identity for _, identity in affines), affines
    # masks are Where on the logits, never a float add a quantizer would calibrate
    masked_sites = family_run.reports["mask_to_where"].changed
    assert softmax_mask_producers(proto).count("Where") == masked_sites
    assert float_mask_adds(proto) == 0


def test_onnx_parity(family_run):
    case, proto = family_run.case, family_run.proto
    for i in range(NUM_VARIANTS):
        inputs = case.make_inputs(i)
        ref = _outputs(case.model, case, i)
        got = run_onnx(proto, inputs)
        unmasked = case.unmasked(inputs, ref) if case.unmasked else None
        result = compare(ref[unmasked] if unmasked is not None else ref, got[unmasked] if unmasked is not None else got, EXPORT_TOL)
        assert result, (i, result.failed_check)
        # and the graph computes exactly what the rewritten module computes, masked rows included
        assert compare(_outputs(family_run.final, case, i), got, EXPORT_TOL)


def test_original_model_untouched(family_run):
    case = family_run.case
    names = {n for n, _ in case.model.named_modules()}
    for model in family_run.models.values():
        assert model is not case.model
    # the reference still holds its LayerNorm affines and its original modules
    lns = [m for m in case.model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert lns and all(m.weight is not None for m in lns)
    assert names == {n for n, _ in case.model.named_modules()}
