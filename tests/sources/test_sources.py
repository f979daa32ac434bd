"""Model sources: every URI scheme, weights formats, output reduction, and bad input."""
from __future__ import annotations

import json
import pickle

import pytest
import torch

from vitexport.errors import BadInput
from vitexport.sources import load_model, parse_input_shape
from vitexport.sources.weights import read_state_dict


def _out(m):
    with torch.no_grad():
        return m.module(**m.example_inputs)


def _first(m):
    """The first of the model's tensor outputs (a base model returns several: last_hidden_state first)."""
    out = _out(m)
    return out[0] if isinstance(out, tuple) else out


def test_timm_shape_and_preprocess_from_pretrained_cfg():
    m = load_model("timm:vit_tiny_patch16_224")
    assert list(m.example_inputs) == ["x"]
    assert tuple(m.example_inputs["x"].shape) == (1, 3, 224, 224)
    assert m.preprocess.crop == 224 and m.preprocess.interpolation == "bicubic"
    assert _out(m).shape == (1, 1000)


def test_timm_input_shape_override_sets_batch():
    m = load_model("timm:vit_tiny_patch16_224", input_shape="2,3,224,224")
    assert tuple(m.example_inputs["x"].shape) == (2, 3, 224, 224)


def test_torchvision_vit_image_size():
    m = load_model("torchvision:vit_b_16")
    assert tuple(m.example_inputs["x"].shape) == (1, 3, 224, 224)
    assert m.preprocess.resize == 256 and m.family == "torchvision"


@pytest.mark.parametrize("uri", ["timm:not_a_model_xyz", "torchvision:nope_net", "pytorch:vit", "timm:"])
def test_unknown_models_are_bad_input(uri):
    with pytest.raises(BadInput):
        load_model(uri)


@pytest.mark.parametrize("uri, meant", [
    ("timm:deit_tinyy_patch16_224", "deit_tiny_patch16_224"),  # not deit3_base_*: the family and the letters agree
    ("timm:vit_smal_patch16_224", "vit_small_patch16_224"),
    ("timm:dei_tiny_patch16_224", "deit_tiny_patch16_224"),  # a typo in the family itself: searched among all
    ("timm:vit_smal_patch16_224.augreg_in21k", "vit_small_patch16_224.augreg_in21k"),  # the tag is kept
    ("torchvision:vit_b16", "vit_b_16"),
    ("torchvision:convnext_tinny", "convnext_tiny"),
])
def test_a_mistyped_model_name_suggests_the_one_meant(uri, meant):
    scheme, _, name = uri.partition(":")
    with pytest.raises(BadInput) as exc:
        load_model(uri)
    assert str(exc.value) == f"unknown {scheme} model '{name}'; did you mean '{meant}'?"


def _save_hf_vit(folder, with_preproc=True):
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    image_size=32, patch_size=8, num_labels=7)
    model = ViTForImageClassification(cfg).eval()
    model.save_pretrained(folder)
    if with_preproc:
        (folder / "preprocessor_config.json").write_text(json.dumps(
            {"image_mean": [0.1, 0.2, 0.3], "image_std": [0.4, 0.5, 0.6], "size": {"height": 32, "width": 32}, "resample": 3}))
    return model


def test_hf_image_folder_logits_and_preprocess(tmp_path):
    ref = _save_hf_vit(tmp_path)
    m = load_model(f"hf:{tmp_path}")
    assert list(m.example_inputs) == ["pixel_values"]
    assert tuple(m.example_inputs["pixel_values"].shape) == (1, 3, 32, 32)
    assert m.preprocess.mean == (0.1, 0.2, 0.3) and m.preprocess.interpolation == "bicubic"
    with torch.no_grad():
        want = ref(pixel_values=m.example_inputs["pixel_values"]).logits
    torch.testing.assert_close(_out(m), want)


def test_hf_text_encoder_gets_ids_and_mask(tmp_path):
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64)
    BertModel(cfg).save_pretrained(tmp_path)
    m = load_model(f"hf:{tmp_path}", input_shape="2,16")
    assert list(m.example_inputs) == ["input_ids", "attention_mask"]
    assert m.example_inputs["input_ids"].dtype == torch.int64
    last, pooled = _out(m)  # every tensor of the output, in its order
    assert m.output_names == ["last_hidden_state", "pooler_output"]
    assert last.shape == (2, 16, 32) and pooled.shape == (2, 32)


def test_hf_missing_config(tmp_path):
    with pytest.raises(BadInput, match="config.json"):
        load_model(f"hf:{tmp_path}")


def test_python_module_with_input_shape(tiny_vit_file):
    m = load_model(f"python:{tiny_vit_file}:build", input_shape="1,3,32,32")
    assert m.name == "build" or m.name
    assert _out(m).shape == (1, 5)


def test_python_module_needs_shape(tiny_vit_file):
    with pytest.raises(BadInput, match="--input-shape"):
        load_model(f"python:{tiny_vit_file}:build")


def test_python_example_inputs_fix_names_and_shapes(tiny_vit_file):
    m = load_model(f"python:{tiny_vit_file}:build_with_inputs")
    assert list(m.example_inputs) == ["image"]
    assert tuple(m.example_inputs["image"].shape) == (2, 3, 32, 32)
    assert _out(m).shape == (2, 5)


def test_python_dict_output_keeps_every_tensor_by_name(tiny_vit_file):
    plain = load_model(f"python:{tiny_vit_file}:build", input_shape="1,3,32,32")
    wrapped = load_model(f"python:{tiny_vit_file}:build_tuple_output", input_shape="1,3,32,32")
    logits, aux = _out(wrapped)
    assert wrapped.output_names == ["logits", "aux"] and plain.output_names == ["output"]
    torch.testing.assert_close(logits, _out(plain))
    torch.testing.assert_close(aux, torch.zeros(1))


@pytest.mark.parametrize("spec,match", [
    ("missing.py:build", "not found"),
    ("{file}:nothing_here", "no function"),
    ("{file}:not_a_model", "expected an nn.Module"),
    ("{file}", "PATH.py:FUNCTION"),
])
def test_python_bad_specs(tiny_vit_file, spec, match):
    with pytest.raises(BadInput, match=match):
        load_model("python:" + spec.format(file=tiny_vit_file), input_shape="1,3,32,32")


def test_safetensors_and_pt_weights_load_the_same(tiny_vit_file, tmp_path):
    from safetensors.torch import save_file

    src = load_model(f"python:{tiny_vit_file}:build", input_shape="1,3,32,32")
    sd = {k: v.clone() * 0.5 for k, v in src.module.model.state_dict().items()}
    save_file(sd, str(tmp_path / "w.safetensors"))
    torch.save({"state_dict": {"module." + k: v for k, v in sd.items()}}, tmp_path / "w.pt")
    a = load_model(f"python:{tiny_vit_file}:build", weights=tmp_path / "w.safetensors", input_shape="1,3,32,32")
    b = load_model(f"python:{tiny_vit_file}:build", weights=tmp_path / "w.pt", input_shape="1,3,32,32")
    torch.testing.assert_close(a.module.model.q.weight, sd["q.weight"])
    torch.testing.assert_close(_out(a), _out(b))


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_pickle_with_code_is_refused_and_never_run(tmp_path, capsys):
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.zeros(1), "payload": Evil()}, path)
    with pytest.raises(BadInput, match="--trust-pickle"):
        read_state_dict(path)
    assert "pwned" not in capsys.readouterr().out


def test_trust_pickle_allows_code(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.zeros(1), "payload": Evil()}, path)
    sd = read_state_dict(path, trust_pickle=True)
    assert list(sd) == ["w"]


@pytest.mark.parametrize("content,match", [(b"", "empty"), (b"\x00garbage" * 10, "safetensors")])
def test_corrupt_safetensors(tmp_path, content, match):
    p = tmp_path / "w.safetensors"
    p.write_bytes(content)
    with pytest.raises(BadInput, match=match):
        read_state_dict(p)


def test_truncated_checkpoint(tmp_path, tiny_vit_file):
    m = load_model(f"python:{tiny_vit_file}:build", input_shape="1,3,32,32")
    p = tmp_path / "w.pt"
    torch.save(m.module.model.state_dict(), p)
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    with pytest.raises(BadInput, match="corrupt or truncated"):
        read_state_dict(p)


def test_mismatching_weights_name_keys(tmp_path, tiny_vit_file):
    from safetensors.torch import save_file

    save_file({"q.weight": torch.zeros(3, 3)}, str(tmp_path / "w.safetensors"))
    with pytest.raises(BadInput, match="missing"):
        load_model(f"python:{tiny_vit_file}:build", weights=tmp_path / "w.safetensors", input_shape="1,3,32,32")


def test_missing_weights_file(tmp_path):
    with pytest.raises(BadInput, match="not found"):
        read_state_dict(tmp_path / "nope.safetensors")


@pytest.mark.parametrize("text", ["1,3,224", "a,b,c,d", "1,3,-2,224", "", "1,3,224,224,1,1"])
def test_malformed_input_shape(text):
    if text == "1,3,224":
        assert parse_input_shape(text) == (1, 3, 224)  # N,C,L is allowed; image models reject it later
        with pytest.raises(BadInput, match="N,C,H,W"):
            load_model("timm:vit_tiny_patch16_224", input_shape=text)
        return
    with pytest.raises(BadInput, match="--input-shape"):
        parse_input_shape(text)


# --- reproducibility, input binding, the built input size ------------------------------------------
def _state_bytes(m) -> bytes:
    return b"".join(v.numpy().tobytes() for v in m.module.model.state_dict().values())


@pytest.mark.parametrize("uri", ["timm:vit_tiny_patch16_224", "torchvision:resnet18"])
def test_models_without_weights_are_built_the_same_every_time(uri):
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a = load_model(uri)
    after = torch.rand(3)
    b = load_model(uri)
    assert _state_bytes(a) == _state_bytes(b)
    assert torch.equal(before, after), "building a model must not move the caller's random state"


def test_an_unseeded_user_build_is_seeded_too(tmp_path):
    src = tmp_path / "unseeded.py"
    src.write_text("import torch\n\ndef build():\n    m = torch.nn.Linear(4, 3)\n    m.pretrained_cfg = {}\n    return m\n")
    a = load_model(f"python:{src}:build", input_shape="2,3,4,4")
    torch.rand(5)  # whatever the caller's generator did in between
    b = load_model(f"python:{src}:build", input_shape="2,3,4,4")
    assert _state_bytes(a) == _state_bytes(b)


def test_python_model_takes_its_built_size_not_its_pretrained_one(tmp_path):
    """timm's pretrained cfg describes the checkpoint (dinov2: 518); the module built with another
    img_size takes that size."""
    src = tmp_path / "small.py"
    src.write_text("import timm\n\ndef build():\n    return timm.create_model('vit_tiny_patch16_224', img_size=64, num_classes=3)\n")
    m = load_model(f"python:{src}:build")
    assert m.module.model.pretrained_cfg["input_size"] == (3, 224, 224)
    assert tuple(m.example_inputs["x"].shape) == (1, 3, 64, 64)
    assert _out(m).shape == (1, 3)


def test_hf_model_from_a_python_file_gets_pixel_values(tmp_path):
    """Its forward takes **kwargs: the input must be bound to its real name, not passed as x=."""
    src = tmp_path / "hfnet.py"
    src.write_text(
        "from transformers import ViTConfig, ViTForImageClassification\n\n"
        "def build():\n"
        "    cfg = ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,\n"
        "                    image_size=32, patch_size=8, num_labels=4)\n"
        "    return ViTForImageClassification(cfg)\n"
    )
    m = load_model(f"python:{src}:build")
    assert list(m.example_inputs) == ["pixel_values"] and m.module.keyword
    assert tuple(m.example_inputs["pixel_values"].shape) == (1, 3, 32, 32)
    with torch.no_grad():
        want = m.module.model(pixel_values=m.example_inputs["pixel_values"]).logits
    torch.testing.assert_close(_out(m), want)


def test_weights_format_is_told_by_content(tmp_path, tiny_vit_file):
    """A safetensors file named .bin is read as safetensors, not refused as a pickle."""
    from safetensors.torch import save_file

    src = load_model(f"python:{tiny_vit_file}:build", input_shape="1,3,32,32")
    sd = {k: v.clone() + 1 for k, v in src.module.model.state_dict().items()}
    save_file(sd, str(tmp_path / "pytorch_model.bin"))
    m = load_model(f"python:{tiny_vit_file}:build", weights=tmp_path / "pytorch_model.bin", input_shape="1,3,32,32")
    torch.testing.assert_close(m.module.model.q.weight, sd["q.weight"])
    torch.save(sd, tmp_path / "weights.safetensors")  # and a torch checkpoint under a safetensors name
    m = load_model(f"python:{tiny_vit_file}:build", weights=tmp_path / "weights.safetensors", input_shape="1,3,32,32")
    torch.testing.assert_close(m.module.model.q.weight, sd["q.weight"])


def test_integer_weights_for_float_parameters_are_refused(tmp_path, tiny_vit_file):
    from safetensors.torch import save_file

    src = load_model(f"python:{tiny_vit_file}:build", input_shape="1,3,32,32")
    sd = {k: (v * 100).to(torch.int64) for k, v in src.module.model.state_dict().items()}
    save_file(sd, str(tmp_path / "w.safetensors"))
    with pytest.raises(BadInput, match="holds int64 values, the model's is float32"):
        load_model(f"python:{tiny_vit_file}:build", weights=tmp_path / "w.safetensors", input_shape="1,3,32,32")


def test_hf_preprocessor_values_are_type_checked(tmp_path):
    _save_hf_vit(tmp_path, with_preproc=False)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"height": "32"}}))
    with pytest.raises(BadInput, match="'size'"):
        load_model(f"hf:{tmp_path}")


def _hf_folder(folder, config, drop_architectures=True):
    cfg = config.to_dict()
    if drop_architectures:
        cfg.pop("architectures", None)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("name,config", [
    ("segformer", "SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], "
                  "patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], image_size=32)"),
    ("levit", "LevitConfig(image_size=64, hidden_sizes=[32, 48], num_attention_heads=[1, 2], depths=[1, 1], key_dim=[8, 8], "
              "down_ops=[['Subsample', 8, 32 // 8, 4, 2, 2]])"),
])
def test_hf_configs_keep_a_list_per_stage(tmp_path, name, config):
    """Hierarchical models keep heads and widths per stage: config.json's lists are what
    transformers takes, so they are accepted (they were refused as 'not a valid integer')."""
    import transformers

    cfg = eval(f"transformers.{config}")
    m = load_model(f"hf:{_hf_folder(tmp_path / name, cfg)}")
    assert tuple(m.example_inputs["pixel_values"].shape)[1:] == (3, cfg.image_size, cfg.image_size)
    assert _first(m).ndim >= 2


def test_hf_vision_config_without_image_size_is_an_image_model(tmp_path):
    """CvT's config has no image_size: the model's main input (pixel_values) says it is an image
    model; its size comes from the preprocessor's crop, else 224."""
    from transformers import CvtConfig

    folder = _hf_folder(tmp_path, CvtConfig(embed_dim=[16, 32, 48], num_heads=[1, 2, 3], depth=[1, 2, 3]))
    (folder / "preprocessor_config.json").write_text(json.dumps({"crop_size": {"height": 48, "width": 48}, "size": {"shortest_edge": 56}}))
    m = load_model(f"hf:{folder}")
    assert list(m.example_inputs) == ["pixel_values"] and tuple(m.example_inputs["pixel_values"].shape) == (1, 3, 48, 48)
    assert m.preprocess.resize == 56 and m.preprocess.crop == 48
    (folder / "preprocessor_config.json").unlink()
    assert tuple(load_model(f"hf:{folder}").example_inputs["pixel_values"].shape) == (1, 3, 224, 224)


def test_hf_class_follows_architectures_else_the_base_model(tmp_path):
    """Without 'architectures' the base model is built (a backbone checkpoint has no head to export,
    and a random classifier head is not the model in the folder); the note names the class. The
    class 'architectures' names is built as such; a classifier's weights without it build the classifier."""
    from transformers import ViTMSNConfig, ViTMSNForImageClassification

    cfg = ViTMSNConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                       image_size=32, patch_size=8, num_labels=3)
    base = load_model(f"hf:{_hf_folder(tmp_path / 'a', cfg)}")
    assert type(base.module.model).__name__ == "ViTMSNModel" and _out(base).shape == (1, 17, 32)
    assert "built ViTMSNModel, the base model: config.json names no 'architectures'" in base.meta["notes"][0]
    cfg.architectures = ["ViTMSNForImageClassification"]
    named = load_model(f"hf:{_hf_folder(tmp_path / 'b', cfg, drop_architectures=False)}")
    assert _out(named).shape == (1, 3) and "built ViTMSNForImageClassification (config.json 'architectures')" in named.meta["notes"][0]
    torch.manual_seed(0)
    ViTMSNForImageClassification(cfg).save_pretrained(tmp_path / "c")
    cfg_file = tmp_path / "c" / "config.json"
    cfg_file.write_text(json.dumps({k: v for k, v in json.loads(cfg_file.read_text()).items() if k != "architectures"}))
    weights = load_model(f"hf:{tmp_path / 'c'}")
    assert _out(weights).shape == (1, 3) and "the weights hold a task head" in weights.meta["notes"][0]


def test_hf_roberta_default_length_fits_its_position_table(tmp_path):
    """RoBERTa numbers positions from pad_token_id + 1: a table of 40 holds 38 tokens, and the
    default length says so (40 made the model raise an index error)."""
    from transformers import RobertaConfig

    cfg = RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=40, pad_token_id=1)
    m = load_model(f"hf:{_hf_folder(tmp_path, cfg)}")
    assert tuple(m.example_inputs["input_ids"].shape) == (1, 38) and _first(m).shape == (1, 38, 32)
