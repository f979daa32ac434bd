"""Tiny models with random weights, exported the way the pipeline exports them
(TorchScript ``torch.onnx.export`` + onnxsim), for the quantization tests and benchmarks."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
import torch

__all__ = ["tiny_vit", "plant_outliers", "tiny_bert", "bert_samples", "export_onnx"]


def export_onnx(module: torch.nn.Module, example: dict[str, torch.Tensor], path: Path, opset: int = 17) -> Path:
    """TorchScript export (static shapes, single output ``output``) then onnxsim, like the pipeline."""
    import onnxsim

    module.eval()
    if opset < 14:  # no scaled_dot_product_attention below opset 14: use timm's explicit attention
        for sub in module.modules():
            if hasattr(sub, "fused_attn"):
                sub.fused_attn = False
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(module, tuple(example.values()), buf, input_names=list(example), output_names=["output"],
                          opset_version=opset, dynamo=False)
    m = onnx.load_from_string(buf.getvalue())
    m, ok = onnxsim.simplify(m)
    assert ok
    onnx.save(m, str(path))
    return path


def tiny_vit(img: int = 32, patch: int = 8, depth: int = 2, embed: int = 192, heads: int = 3, classes: int = 10,
             seed: int = 0, name: str = "vit_tiny_patch16_224") -> torch.nn.Module:
    import timm

    torch.manual_seed(seed)
    return timm.create_model(name, pretrained=False, img_size=img, patch_size=patch, depth=depth,
                             embed_dim=embed, num_heads=heads, num_classes=classes).eval()


@torch.no_grad()
def plant_outliers(model: torch.nn.Module, channels=(7, 61, 130), factor: float = 80.0, seed: int = 0) -> torch.nn.Module:
    """Give the LayerNorms a few huge channels, the way trained ViTs have them.

    norm1 / norm2 gamma and beta of ``channels`` are multiplied by ``factor``; the consuming Linear's
    input rows are divided by it, so the float function keeps its scale (compensated) while the
    LayerNorm outputs — the INT8 inputs of qkv / fc1 — have outlier channels of |x| in the 100s.
    The residual stream also gets a few large channels (|x| ~ 100s) through the patch embedding bias.
    """
    g = torch.Generator().manual_seed(seed)
    for blk in model.blocks:
        for norm, lin in ((blk.norm1, blk.attn.qkv), (blk.norm2, blk.mlp.fc1)):
            # trained LN affines are not all ones: a spread of gains, biases around 0
            norm.weight.mul_(1.0 + 0.3 * torch.randn(norm.weight.shape, generator=g).abs())
            norm.bias.add_(0.1 * torch.randn(norm.bias.shape, generator=g))
            for c in channels:
                f = factor * (1.0 + 0.5 * torch.rand((), generator=g))
                norm.weight[c] *= f
                norm.bias[c] = norm.bias[c] * f + f * 0.5
                lin.weight[:, c] /= f
    if hasattr(model, "patch_embed"):
        model.patch_embed.proj.bias[list(channels[:2])] += 150.0
    return model


def tiny_bert(seq: int = 32, hidden: int = 128, layers: int = 2, heads: int = 4, vocab: int = 500, seed: int = 0):
    """A BERT-style masked text encoder with random weights; returns (module, example_inputs).

    The module returns the last hidden state (the embedding); the mask is a padding mask of 0/1.
    """
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=hidden * 4, max_position_embeddings=max(64, seq), attn_implementation="eager")
    bert = BertModel(cfg, add_pooling_layer=False).eval()

    class Encoder(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (1, seq), generator=g)
    mask = torch.ones(1, seq, dtype=torch.long)
    mask[0, seq * 3 // 4:] = 0
    return Encoder(bert).eval(), {"input_ids": ids, "attention_mask": mask}


def bert_samples(n: int, seq: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids plus padding masks with a random number of real tokens per sample."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, size=(n, seq)).astype(np.int64)
    keep = rng.integers(seq // 4, seq + 1, size=n)
    mask = (np.arange(seq)[None, :] < keep[:, None]).astype(np.int64)
    ids = np.where(mask == 1, ids, 0)
    return {"input_ids": ids, "attention_mask": mask}
