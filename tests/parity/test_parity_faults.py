"""Planted faults: the report must name the stage, the metric and the layer that broke.

Each test plants one fault the issue lists in a tiny random-weight model, runs the parity gate the
way the pipeline does (golden reference captured first, then the stage's artifact checked against
it) and asserts what a reader of parity.json would see.
"""
from __future__ import annotations

import copy
import json
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from parity_models import (
    calibrate_absmax,
    drop_mask,
    export,
    image_batches,
    insert_qdq,
    plant_nan_onnx,
    scale_onnx_weight,
    set_layernorm_eps,
    swap_qk,
    tensors_by_pattern,
    tiny_vit,
)
from vitexport.runners import OnnxRuntimeRunner, TorchRunner
from vitexport.errors import BadInput, ParityFailure
from vitexport.parity import (
    ParityRun,
    capture_reference,
    check_stage,
    compare_models,
    first_nonfinite_module,
    first_nonfinite_op,
    localize_layers,
    write_reports,
)
from vitexport.recipe import Recipe

RECIPE = Recipe(name="test", target="orin")  # the schema's default tolerances


def _torch_stage(stage, module, reference, example, **kw):
    with TorchRunner(module, example, name=stage) as runner:
        return check_stage(stage, runner, reference, RECIPE.tolerance(stage), **kw)


# --- q and k swapped in one block --------------------------------------------------------------------
def test_qk_swap_fails_the_pass_stage_and_names_the_block(vit, vit_reference, vit_example, tmp_path):
    run = ParityRun(model="tiny-vit", target="test", data="synthetic")
    # a pass that changed nothing passes, exactly
    ok = run.add(_torch_stage("freeze_layernorm", copy.deepcopy(vit), vit_reference, vit_example, changed=0))
    assert ok and ok.metrics.max_abs == 0.0 and ok.changed == 0
    broken = swap_qk(vit, block=2)
    res = _torch_stage("fuse_qkv", broken, vit_reference, vit_example, changed=4)
    res.attach_layers(localize_layers(vit, vit_reference.feeds, broken, tolerance=res.tolerance,
                                      reference_layers=vit_reference.layers))
    run.add(res)

    assert not res and not run
    assert run.failed_stage is res
    assert res.failed_metric == "max_abs/ref_scale"
    assert res.first_divergence == "blocks.2"
    assert [r.name for r in res.layers if r.passed] == ["blocks.0", "blocks.1"]
    assert res.layer_report.method == "module"
    with pytest.raises(ParityFailure) as err:
        run.raise_for_failure()
    assert err.value.exit_code == 1 and "fuse_qkv" in str(err.value) and "max_abs" in str(err.value)

    doc = json.loads(write_reports(tmp_path, run)["parity.json"].read_text())
    assert doc["passed"] is False
    assert (doc["failed_stage"], doc["failed_metric"], doc["first_divergence"]) == ("fuse_qkv", "max_abs/ref_scale", "blocks.2")
    md = (tmp_path / "parity.md").read_text()
    assert "Failed at stage `fuse_qkv`" in md and "first divergence at `blocks.2`" in md


def test_qk_swap_survives_export_and_is_localized_in_onnx(vit, vit_feeds, vit_reference, tmp_path):
    """Torch modules matched to ONNX tensors through node scopes (TorchScript exporter)."""
    path = export(swap_qk(vit, block=1), vit_feeds[0], tmp_path / "broken.onnx")
    with OnnxRuntimeRunner(path) as runner:
        res = check_stage("export_onnx", runner, vit_reference, RECIPE.tolerance("export_onnx"))
    rep = localize_layers(vit, vit_reference.feeds, path, tolerance=res.tolerance, reference_layers=vit_reference.layers)
    assert not res and res.failed_metric == "max_abs/ref_scale"
    assert rep.method == "scope"
    assert rep.first_divergence == "blocks.1"
    assert rep.get("blocks.1").tensor == "/blocks/blocks.1/Add_1_output_0"
    assert rep.get("blocks.0").passed and rep.get("blocks.0").rel_err < 1e-5


def test_good_export_passes_every_layer(vit, vit_onnx, vit_reference):
    with OnnxRuntimeRunner(vit_onnx) as runner:
        res = check_stage("export_onnx", runner, vit_reference, RECIPE.tolerance("export_onnx"))
    rep = localize_layers(vit, vit_reference.feeds, vit_onnx, tolerance=res.tolerance, reference_layers=vit_reference.layers)
    assert res and rep and rep.first_divergence is None
    assert [r.name for r in rep.layers] == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert all(r.cosine_min > 0.99999 for r in rep.layers)
    assert res.metrics.accuracy is not None and res.metrics.reference_accuracy == res.metrics.accuracy


# --- LayerNorm eps 1e-6 -> 1e-5 ---------------------------------------------------------------------
def test_layernorm_eps_change_is_caught_and_localized(vit, vit_reference, vit_example):
    broken = set_layernorm_eps(vit, block=2, eps=1e-5)
    res = _torch_stage("freeze_layernorm", broken, vit_reference, vit_example, changed=9)
    rep = localize_layers(vit, vit_reference.feeds, broken, tolerance=res.tolerance, reference_layers=vit_reference.layers)
    res.attach_layers(rep)
    assert not res and res.failed_metric == "max_abs/ref_scale"
    assert res.metrics.cosine_min > 0.99  # small but beyond a fold's 1e-5 contract
    assert res.first_divergence == "blocks.2"
    assert rep.get("blocks.1").max_abs == 0.0


# --- a mask dropped --------------------------------------------------------------------------------
def test_dropped_mask_fails_mask_to_where_and_names_the_block(text_model, text_reference, text_example, text_feeds, tmp_path):
    broken = drop_mask(text_model, block=1)
    unmasked = np.ones_like(text_reference.output, dtype=bool)  # pooled logits: every position is real
    res = _torch_stage("mask_to_where", broken, text_reference, text_example, changed=3, unmasked=unmasked)
    res.attach_layers(localize_layers(text_model, text_reference.feeds, broken, tolerance=res.tolerance,
                                      reference_layers=text_reference.layers))
    assert not res
    assert {c.metric for c in res.checks if not c.passed} >= {"max_abs/ref_scale", "max_abs_unmasked"}
    assert res.first_divergence == "layers.1"

    # the same model exported: blocks in a ModuleList have scopes "layers.<i>" in the ONNX graph
    path = export(broken, text_feeds[0], tmp_path / "nomask.onnx")
    with OnnxRuntimeRunner(path) as runner:
        onnx_res = check_stage("export_onnx", runner, text_reference, RECIPE.tolerance("export_onnx"))
    rep = localize_layers(text_model, text_reference.feeds, path, tolerance=onnx_res.tolerance,
                          reference_layers=text_reference.layers)
    assert not onnx_res and rep.method == "scope" and rep.first_divergence == "layers.1"


# --- a weight scaled in one block of an ONNX file (--compare) --------------------------------------
@pytest.fixture(scope="module")
def compare_files(vit_onnx, vit_feeds, tmp_path_factory):
    d = tmp_path_factory.mktemp("compare")
    scaled = scale_onnx_weight(vit_onnx, d / "scaled.onnx", "/blocks/blocks.2/mlp/fc1/MatMul", 1.5)
    data = d / "data.npz"
    np.savez(data, x=np.concatenate([f["x"] for f in vit_feeds]), y=np.arange(8) % 10)
    return d, scaled, data


@pytest.mark.slow
def test_compare_two_onnx_files_names_the_scaled_block(vit_onnx, compare_files):
    d, scaled, data = compare_files
    run = compare_models(str(vit_onnx), str(scaled), data, layers=True, out_dir=d / "out")
    assert not run.passed
    stage = run.stages[0]
    assert stage.stage == "compare" and stage.failed_metric == "max_abs/ref_scale"
    assert stage.first_divergence == "blocks.2"
    assert stage.layer_report.method == "scope"
    assert [r.passed for r in stage.layers] == [True, True, False, False]
    assert stage.layers[0].max_abs == 0.0  # same file up to the fault: bit-identical
    doc = json.loads((d / "out" / "parity.json").read_text())
    assert doc["first_divergence"] == "blocks.2" and doc["stages"][0]["layers"][2]["passed"] is False
    assert (d / "out" / "parity.html").is_file() and (d / "out" / "parity.md").is_file()

    same = compare_models(str(vit_onnx), str(vit_onnx), data, layers=True)
    assert same.passed and same.stages[0].first_divergence is None
    assert same.stages[0].metrics.max_abs == 0.0 and same.stages[0].metrics.accuracy is not None


def test_compare_opens_a_targets_artifact_through_its_opener(vit_onnx, compare_files, tmp_path):
    """A file a target's runtime runs (orin: a ``.plan``) is opened by the opener the target hands in by its
    suffix (``Target.open_artifact``): compare names no backend. Here the "runtime" is ONNX Runtime over
    a copy of the model under a suffix of its own."""
    import shutil

    from vitexport.runners import OnnxRuntimeRunner

    _, _, data = compare_files
    artifact = shutil.copy(vit_onnx, tmp_path / "model.myrt")
    opened = []

    def opener(path):
        opened.append(path.name)
        return OnnxRuntimeRunner(path, name=path.name)

    run = compare_models(str(vit_onnx), str(artifact), data, artifacts={".myrt": opener})
    assert run.passed and opened == ["model.myrt"] and run.stages[0].engine == "onnxruntime"
    with pytest.raises(BadInput, match=r"expected an \.onnx file, .* or a file a target runs \(\.myrt\)"):
        compare_models(str(vit_onnx), str(tmp_path / "model.other"), data, artifacts={".myrt": opener})
    with pytest.raises(BadInput, match="file not found"):
        compare_models(str(vit_onnx), str(tmp_path / "gone.myrt"), data, artifacts={".myrt": opener})


def test_compare_a_model_uri_with_an_onnx_file(vit, compare_files, tmp_path):
    """``python:FILE:FN`` (wrapped by the source loader, scopes ``model.blocks.i``) vs ONNX
    exported from the raw module (scopes ``blocks.i``): matched through the wrapper prefix."""
    d, scaled, data = compare_files
    src = tmp_path / "net.py"
    src.write_text(textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from parity_models import tiny_vit

        def build():
            m = tiny_vit(token_scale=0.01, init_values=0.01)
            return m, {{"x": torch.zeros(4, 3, 32, 32)}}
    """))
    run = compare_models(f"python:{src}:build", str(scaled), data, layers=True)
    stage = run.stages[0]
    assert not run.passed and stage.first_divergence == "model.blocks.2"
    assert stage.layer_report.method == "scope"


# --- a NaN planted in one layer ----------------------------------------------------------------------
def test_nan_in_an_onnx_weight_names_the_first_op(vit_onnx, vit_reference, tmp_path):
    path = plant_nan_onnx(vit_onnx, tmp_path / "nan.onnx", "/blocks/blocks.1/mlp/fc1/MatMul")
    with OnnxRuntimeRunner(path) as runner:
        res = check_stage("simplify", runner, vit_reference, RECIPE.tolerance("simplify"))
    assert not res and res.failed_metric == "nonfinite"
    assert res.nonfinite_source["node"] == "/blocks/blocks.1/mlp/fc1/MatMul"
    assert res.nonfinite_source["scope"] == "blocks.1.mlp.fc1"
    assert len(res.nonfinite_source["nonfinite_inputs"]) == 1  # the weight itself
    assert res.first_divergence == "/blocks/blocks.1/mlp/fc1/MatMul"
    assert first_nonfinite_op(path, vit_reference.feeds[0]) == "/blocks/blocks.1/mlp/fc1/MatMul"
    rep = localize_layers(None, vit_reference.feeds, path, reference_layers=vit_reference.layers)
    assert rep.first_divergence == "blocks.1" and rep.get("blocks.1").nonfinite > 0
    assert rep.worst == ["blocks.1"]


def test_finite_model_has_no_nonfinite_op(vit_onnx, vit_feeds):
    assert first_nonfinite_op(vit_onnx, vit_feeds[0]) is None


def test_nan_in_a_torch_module_names_the_module(vit, vit_reference, vit_example):
    broken = copy.deepcopy(vit)
    with torch.no_grad():
        broken.blocks[3].attn.proj.weight[0, 0] = float("nan")
    res = _torch_stage("fuse_qkv", broken, vit_reference, vit_example)
    assert not res and res.failed_metric == "nonfinite"
    assert res.first_divergence == "blocks.3.attn.proj"
    assert first_nonfinite_module(broken, vit_reference.feeds[0]) == "blocks.3.attn.proj"


# --- an INT8 model whose residual Adds were quantized --------------------------------------------------
@pytest.fixture(scope="module")
def int8_models(tmp_path_factory):
    """An outlier channel in the residual stream (as in ViT-B); INT8 by hand-written QDQ:
    ``good`` quantizes Linear/MatMul inputs only, ``adds`` also every residual Add output, ``adds1``
    also the residual Adds of block 1 only."""
    d = tmp_path_factory.mktemp("int8")
    model = tiny_vit(outlier=30.0)
    feeds = image_batches(n=16, batch=4)
    with TorchRunner(model, {"x": torch.from_numpy(feeds[0]["x"])}) as runner:
        reference = capture_reference(runner, feeds, source="untouched torch model", layers=True)
    fp32 = export(model, feeds[0], d / "fp32.onnx")
    proto = onnx.load(str(fp32))
    matmul_inputs = tensors_by_pattern(proto, "MatMul", input_index=0)
    adds = [t for t in tensors_by_pattern(proto, "Add", "/blocks/", computed_inputs=True)]
    assert len(adds) == 8  # two residual Adds per block
    amax = calibrate_absmax(fp32, matmul_inputs + adds, image_batches(n=16, batch=4, seed=7))
    paths = {
        "good": insert_qdq(fp32, d / "good.onnx", {t: amax[t] for t in matmul_inputs}),
        "adds": insert_qdq(fp32, d / "adds.onnx", {t: amax[t] for t in matmul_inputs + adds}),
        "adds1": insert_qdq(fp32, d / "adds1.onnx", {t: amax[t] for t in matmul_inputs + adds if "/blocks.1/" in t or t not in adds}),
    }
    return model, reference, fp32, paths


def _int8_stage(int8_models, which):
    model, reference, fp32, paths = int8_models
    with OnnxRuntimeRunner(paths[which]) as runner:
        res = check_stage("quantize_int8", runner, reference, RECIPE.tolerance("quantize_int8"))
    rep = localize_layers(model, reference.feeds, {"fp32": fp32, "int8": paths[which]}, budget=res.tolerance,
                          reference_layers=reference.layers)
    return res.attach_layers(rep), rep


def test_int8_linear_inputs_only_passes(int8_models):
    res, rep = _int8_stage(int8_models, "good")
    assert res and rep.first_divergence is None and rep.worst == []
    assert rep.candidates == ["fp32", "int8"]
    assert all(r.others["fp32"]["ch_snr_db"] > 100 for r in rep.layers)  # FP32 export: float round-off only


def test_int8_quantized_residual_adds_in_one_block_are_flagged(int8_models, tmp_path):
    res, rep = _int8_stage(int8_models, "adds1")
    assert not res and res.failed_metric == "cosine_min"
    assert rep.first_divergence == "blocks.1"
    assert rep.worst == ["blocks.1"] and rep.get("blocks.1").flagged
    assert rep.get("blocks.1").noise_share > 0.9
    # the outlier channel hides the damage from a plain cosine; the channel-standardized one shows it
    assert rep.get("blocks.1").cosine_min > 0.98 > rep.get("blocks.1").ch_cosine_min
    assert rep.get("blocks.1").tensor.endswith("_dequantized")  # compared where the next block reads it
    run = ParityRun(model="tiny-vit-outlier", target="orin", data="synthetic", stages=[res])
    paths = write_reports(tmp_path, run)
    md = paths["parity.md"].read_text()
    assert "FIRST DIVERGENCE · worst" in md and "fp32 ch SNR dB" in md


def test_int8_quantized_residual_adds_everywhere_flag_the_blocks(int8_models):
    res, rep = _int8_stage(int8_models, "adds")
    assert not res
    assert rep.first_divergence == "blocks.0"
    assert len(rep.worst) == 3 and set(rep.worst) <= {"blocks.0", "blocks.1", "blocks.2", "blocks.3"}
    assert not any(r.passed for r in rep.layers)
