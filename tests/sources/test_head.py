"""A fine-tuned checkpoint's head sizes the model it loads into: timm (by pretrained_cfg's classifier
name), torchvision (its last Linear), Hugging Face (config.num_labels), or ``--num-classes``."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from vitexport.cli import main
from vitexport.errors import BadInput
from vitexport.sources import load_model


def _save(model: torch.nn.Module, path) -> str:
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return str(path)


def _same_outputs(loaded, ref: torch.nn.Module) -> None:
    ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded.module(**loaded.example_inputs), ref(*loaded.example_inputs.values()))


def test_timm_vit_checkpoint_with_10_classes_loads_as_trained(tmp_path):
    import timm

    ref = timm.create_model("deit_tiny_patch16_224", num_classes=10)
    weights = _save(ref, tmp_path / "finetuned.safetensors")
    m = load_model("timm:deit_tiny_patch16_224", weights=weights)
    assert m.meta["notes"] == ["timm:deit_tiny_patch16_224 built with num_classes=10 (from head.weight in finetuned.safetensors)"]
    assert m.module.model.num_classes == 10
    _same_outputs(m, ref)


def test_timm_vit_fine_tuned_at_another_resolution_takes_its_pos_embed_grid(tmp_path):
    import timm

    ref = timm.create_model("deit_tiny_patch16_224", num_classes=10, img_size=64)
    m = load_model("timm:deit_tiny_patch16_224", weights=_save(ref, tmp_path / "ft64.safetensors"))
    assert m.meta["notes"][1] == ("timm:deit_tiny_patch16_224 built with img_size=64 (from pos_embed (1, 17, 192) in "
                                  "ft64.safetensors, a 4x4 grid)")
    assert tuple(m.example_inputs["x"].shape) == (1, 3, 64, 64) and m.preprocess.crop == 64
    _same_outputs(m, ref)


def test_timm_hybrid_head_found_by_its_classifier_name(tmp_path):
    """mobilevit_xxs keeps its classifier at head.fc (not 'head'): timm's pretrained_cfg names it."""
    import timm

    ref = timm.create_model("mobilevit_xxs", num_classes=3)
    m = load_model("timm:mobilevit_xxs", weights=_save(ref, tmp_path / "ft.safetensors"), input_shape="1,3,64,64")
    assert m.meta["notes"] == ["timm:mobilevit_xxs built with num_classes=3 (from head.fc.weight in ft.safetensors)"]
    _same_outputs(m, ref)


def test_a_checkpoint_at_the_models_own_size_adds_no_note(tmp_path):
    import timm

    torch.manual_seed(1)
    ref = timm.create_model("test_vit")
    m = load_model("timm:test_vit", weights=_save(ref, tmp_path / "w.safetensors"))
    assert m.meta["notes"] == []
    _same_outputs(m, ref)


def test_torchvision_resnet_fc_with_10_classes(tmp_path):
    import torchvision

    ref = torchvision.models.resnet18(num_classes=10)
    torch.save(ref.state_dict(), tmp_path / "resnet.pt")
    m = load_model("torchvision:resnet18", weights=tmp_path / "resnet.pt", input_shape="1,3,32,32")
    assert m.meta["notes"] == ["torchvision:resnet18 built with num_classes=10 (from fc.weight in resnet.pt)"]
    _same_outputs(m, ref)


def test_hf_folder_whose_checkpoint_head_differs_from_config_json(tmp_path):
    from transformers import ViTConfig, ViTForImageClassification

    cfg = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, image_size=32,
               patch_size=8)
    ViTForImageClassification(ViTConfig(**cfg, num_labels=7)).save_pretrained(tmp_path / "folder")
    ref = ViTForImageClassification(ViTConfig(**cfg, num_labels=4)).eval()
    m = load_model(f"hf:{tmp_path / 'folder'}", weights=_save(ref, tmp_path / "ft.safetensors"))
    assert m.meta["notes"][1] == f"hf:{tmp_path / 'folder'} built with num_labels=4 (from classifier.weight in ft.safetensors)"
    with torch.no_grad():
        torch.testing.assert_close(m.module(**m.example_inputs), ref(**m.example_inputs).logits)


def test_num_classes_builds_that_head_and_is_checked_against_the_weights(tmp_path):
    import timm

    m = load_model("timm:test_vit", num_classes=5)
    assert m.module(**m.example_inputs).shape == (1, 5)
    assert m.meta["notes"] == ["timm:test_vit built with num_classes=5 (--num-classes)"]
    weights = _save(timm.create_model("test_vit", num_classes=10), tmp_path / "w.safetensors")
    with pytest.raises(BadInput, match=r"--num-classes 5: tensor 'head.weight' in .*w.safetensors holds 10 classes"):
        load_model("timm:test_vit", weights=weights, num_classes=5)
    with pytest.raises(BadInput, match="python: function builds its own head"):
        load_model("python:x.py:build", num_classes=5)
    with pytest.raises(BadInput, match="at least 1"):
        load_model("timm:test_vit", num_classes=0)


def test_a_mismatch_outside_the_head_still_names_the_tensor(tmp_path, capsys):
    """The head is sized from the checkpoint; any other tensor of the wrong shape is refused, named,
    in one line with exit code 2."""
    import timm

    sd = timm.create_model("test_vit", num_classes=10).state_dict()
    sd["blocks.0.norm1.weight"] = torch.ones(3)
    save_file(sd, str(tmp_path / "w.safetensors"))
    with pytest.raises(BadInput, match=r"tensor 'blocks.0.norm1.weight' has shape \(3,\), the model wants"):
        load_model("timm:test_vit", weights=tmp_path / "w.safetensors")
    code = main(["export", "--model", "timm:test_vit", "--weights", str(tmp_path / "w.safetensors"),
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "tensor 'blocks.0.norm1.weight' has shape (3,)" in err[0]


def test_cli_num_classes_reaches_the_api_and_refusals_exit_2(tmp_path, capsys):
    """--num-classes is a thin flag: a contradicted one and one for a python: model are one line, exit 2;
    a good one exports a model with that many outputs (the note says why)."""
    import timm

    weights = _save(timm.create_model("test_vit", num_classes=10), tmp_path / "w.safetensors")
    code = main(["export", "--model", "timm:test_vit", "--weights", weights, "--num-classes", "4",
                 "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--num-classes 4: tensor 'head.weight'" in err[0]
    code = main(["export", "--model", "timm:test_vit", "--weights", weights, "--num-classes", "10",
                 "--out", str(tmp_path / "ok")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "note: timm:test_vit built with num_classes=10 (--num-classes)" in out
    import onnx

    logits = onnx.load(str(tmp_path / "ok" / "model.fp32.onnx")).graph.output[0]
    assert logits.type.tensor_type.shape.dim[-1].dim_value == 10
