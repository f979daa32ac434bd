"""Matching torch modules to ONNX tensors, and the per-layer comparison itself."""
from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import torch

from parity_models import TinyTextEncoder, scale_onnx_weight
from vitexport.parity import LayerBudget, block_names, compare_layers, localize_layers, localize_onnx
from vitexport.parity.onnx_graph import OnnxGraph, _scope_from_name, block_scopes, node_scope, scope_matches
from vitexport.recipe import Tolerance


@pytest.mark.parametrize("name, scope", [
    ("/model/blocks/blocks.0/attn/qkv/MatMul", "model.blocks.0.attn.qkv"),  # Sequential: blocks, blocks.0
    ("/model/vit/encoder/layer.3/attention/attention/query/MatMul", "model.vit.encoder.layer.3.attention.attention.query"),
    ("/layers.1/Add_1", "layers.1"),  # ModuleList never called: layers.1 alone
    ("/encoder/layers/encoder_layer_0/ln_1/LayerNormalization", "encoder.layers.encoder_layer_0.ln_1"),
    ("/Add", ""),
    ("Identity_44", None),
])
def test_scope_from_torchscript_node_names(name, scope):
    assert _scope_from_name(name) == scope


def test_scope_from_dynamo_metadata():
    import onnx_ir as ir

    scopes = "['', 'model', 'model.blocks', 'model.blocks.0', 'model.blocks.0.attn.qkv', 'linear']"
    node = ir.node("MatMul", [ir.Value(name="a"), ir.Value(name="b")], name="node_MatMul_11",
                   metadata_props={"pkg.torch.onnx.name_scopes": scopes})
    assert node_scope(node) == "model.blocks.0.attn.qkv"
    assert node_scope(ir.node("Relu", [ir.Value(name="a")], name="node_relu")) is None


def test_scope_matching_and_blocks():
    assert scope_matches("model.blocks.2", "blocks.2") and scope_matches("blocks.2", "model.blocks.2")
    assert not scope_matches("model.blocks.12", "blocks.2") and not scope_matches("model.blocks.2.attn", "blocks.2")
    scopes = ["patch_embed.proj", "blocks.0.norm1", "blocks.0.attn.qkv", "blocks.0", "blocks.1.mlp.fc1", "norm", "head"]
    assert block_scopes(scopes) == ["blocks.0", "blocks.1"]
    tv = ["encoder.layers.encoder_layer_0.ln_1", "encoder.layers.encoder_layer_1.mlp", "stem.conv_1"]
    assert block_scopes(tv) == ["encoder.layers.encoder_layer_0", "encoder.layers.encoder_layer_1"]


def test_block_names_for_three_families(vit):
    from torchvision.models.vision_transformer import VisionTransformer

    assert block_names(vit) == [f"blocks.{i}" for i in range(4)]
    assert block_names(TinyTextEncoder()) == ["layers.0", "layers.1", "layers.2"]
    tv = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32)
    assert block_names(tv) == ["encoder.layers.encoder_layer_0", "encoder.layers.encoder_layer_1"]


def test_scope_output_is_the_blocks_last_node(vit_onnx):
    g = OnnxGraph.load(vit_onnx)
    assert g.has_scopes
    assert g.scope_output("blocks.3") == "/blocks/blocks.3/Add_1_output_0"
    assert g.scope_output("model.blocks.3") == "/blocks/blocks.3/Add_1_output_0"  # wrapper prefix tolerated
    assert g.scope_output("blocks.0.attn") == "/blocks/blocks.0/attn/proj/Add_output_0"
    assert g.scope_output("blocks.0.norm1", shape=(4, 17, 192)).endswith("norm1/LayerNormalization_output_0")
    assert g.scope_output("blocks.9") is None


def _strip_node_names(src, dst):
    """What a scope-less export looks like: nodes named by counter, tensors unchanged."""
    model = onnx.load(str(src))
    for i, n in enumerate(model.graph.node):
        n.name = f"node_{i}"
    onnx.save(model, str(dst))
    return dst


def test_value_matching_when_node_names_carry_no_scope(vit, vit_onnx, vit_reference, tmp_path):
    plain = _strip_node_names(vit_onnx, tmp_path / "plain.onnx")
    rep = localize_layers(vit, vit_reference.feeds, plain, reference_layers=vit_reference.layers)
    assert rep.method == "value" and rep.first_divergence is None
    assert {r.name: r.tensor for r in rep.layers} == {f"blocks.{i}": f"/blocks/blocks.{i}/Add_1_output_0" for i in range(4)}
    # a broken scope-less candidate is matched through its healthy FP32 sibling
    scaled = scale_onnx_weight(vit_onnx, tmp_path / "scaled.onnx", "/blocks/blocks.2/mlp/fc1/MatMul", 1.5)
    broken = _strip_node_names(scaled, tmp_path / "broken.onnx")
    rep = localize_layers(vit, vit_reference.feeds, broken, reference_layers=vit_reference.layers,
                          tolerance=Tolerance(max_abs=1e-4), mapping_model=plain)
    assert rep.method == "value" and rep.first_divergence == "blocks.2" and len(rep.layers) == 4


def test_onnx_vs_onnx_without_scopes_compares_residual_adds(vit_onnx, vit_feeds, tmp_path):
    scaled = scale_onnx_weight(vit_onnx, tmp_path / "scaled.onnx", "/blocks/blocks.2/mlp/fc1/MatMul", 1.5)
    a = _strip_node_names(vit_onnx, tmp_path / "a.onnx")
    b = _strip_node_names(scaled, tmp_path / "b.onnx")
    rep = localize_onnx(a, b, vit_feeds, tolerance=Tolerance(max_abs=1e-4))
    assert rep.method == "name" and len(rep.layers) == 8  # two residual Adds per block
    assert rep.first_divergence == "/blocks/blocks.2/Add_1_output_0"


def test_torch_vs_torch_localisation_without_captured_layers(vit, vit_feeds):
    import copy

    other = copy.deepcopy(vit)
    with torch.no_grad():
        other.blocks[1].mlp.fc2.weight.mul_(1.01)
    rep = localize_layers(vit, vit_feeds, other, tolerance=Tolerance(max_abs=1e-5))
    assert rep.method == "module" and rep.first_divergence == "blocks.1"


def test_budget_from_tolerance():
    assert LayerBudget.from_tolerance(Tolerance(max_abs=1e-5)) == LayerBudget(max_rel=1e-5)
    assert LayerBudget.from_tolerance(Tolerance(max_abs=0.1, relative=False)) == LayerBudget(max_abs=0.1)
    assert LayerBudget.from_tolerance(Tolerance(cosine_min=0.98, top1_agreement=0.9)) == LayerBudget(cosine_min=0.98)
    assert LayerBudget.from_tolerance(Tolerance(top1_agreement=0.9)) == LayerBudget(cosine_min=0.99)
    assert LayerBudget(cosine_min=0.98).noise_budget() == pytest.approx(0.04)
    assert LayerBudget.from_dict(LayerBudget(max_rel=1e-4, snr_db_min=20).to_dict()) == LayerBudget(max_rel=1e-4, snr_db_min=20.0)


def test_compare_layers_noise_shares_and_first_divergence():
    rng = np.random.default_rng(0)
    ref = {f"l{i}": rng.standard_normal((2, 5, 8)) for i in range(4)}
    cand = {k: v.copy() for k, v in ref.items()}
    cand["l2"] = cand["l2"] + 0.5 * rng.standard_normal((2, 5, 8))
    cand["l3"] = cand["l3"] + 0.3 * rng.standard_normal((2, 5, 8))  # carried on, smaller: adds nothing
    rep = compare_layers(ref, cand, ["l0", "l1", "l2", "l3", "missing"], LayerBudget(cosine_min=0.99))
    assert rep.first_divergence == "l2" and [r.passed for r in rep.layers] == [True, True, False, False]
    assert rep.layers[0].snr_db == math.inf and rep.layers[0].noise_share == 0.0
    assert sum(r.noise_share for r in rep.layers) == pytest.approx(1.0)
    assert rep.worst == ["l2"] and rep.layers[3].noise_added == 0.0 and "missing" in rep.notes[0]
    assert not rep and "ch_cosine_min" in rep.get("l2").reason


def _torchvision_vit():
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32), "x"


def _hf_vit():
    from transformers import ViTConfig, ViTForImageClassification

    from vitexport.sources.base import OutputAdapter

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, num_labels=5)
    return OutputAdapter(ViTForImageClassification(cfg), ["pixel_values"], keyword=True), "pixel_values"


@pytest.mark.parametrize("build", [_torchvision_vit, _hf_vit], ids=["torchvision", "hf"])
def test_scope_matching_on_other_families(build, tmp_path):
    """Every block of a torchvision / Hugging Face ViT is found in its TorchScript export."""
    from parity_models import export

    model, name = build()
    model.eval()
    feeds = [{name: np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)}]
    path = export(model, feeds[0], tmp_path / "m.onnx")
    rep = localize_layers(model, feeds, path, tolerance=Tolerance(max_abs=1e-4))
    assert rep.method == "scope" and len(rep.layers) == 2 == len(block_names(model))
    assert rep and all(r.rel_err < 1e-5 for r in rep.layers)
