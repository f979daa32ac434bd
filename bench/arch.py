"""Architectures of the bench's trained cases, importable by file path.

vitexport reaches them through its public ``python:PATH.py:FUNCTION`` URI plus ``--weights``:
``python:bench/arch.py:digits_vit`` and ``python:bench/arch.py:text_encoder`` build the module with
random weights and return ``(module, example_inputs)``; the weights come from the training scripts
(``scripts/train_digits_vit.py``, ``scripts/train_text_encoder.py``). The same builders are what
those scripts train, so a state dict saved by one loads into the other.

This file is imported by path (``importlib``), so it imports nothing from ``bench`` or ``vitexport``.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["DIGITS", "TEXT", "digits_vit", "text_encoder", "MeanPoolEncoder", "build_digits_vit", "build_text_encoder"]

#: The digits ViT: 8×8 scikit-learn digits rendered at 32×32 with augmentation; 64 patches + CLS.
DIGITS = dict(img_size=32, patch_size=4, in_chans=1, num_classes=10, embed_dim=128, depth=4, num_heads=4, mlp_ratio=4.0)
#: The text encoder: BERT-style (post-LN), 64 tokens with a padding mask, mean pooling over real tokens.
TEXT = dict(vocab_size=1024, hidden_size=192, num_hidden_layers=4, num_attention_heads=6, intermediate_size=768,
            seq_len=64, num_topics=8)


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
