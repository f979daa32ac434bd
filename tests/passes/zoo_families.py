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

from passes_zoo import first_output_adapter, randomise_layernorms, seed_vit
from zoo_init import realistic_init
from vitexport.sources import OutputAdapter

__all__ = ["ZooCase", "ZOO", "SLOW", "CORE", "EXPORT_FAST", "INT8_SHARE", "INT8_MISS"]

Inputs = Callable[[int], dict[str, torch.Tensor]]


@dataclass
class ZooCase:
    """One family: how to build it, what the passes must find, and how ``vitexport export`` gets it.

    ``hf``: exported through an ``hf:`` folder (``"named"``: config.json keeps ``architectures``;
    ``"base"``: it has none, so the base model is built), else through ``python:`` (``zoo_entry``).
    ``targets``: the recipes the export zoo runs it for. ``int8``: why this random-weight model's
    INT8 may miss its parity gate (exit 1 is then allowed, with the figures); None: it must pass.
    ``real``: the full-size model users deploy (``timm:NAME``, ``torchvision:NAME``, ``hf:ConfigClass``),
    whose memory pre-check the zoo runs at its own input size.
    """

    name: str
    build: Callable[[], tuple[nn.Module, Inputs]]
    expect: dict[str, int]
    text: bool = False  # outputs are per token; padded tokens are left out of parity
    hf: str | None = None
    targets: tuple[str, ...] = ("orin",)
    int8: str | None = None
    real: str | None = None
    #: (the least INT8 share accepted, why): a model whose backend runs less of its GEMM/Conv work in INT8
    #: than its target's share passes that gate only explicitly (``--set parity.<stage>.int8_share_min``)
    int8_share: tuple[float, str] | None = None


def _expect(sites: int, masks: int = 0, fused: int = 0, already: int = 0, biases: int = 0) -> dict[str, int]:
    return {"sites": sites, "masks": masks, "fused": fused, "already": already, "biases": biases}


def _images(size: int, batch: int = 2) -> Inputs:
    return lambda i: {"x": torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(100 + i))}


def _wrap(model: nn.Module, size: int, key: str = "x", batch: int = 2) -> tuple[nn.Module, Inputs]:
    model = randomise_layernorms(model.eval())
    # zero BatchNorm scales, 1e-5 layer scales and BatchNorm statistics no activation has: re-drawn as
    # training leaves them, so the zoo's INT8 figures are about the architecture, not its init
    realistic_init(model, (_images(size, 8)(50)["x"],))
    images = _images(size, batch)
    if key == "x":
        return first_output_adapter(model, ["x"], images(0), keyword=False), images
    return first_output_adapter(model, [key], {key: images(0)["x"]}), lambda i: {key: images(i)["x"]}


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

        return first_output_adapter(m, ["input_ids", "attention_mask"], make(0)), make

    return build


def _timm_cls(module: str, cls: str, size: int, **kw) -> Callable[[], tuple[nn.Module, Inputs]]:
    """A timm architecture class with a config of its own (variants fix depths a small one must change)."""

    def build():
        import importlib

        torch.manual_seed(0)
        return _wrap(getattr(importlib.import_module(f"timm.models.{module}"), cls)(num_classes=10, **kw), size)

    return build


def _tv(name: str, size: int, zero_head: str | None = None, **kw) -> Callable[[], tuple[nn.Module, Inputs]]:
    def build():
        import torchvision

        torch.manual_seed(0)
        m = getattr(torchvision.models, name)(num_classes=10, **kw)
        if zero_head:  # torchvision zero-initialises some heads: all-zero logits prove nothing
            nn.init.normal_(m.get_submodule(zero_head).weight, std=0.2)
        return _wrap(m, size)

    return build


def _seed():
    return OutputAdapter(seed_vit(), ["x"], keyword=False).eval(), _images(32)


_MAXVIT = dict(embed_dim=(16, 32, 32, 32), depths=(1, 1, 1, 1), stem_width=16, head_hidden_size=32)
_MVIT = dict(depths=(1, 1, 1, 1), embed_dim=16, num_heads=1)
_SWIN = dict(window_size=4, depths=(2, 2), num_heads=(2, 4), embed_dim=32)
_STAGES2 = dict(depths=[1, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2],
                mlp_ratios=[2, 2], num_encoder_blocks=2)

ZOO: list[ZooCase] = [
    # timm
    ZooCase("timm_vit", _timm("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2), _expect(2, already=2),
            targets=("orin", "npu", "cpu"), real="timm:vit_tiny_patch16_224"),
    ZooCase("timm_deit", _timm("deit_tiny_distilled_patch16_224", img_size=32, patch_size=8, depth=2), _expect(2, already=2),
            real="timm:deit_tiny_distilled_patch16_224"),
    ZooCase("timm_swin", _timm("swin_tiny_patch4_window7_224", img_size=32, **_SWIN), _expect(4, 1, already=4, biases=4),
            real="timm:swin_tiny_patch4_window7_224"),
    ZooCase("timm_swinv2", _timm("swinv2_tiny_window8_256", img_size=32, **_SWIN), _expect(4, 1, already=4, biases=4),
            targets=("orin", "npu"), real="timm:swinv2_tiny_window8_256"),
    ZooCase("timm_eva02", _timm("eva02_tiny_patch14_224", 28, img_size=28, patch_size=7, depth=2), _expect(2, already=2),
            real="timm:eva02_tiny_patch14_224"),
    ZooCase("timm_beit", _timm("beit_base_patch16_224", img_size=32, patch_size=8, depth=2, embed_dim=32, num_heads=4),
            _expect(2, already=2, biases=2)),
    # talking heads (2) and class attention, whose q reads the class token only (not fusable)
    ZooCase("timm_cait", _timm("cait_xxs24_224", img_size=32, patch_size=8, depth=2, depth_token_only=1, embed_dim=32, num_heads=4),
            _expect(3, already=2), real="timm:cait_xxs24_224"),
    ZooCase("timm_mvitv2", _timm_cfg("mvitv2", "MultiScaleVit", "mvitv2_tiny", 64, _MVIT), _expect(4, already=4),
            real="timm:mvitv2_tiny"),
    # 9 attentions + 2 downsampling attentions (q from a subsampled input); biases come from LeViT's cache
    ZooCase("timm_levit", _timm("levit_128s", 64, img_size=64), _expect(11, already=9, biases=11), real="timm:levit_128s"),
    # GPSA: qk + v become one Linear; the last block is plain MHSA
    ZooCase("timm_convit", _timm("convit_tiny", img_size=32, patch_size=8, depth=2, local_up_to_layer=1, embed_dim=48, num_heads=4),
            _expect(2, fused=1, already=1), real="timm:convit_tiny"),
    ZooCase("timm_vit_relpos", _timm("vit_relpos_small_patch16_224", img_size=32, patch_size=8, depth=2, embed_dim=32, num_heads=4),
            _expect(2, already=2, biases=2), real="timm:vit_relpos_small_patch16_224"),
    # its attention biases are sized for 224 x 224 inputs (7 x 7 tokens in the last stage)
    ZooCase("timm_efficientformer", _timm("efficientformer_l1", 224, depths=(1, 1, 1, 2), embed_dims=(8, 16, 24, 32), num_vit=1),
            _expect(1, already=1, biases=1), real="timm:efficientformer_l1"),
    ZooCase("timm_maxvit", _timm_cfg("maxxvit", "MaxxVit", "maxvit_tiny_tf", 64, _MAXVIT, {"dim_head": 8}),
            _expect(8, already=8, biases=8)),
    # hybrids: convolutions, then attention in some stages (windowed, pooled, cascaded or linear)
    ZooCase("timm_efficientvit_m0", _timm("efficientvit_m0", 64, img_size=64), _expect(6, biases=24), real="timm:efficientvit_m0"),
    ZooCase("timm_efficientvit_b0", _timm("efficientvit_b0", 64), _expect(0), real="timm:efficientvit_b0"),
    ZooCase("timm_mobilevit_xxs", _timm("mobilevit_xxs", 64), _expect(9, already=9), real="timm:mobilevit_xxs"),
    ZooCase("timm_mobilevitv2", _timm("mobilevitv2_050", 64), _expect(0), real="timm:mobilevitv2_050"),
    ZooCase("timm_efficientformerv2", _timm("efficientformerv2_s0", 64, img_size=64, depths=(1, 1, 1, 1)), _expect(3, biases=3),
            real="timm:efficientformerv2_s0"),
    ZooCase("timm_hiera", _timm("hiera_tiny_224", 64, img_size=64, embed_dim=32, num_heads=1, stages=(1, 1, 1, 1)), _expect(4, already=4),
            real="timm:hiera_tiny_224"),
    ZooCase("timm_gcvit", _timm_cls("gcvit", "GlobalContextVit", 64, img_size=64, depths=(1, 1, 1, 1), embed_dim=32,
                                    num_heads=(1, 2, 4, 8)), _expect(4, already=4, biases=4), real="timm:gcvit_xxtiny"),
    ZooCase("timm_nextvit", _timm_cls("nextvit", "NextViT", 64, in_chans=3, depths=(1, 1, 5, 1)), _expect(3, fused=1), real="timm:nextvit_small"),
    ZooCase("timm_pvt_v2", _timm("pvt_v2_b0", 64, depths=(1, 1, 1, 1)), _expect(4, fused=1), real="timm:pvt_v2_b0"),
    ZooCase("timm_volo", _timm_cls("volo", "VOLO", 64, layers=(1, 1, 1, 1), img_size=64, embed_dims=(32, 64, 64, 64),
                                   num_heads=(1, 2, 2, 2), stem_hidden_dim=16), _expect(5, already=3), real="timm:volo_d1_224"),
    ZooCase("timm_tiny_vit", _timm_cls("tiny_vit", "TinyVit", 64, depths=(1, 1, 1, 1), embed_dims=(16, 32, 64, 64),
                                       num_heads=(1, 2, 2, 4)), _expect(3, already=3, biases=3), targets=("orin", "npu"), real="timm:tiny_vit_5m_224"),
    ZooCase("timm_xcit", _timm("xcit_nano_12_p16_224", img_size=32, patch_size=8, depth=2), _expect(4, already=2), real="timm:xcit_nano_12_p16_224"),
    ZooCase("timm_coat_lite", _timm("coat_lite_tiny", 64, img_size=64, serial_depths=(1, 1, 1, 1)), _expect(0), real="timm:coat_lite_tiny"),
    ZooCase("timm_twins", _timm("twins_svt_small", 64, img_size=64, depths=(1, 1, 1, 1)), _expect(4, already=4), real="timm:twins_svt_small"),
    ZooCase("timm_pit", _timm("pit_ti_224", 64, img_size=64, depth=(1, 1, 1)), _expect(3, already=3), real="timm:pit_ti_224"),
    ZooCase("timm_davit", _timm("davit_tiny", 64, depths=(1, 1, 1, 1), embed_dims=(16, 32, 64, 64), num_heads=(1, 2, 2, 4)), _expect(8, already=8),
            real="timm:davit_tiny"),
    ZooCase("timm_edgenext", _timm("edgenext_xx_small", 64, depths=(1, 1, 1, 1)), _expect(3, already=3), real="timm:edgenext_xx_small"),
    ZooCase("timm_coatnet", _timm_cfg("maxxvit", "MaxxVit", "coatnet_0_rw", 64, dict(embed_dim=(16, 32, 32, 32), depths=(1, 1, 1, 1),
                                                                                   stem_width=16)), _expect(2, biases=2),
            real="timm:coatnet_0_rw_224"),
    ZooCase("timm_vit_registers", _timm("vit_small_patch14_reg4_dinov2", 28, img_size=28, depth=2), _expect(2, already=2),
            real="timm:vit_small_patch14_reg4_dinov2"),
    ZooCase("timm_deit3", _timm("deit3_small_patch16_224", img_size=32, patch_size=8, depth=2), _expect(2, already=2),
            real="timm:deit3_small_patch16_224"),
    ZooCase("timm_samvit", _timm("samvit_base_patch16", 64, img_size=64, depth=2, embed_dim=32, num_heads=2,
                                 global_attn_indexes=(1,), window_size=2), _expect(2, already=2, biases=2)),
    ZooCase("timm_nest", _timm_cls("nest", "Nest", 64, img_size=64, depths=(1, 1, 1), embed_dims=(16, 32, 64), num_heads=(1, 2, 4)),
            _expect(3, already=3), real="timm:nest_tiny_jx"),
    ZooCase("timm_tnt", _timm("tnt_s_patch16_224", img_size=32, patch_size=8, depth=2), _expect(4, fused=4), real="timm:tnt_s_patch16_224"),
    ZooCase("timm_crossvit", _timm("crossvit_9_240", 240, img_size=240, depth=([1, 1, 0],)), _expect(4, already=2), real="timm:crossvit_9_240"),
    ZooCase("timm_fastvit", _timm("fastvit_sa12", 64, layers=(1, 1, 1, 1)), _expect(1, already=1), real="timm:fastvit_sa12"),
    ZooCase("timm_vit_rope", _timm("vit_base_patch16_rope_reg1_gap_256", img_size=32, patch_size=8, depth=2, embed_dim=64, num_heads=4),
            _expect(2, already=2)),
    ZooCase("timm_convnext", _timm("convnext_atto", 64), _expect(0), real="timm:convnext_atto"),  # no attention: a CNN exports too
    # torchvision
    ZooCase("tv_vit", _tv_vit, _expect(2, already=2), real="torchvision:vit_b_16"),
    ZooCase("tv_swin_t", _tv_swin(False), _expect(4, 1, already=4, biases=4), real="torchvision:swin_t"),
    ZooCase("tv_swin_v2_t", _tv_swin(True), _expect(4, 1, already=4, biases=4), real="torchvision:swin_v2_t"),
    ZooCase("tv_maxvit", _tv("MaxVit", 64, input_size=(64, 64), stem_channels=16, partition_size=2, block_channels=[16, 32],
                             block_layers=[1, 1], head_dim=8, stochastic_depth_prob=0.0), _expect(4, already=4, biases=4), real="torchvision:maxvit_t"),
    ZooCase("tv_resnet", _tv("resnet18", 64), _expect(0), real="torchvision:resnet18"),
    # Hugging Face vision, through hf: folders
    ZooCase("hf_vit", _hf_vision("ViTConfig", "ViTForImageClassification", image_size=32, patch_size=8, num_labels=10, **_HF),
            _expect(2, fused=2), hf="named", targets=("orin", "npu"), real="hf:ViTConfig"),
    ZooCase("hf_deit", _hf_vision("DeiTConfig", "DeiTForImageClassificationWithTeacher", image_size=32, patch_size=8, num_labels=10, **_HF),
            _expect(2, fused=2), hf="named"),
    ZooCase("hf_dinov2", _hf_vision("Dinov2Config", "Dinov2Model", image_size=32, patch_size=8, **_HF), _expect(2, fused=2),
            hf="base", real="hf:Dinov2Config"),
    ZooCase("hf_clip_vision", _hf_vision("CLIPVisionConfig", "CLIPVisionModel", image_size=32, patch_size=8, **_HF), _expect(2, fused=2),
            hf="named", real="hf:CLIPVisionConfig"),
    # the pooling head is an nn.MultiheadAttention (packed in_proj)
    ZooCase("hf_siglip_vision", _hf_vision("SiglipVisionConfig", "SiglipVisionModel", image_size=32, patch_size=8, **_HF),
            _expect(3, fused=2, already=1), hf="named"),
    ZooCase("hf_beit", _hf_vision("BeitConfig", "BeitModel", image_size=32, patch_size=8, use_relative_position_bias=True, **_HF),
            _expect(2, fused=2, biases=2), hf="base"),
    ZooCase("hf_data2vec_vision", _hf_vision("Data2VecVisionConfig", "Data2VecVisionModel", image_size=32, patch_size=8,
                                             use_relative_position_bias=True, **_HF), _expect(2, fused=2, biases=2), hf="named"),
    ZooCase("hf_yolos", _hf_vision("YolosConfig", "YolosModel", image_size=[32, 32], patch_size=8, num_detection_tokens=4, **_HF),
            _expect(2, fused=2), hf="named"),
    # the shifted block's window mask arrives added to its learned bias: one mask (split), three biases
    ZooCase("hf_swin", _hf_vision("SwinConfig", "SwinModel", image_size=32, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=4),
            _expect(4, 1, fused=4, biases=3), hf="base"),
    ZooCase("hf_swinv2", _hf_vision("Swinv2Config", "Swinv2Model", image_size=32, patch_size=4, embed_dim=16, depths=[2, 2],
                                    num_heads=[2, 2], window_size=4), _expect(4, 1, fused=4, biases=4), hf="base", real="hf:Swinv2Config"),
    ZooCase("hf_segformer", _hf_vision("SegformerConfig", "SegformerModel", sr_ratios=[2, 1], image_size=32, **_STAGES2), _expect(2, fused=1),
            hf="base", real="hf:SegformerConfig"),
    ZooCase("hf_pvt_v2", _hf_vision("PvtV2Config", "PvtV2Model", sr_ratios=[2, 1], image_size=32, **_STAGES2), _expect(2, fused=1), hf="base",
            real="hf:PvtV2Config"),
    ZooCase("hf_pvt", _hf_vision("PvtConfig", "PvtModel", image_size=32, depths=[1, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                                 sequence_reduction_ratios=[2, 1], patch_sizes=[4, 2], strides=[4, 2], mlp_ratios=[2, 2],
                                 num_encoder_blocks=2), _expect(2, fused=1), hf="base", real="hf:PvtConfig"),
    ZooCase("hf_levit", _hf_vision("LevitConfig", "LevitModel", 64, image_size=64, hidden_sizes=[32, 48], num_attention_heads=[1, 2],
                                   depths=[1, 1], key_dim=[8, 8], down_ops=[["Subsample", 8, 4, 4, 2, 2]]), _expect(3, already=2, biases=3), hf="base",
            real="hf:LevitConfig"),
    ZooCase("hf_mobilevit", _hf_vision("MobileViTConfig", "MobileViTModel", 64, image_size=64, hidden_sizes=[32, 40, 48],
                                       neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64]), _expect(9, fused=9), hf="base", real="hf:MobileViTConfig"),
    ZooCase("hf_mobilevitv2", _hf_vision("MobileViTV2Config", "MobileViTV2Model", 64, image_size=64, width_multiplier=0.5), _expect(0),
            hf="base", real="hf:MobileViTV2Config"),
    ZooCase("hf_cvt", _hf_vision("CvtConfig", "CvtModel", 64, embed_dim=[16, 32, 48], num_heads=[1, 2, 3], depth=[1, 2, 3]), _expect(6),
            hf="base", real="hf:CvtConfig"),
    ZooCase("hf_dinov2_registers", _hf_vision("Dinov2WithRegistersConfig", "Dinov2WithRegistersModel", image_size=32, patch_size=8,
                                              **_HF), _expect(2, fused=2), hf="base", real="hf:Dinov2WithRegistersConfig"),
    ZooCase("hf_vit_msn", _hf_vision("ViTMSNConfig", "ViTMSNModel", image_size=32, patch_size=8, **_HF), _expect(2, fused=2), hf="base",
            real="hf:ViTMSNConfig"),
    ZooCase("hf_ijepa", _hf_vision("IJepaConfig", "IJepaModel", image_size=32, patch_size=8, **_HF), _expect(2, fused=2), hf="base",
            real="hf:IJepaConfig"),
    ZooCase("hf_vitdet", _hf_vision("VitDetConfig", "VitDetModel", 64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    mlp_ratio=2, image_size=64, pretrain_image_size=64, patch_size=8,
                                    use_relative_position_embeddings=True), _expect(2, already=2, biases=4), hf="base", real="hf:VitDetConfig"),
    ZooCase("hf_hiera", _hf_vision("HieraConfig", "HieraModel", 64, image_size=[64, 64], embed_dim=16, num_heads=[1, 1, 1, 1],
                                   depths=[1, 1, 1, 1], patch_stride=[4, 4], masked_unit_size=[8, 8]), _expect(4, already=4), hf="base",
            real="hf:HieraConfig"),
    ZooCase("hf_dpt", _hf_vision("DPTConfig", "DPTModel", hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                 intermediate_size=64, image_size=32, patch_size=8, backbone_out_indices=[0, 1, 2, 3]), _expect(4, fused=4),
            hf="base"),
    ZooCase("hf_glpn", _hf_vision("GLPNConfig", "GLPNModel", sr_ratios=[2, 1], decoder_hidden_size=16, **_STAGES2), _expect(2, fused=1),
            hf="base", real="hf:GLPNConfig"),
    # Hugging Face text
    ZooCase("hf_bert", _hf_text("BertConfig", "BertModel", **_HF), _expect(2, 2, fused=2), text=True, hf="named",
            targets=("orin", "npu")),
    ZooCase("hf_distilbert", _hf_text("DistilBertConfig", "DistilBertModel", dim=32, n_layers=2, n_heads=4, hidden_dim=64),
            _expect(2, 2, fused=2), text=True, hf="named"),
    ZooCase("hf_roberta", _hf_text("RobertaConfig", "RobertaModel", pad_token_id=1, **_HF), _expect(2, 2, fused=2), text=True,
            hf="named"),
    ZooCase("hf_electra", _hf_text("ElectraConfig", "ElectraModel", embedding_size=32, **_HF), _expect(2, 2, fused=2), text=True, hf="base"),
    # hand-written: einsum attention, separate q/k/v, a 0 / -1e9 padding buffer
    ZooCase("seed", _seed, _expect(2, 2, fused=2)),
]

_HEAD8 = "head size 8: TensorRT has no fused INT8 attention for it, so attention's batched MatMuls stay FP16"
#: Families whose written file runs less of its GEMM/Conv work in INT8 than their target's share (measured
#: with these tiny widths, where attention and unquantizable convs weigh more than at full size): each
#: passes that gate only explicitly, at its measured share rounded down, for the reason the report gives.
#: With zoo_init's weights (issue 28) timm_efficientformer (0.72 -> 0.85), tv_maxvit (0.68 -> 0.96),
#: hf_mobilevit (0.55 -> 0.82) and hf_mobilevitv2 (0.03 -> 0.90) need no exception: their float convs
#: read the collapsed activations of zero BatchNorm scales, 1e-5 layer scales and unmeasured statistics
INT8_SHARE: dict[str, tuple[float, str]] = {
    "hf_cvt": (0.37, "3136- and 784-token attention: no fused INT8 attention in TensorRT beyond 512 tokens"),
    "hf_glpn": (0.17, "3136- and 784-token attention: no fused INT8 attention in TensorRT beyond 512 tokens"),
    "hf_vitdet": (0.70, "activation x activation MatMuls that are not attention, and " + _HEAD8),
    "hf_bert": (0.76, _HEAD8),
    "hf_distilbert": (0.76, _HEAD8),
    "hf_roberta": (0.77, _HEAD8),
    "hf_electra": (0.76, _HEAD8),
}
_REAL = "zoo_init's trained-looking random weights on Gaussian inputs: "
#: Families whose INT8 misses the 0.98 cosine gate once their weights are not degenerate (exit 1, with
#: the figures; the fallback's float layers lower the share too). Measured on orin; "was": the cosine
#: and share with the init's own weights, where the collapsed branches made the model shallow
INT8_MISS: dict[str, str] = {
    "timm_efficientvit_m0": _REAL + "INT8 cosine 0.856, 99.6 % INT8 (was 0.996)",
    "timm_efficientvit_b0": _REAL + "INT8 cosine 0.900, 81 % INT8 (was 0.9997)",
    "timm_levit": _REAL + "INT8 cosine 0.929, 91 % INT8 (was 0.999)",
    "timm_mobilevit_xxs": _REAL + "INT8 cosine 0.973, 92 % INT8 (was 0.982)",
    "timm_mobilevitv2": _REAL + "INT8 cosine 0.76, 89 % INT8: the error spreads over all 61 quantized layers (was 0.66)",
    "timm_tiny_vit": _REAL + "INT8 cosine 0.972 (npu 0.955), 56 % INT8 (npu 36 %) after the fallback (was 0.93 INT8 at parity)",
    "hf_levit": _REAL + "INT8 cosine 0.959, 55 % INT8 after the fallback (was 0.77 INT8 at parity)",
    "hf_mobilevit": _REAL + "INT8 cosine 0.894, 82 % INT8 (was 0.55 INT8 at parity)",
    "hf_mobilevitv2": _REAL + "INT8 cosine 0.967, 90 % INT8 (was 0.03 INT8 at parity)",
}
for _case in ZOO:
    _case.int8_share = INT8_SHARE.get(_case.name, _case.int8_share)
    _case.int8 = INT8_MISS.get(_case.name, _case.int8)

#: Members that take longest to build and export (each a few seconds on a shared core).
SLOW = {"timm_maxvit", "timm_levit", "timm_mvitv2", "tv_swin_v2_t", "timm_swinv2"}
#: The families whose passes ``make test`` checks (tests/passes/test_zoo.py); the others run in
#: ``make test-zoo`` (marker ``zoo``), with every family's export (tests/test_export_zoo.py).
CORE = {"timm_vit", "timm_deit", "timm_swin", "timm_swinv2", "timm_eva02", "timm_beit", "timm_cait", "timm_mvitv2",
        "timm_levit", "timm_convit", "timm_vit_relpos", "timm_efficientformer", "timm_maxvit", "tv_vit", "tv_swin_t",
        "tv_swin_v2_t", "hf_vit", "hf_deit", "hf_dinov2", "hf_clip_vision", "hf_siglip_vision", "hf_beit",
        "hf_data2vec_vision", "hf_yolos", "hf_swin", "hf_bert", "hf_distilbert", "hf_roberta", "seed"}
#: The families whose whole export runs in ``make test`` too (one per defect the zoo found: 33 s
#: together on 2 shared cores); the rest of the export zoo runs in ``make test-zoo``. HF
#: Dinov2WithRegisters (opset raised to 18: a dynamo export, 8-27 s) runs
#: there: make test covers its defect in tests/export/test_export_onnx.py (the opset the contract
#: allows) and tests/sources/test_sources.py (the base class built).
EXPORT_FAST = {"timm_efficientvit_m0", "timm_efficientformerv2", "hf_segformer", "hf_cvt", "tv_vit"}
