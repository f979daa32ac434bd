"""DistilBERT / RoBERTa-style text encoders through the whole ``npu`` recipe: passes, export, contract, INT8.

Their mask and position plumbing (the mask's And, RoBERTa's CumSum and GatherElements) is not on the
NPU op list; the HF attention implementation builds boolean masks with Unsqueeze/Cast only and the
export lowers the rest, so the contract holds and every stage passes its parity gate.
"""
from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import onnx
import pytest
import torch

from vitexport.calibration.data import NpzSamples
from vitexport.pipeline import run_pipeline
from vitexport.targets import build_target, load_recipe
from vitexport.sources import OutputAdapter
from vitexport.sources.base import LoadedModel

SEQ, VOCAB = 32, 500


def _tokens(n: int, seed: int) -> NpzSamples:
    """Token ids with padding masks of a random number of real tokens per sample."""
    rng = np.random.default_rng(seed)
    keep = rng.integers(SEQ // 4, SEQ + 1, size=n)
    mask = (np.arange(SEQ)[None, :] < keep[:, None]).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(2, VOCAB, size=(n, SEQ)), 1).astype(np.int64)  # 1 pads (RoBERTa)
    return NpzSamples({"input_ids": ids, "attention_mask": mask})


def _encoder(kind: str) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    if kind == "distilbert":
        cfg = transformers.DistilBertConfig(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64)
        return transformers.DistilBertModel(cfg).eval()
    cfg = transformers.RobertaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64, pad_token_id=1)
    return transformers.RobertaModel(cfg, add_pooling_layer=False).eval()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["distilbert", "roberta"])
def test_text_encoder_passes_the_npu_recipe(kind, tmp_path):
    module = OutputAdapter(_encoder(kind), ["input_ids", "attention_mask"]).eval()
    example = {"input_ids": torch.randint(2, VOCAB, (1, SEQ)), "attention_mask": torch.ones(1, SEQ, dtype=torch.long)}
    model = LoadedModel(module, example, kind, "hf", f"test:{kind}")
    recipe = load_recipe("npu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arts = run_pipeline(model, build_target(recipe), tmp_path / "out", calib=_tokens(48, 0), parity_data=_tokens(16, 1))
    assert arts.passed
    fp32 = onnx.load(str(arts.files["model.fp32.onnx"]))
    ops = Counter(n.op_type for n in fp32.graph.node)
    assert set(ops) <= set(recipe.contract.allowed_ops), ops
    assert ops["Where"] == 2 and ops["Softmax"] == 2  # both masks are control flow on the logits
    assert (tmp_path / "out" / "model.int8.onnx").is_file()
