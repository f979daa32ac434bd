"""The zoo: one tiny random-weight model per family users deploy, and what the passes must find in it.

timm, torchvision and Hugging Face (configs built in code, no downloads) plus the seed-style custom
model. ``expect`` is what the reports must say: ``sites`` attention modules, ``masks`` masked ones
(rewritten to ``where``), ``fused`` q/k/v fusions, ``already`` sites already projecting q/k/v with one
Linear, ``biases`` terms kept as adds because they are biases, not masks (relative position tables).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from passes_zoo import randomise_layernorms, seed_vit
from vitexport.sources import OutputAdapter

__all__ = ["ZooCase", "ZOO", "SLOW"]

Inputs = Callable[[int], dict[str, torch.Tensor]]


@dataclass
class ZooCase:
    name: str
    build: Callable[[], tuple[nn.Module, Inputs]]
    expect: dict[str, int]
    text: bool = False  # outputs are per token; padded tokens are left out of parity


def _expect(sites: int, masks: int = 0, fused: int = 0, already: int = 0, biases: int = 0) -> dict[str, int]:
    return {"sites": sites, "masks": masks, "fused": fused, "already": already, "biases": biases}


def _images(size: int, batch: int = 2) -> Inputs:
    return lambda i: {"x": torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(100 + i))}


def _wrap(model: nn.Module, size: int, key: str = "x", batch: int = 2) -> tuple[nn.Module, Inputs]:
    model = randomise_layernorms(model.eval())
    images = _images(size, batch)
    if key == "x":
        return OutputAdapter(model, ["x"], keyword=False).eval(), images
    return OutputAdapter(model, [key]).eval(), lambda i: {key: images(i)["x"]}


def _timm(name: str, size: int = 32, **kw) -> Callable[[], tuple[nn.Module, Inputs]]:
    def build():
        import timm

        torch.manual_seed(0)
        return _wrap(timm.create_model(name, pretrained=False, num_classes=10, **kw), size)

    return build


def _timm_cfg(module: str, cls: str, cfg_name: str, size: int, cfg: dict, sub: dict | None = None):
    def build():
        import importlib

        mod = importlib.import_module(f"timm.models.{module}")
        base = mod.model_cfgs[cfg_name]
        fields = dict(cfg)
        if sub:
            fields["transformer_cfg"] = dataclasses.replace(base.transformer_cfg, **sub)
        torch.manual_seed(0)
        size_kw = {"img_size": (size, size)} if module == "mvitv2" else {"img_size": size}
        return _wrap(getattr(mod, cls)(dataclasses.replace(base, **fields), num_classes=10, **size_kw), size)

    return build


def _tv_swin(v2: bool):
    def build():
        from torchvision.models import swin_transformer as sw

        torch.manual_seed(0)
        kw = dict(block=sw.SwinTransformerBlockV2, downsample_layer=sw.PatchMergingV2) if v2 else {}
        m = sw.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=[4, 4], num_classes=10, **kw)
        nn.init.normal_(m.head.weight, std=0.2)  # zero-initialised head: all-zero logits prove nothing
        return _wrap(m, 32)

    return build


def _tv_vit():
    import torchvision

    torch.manual_seed(0)
    m = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=10)
    nn.init.normal_(m.heads.head.weight, std=0.2)
    return _wrap(m, 32)


_HF = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _hf_vision(config: str, model: str, size: int = 32, **kw):
    def build():
        import transformers

        torch.manual_seed(0)
        cfg = getattr(transformers, config)(**kw)
        return _wrap(getattr(transformers, model)(cfg), size, key="pixel_values")

    return build


def _hf_text(config: str, model: str, **kw):
    def build():
        import transformers

        torch.manual_seed(0)
        m = randomise_layernorms(getattr(transformers, model)(getattr(transformers, config)(vocab_size=100, max_position_embeddings=40, **kw)).eval())
        seq = 12

        def make(i: int) -> dict[str, torch.Tensor]:
            g = torch.Generator().manual_seed(200 + i)
            mask = torch.ones(2, seq, dtype=torch.long)
            mask[1, (seq - 4 + i) % seq or 5:] = 0  # one row padded, by a different amount per variant
            ids = torch.where(mask.bool(), torch.randint(3, 100, (2, seq), generator=g), 1)
            return {"input_ids": ids, "attention_mask": mask}

        return OutputAdapter(m, ["input_ids", "attention_mask"]).eval(), make

    return build


def _seed():
    return OutputAdapter(seed_vit(), ["x"], keyword=False).eval(), _images(32)


_MAXVIT = dict(embed_dim=(16, 32, 32, 32), depths=(1, 1, 1, 1), stem_width=16, head_hidden_size=32)
_MVIT = dict(depths=(1, 1, 1, 1), embed_dim=16, num_heads=1)
_SWIN = dict(window_size=4, depths=(2, 2), num_heads=(2, 4), embed_dim=32)

ZOO: list[ZooCase] = [
    # timm
    ZooCase("timm_vit", _timm("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2), _expect(2, already=2)),
    ZooCase("timm_deit", _timm("deit_tiny_distilled_patch16_224", img_size=32, patch_size=8, depth=2), _expect(2, already=2)),
    ZooCase("timm_swin", _timm("swin_tiny_patch4_window7_224", img_size=32, **_SWIN), _expect(4, 1, already=4, biases=4)),
    ZooCase("timm_swinv2", _timm("swinv2_tiny_window8_256", img_size=32, **_SWIN), _expect(4, 1, already=4, biases=4)),
    ZooCase("timm_eva02", _timm("eva02_tiny_patch14_224", 28, img_size=28, patch_size=7, depth=2), _expect(2, already=2)),
    ZooCase("timm_beit", _timm("beit_base_patch16_224", img_size=32, patch_size=8, depth=2, embed_dim=32, num_heads=4),
            _expect(2, already=2, biases=2)),
    # talking heads (2) and class attention, whose q reads the class token only (not fusable)
    ZooCase("timm_cait", _timm("cait_xxs24_224", img_size=32, patch_size=8, depth=2, depth_token_only=1, embed_dim=32, num_heads=4),
            _expect(3, already=2)),
    ZooCase("timm_mvitv2", _timm_cfg("mvitv2", "MultiScaleVit", "mvitv2_tiny", 64, _MVIT), _expect(4, already=4)),
    # 9 attentions + 2 downsampling attentions (q from a subsampled input); biases come from LeViT's cache
    ZooCase("timm_levit", _timm("levit_128s", 64, img_size=64), _expect(11, already=9, biases=11)),
    # GPSA: qk + v become one Linear; the last block is plain MHSA
    ZooCase("timm_convit", _timm("convit_tiny", img_size=32, patch_size=8, depth=2, local_up_to_layer=1, embed_dim=48, num_heads=4),
            _expect(2, fused=1, already=1)),
    ZooCase("timm_vit_relpos", _timm("vit_relpos_small_patch16_224", img_size=32, patch_size=8, depth=2, embed_dim=32, num_heads=4),
            _expect(2, already=2, biases=2)),
    # its attention biases are sized for 224 x 224 inputs (7 x 7 tokens in the last stage)
    ZooCase("timm_efficientformer", _timm("efficientformer_l1", 224, depths=(1, 1, 1, 2), embed_dims=(8, 16, 24, 32), num_vit=1),
            _expect(1, already=1, biases=1)),
    ZooCase("timm_maxvit", _timm_cfg("maxxvit", "MaxxVit", "maxvit_tiny_tf", 64, _MAXVIT, {"dim_head": 8}),
            _expect(8, already=8, biases=8)),
    # torchvision
    ZooCase("tv_vit", _tv_vit, _expect(2, already=2)),
    ZooCase("tv_swin_t", _tv_swin(False), _expect(4, 1, already=4, biases=4)),
    ZooCase("tv_swin_v2_t", _tv_swin(True), _expect(4, 1, already=4, biases=4)),
    # Hugging Face vision
    ZooCase("hf_vit", _hf_vision("ViTConfig", "ViTForImageClassification", image_size=32, patch_size=8, num_labels=10, **_HF),
            _expect(2, fused=2)),
    ZooCase("hf_deit", _hf_vision("DeiTConfig", "DeiTForImageClassificationWithTeacher", image_size=32, patch_size=8, num_labels=10, **_HF),
            _expect(2, fused=2)),
    ZooCase("hf_dinov2", _hf_vision("Dinov2Config", "Dinov2Model", image_size=32, patch_size=8, **_HF), _expect(2, fused=2)),
    ZooCase("hf_clip_vision", _hf_vision("CLIPVisionConfig", "CLIPVisionModel", image_size=32, patch_size=8, **_HF), _expect(2, fused=2)),
    # the pooling head is an nn.MultiheadAttention (packed in_proj)
    ZooCase("hf_siglip_vision", _hf_vision("SiglipVisionConfig", "SiglipVisionModel", image_size=32, patch_size=8, **_HF),
            _expect(3, fused=2, already=1)),
    ZooCase("hf_beit", _hf_vision("BeitConfig", "BeitModel", image_size=32, patch_size=8, use_relative_position_bias=True, **_HF),
            _expect(2, fused=2, biases=2)),
    ZooCase("hf_data2vec_vision", _hf_vision("Data2VecVisionConfig", "Data2VecVisionModel", image_size=32, patch_size=8,
                                             use_relative_position_bias=True, **_HF), _expect(2, fused=2, biases=2)),
    ZooCase("hf_yolos", _hf_vision("YolosConfig", "YolosModel", image_size=[32, 32], patch_size=8, num_detection_tokens=4, **_HF),
            _expect(2, fused=2)),
    # the shifted block's window mask arrives added to its learned bias: one mask (split), three biases
    ZooCase("hf_swin", _hf_vision("SwinConfig", "SwinModel", image_size=32, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=4),
            _expect(4, 1, fused=4, biases=3)),
    # Hugging Face text
    ZooCase("hf_bert", _hf_text("BertConfig", "BertModel", **_HF), _expect(2, 2, fused=2), text=True),
    ZooCase("hf_distilbert", _hf_text("DistilBertConfig", "DistilBertModel", dim=32, n_layers=2, n_heads=4, hidden_dim=64),
            _expect(2, 2, fused=2), text=True),
    ZooCase("hf_roberta", _hf_text("RobertaConfig", "RobertaModel", pad_token_id=1, **_HF), _expect(2, 2, fused=2), text=True),
    # hand-written: einsum attention, separate q/k/v, a 0 / -1e9 padding buffer
    ZooCase("seed", _seed, _expect(2, 2, fused=2)),
]

#: Members that take longest to build and export (each a few seconds on a shared core).
SLOW = {"timm_maxvit", "timm_levit", "timm_mvitv2", "tv_swin_v2_t", "timm_swinv2"}
