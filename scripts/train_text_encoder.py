"""Train the bench's sentence encoder (``bench/arch.py:text_encoder``), deterministically, offline, on 1 thread.

A BERT-style post-LN encoder with a padding mask and mean pooling over the real tokens, trained to
classify the topic of synthetic sentences (no text corpus ships offline): each topic is a Zipf
distribution over its own ranking of content words, a sentence mixes its topic's words with a
distractor topic's and with shared function words, between 6 and 64 tokens long with ``[CLS]`` first
and ``[SEP]`` last, padded with 0. A linear head on the pooled embedding is trained with it and saved
apart (``head.npz``): the exported model is the encoder; the bench scores the embedding's cosine and,
through the head, topic accuracy.

Massive activations, grown the way trained transformers grow them, are planted and held fixed while
the rest trains around them:

* outlier channels: a few hidden channels whose LayerNorm gain is ×30–45 with a shifted bias, in every
  LayerNorm but the last (post-LN: the LayerNorm output *is* the residual stream and every Q/K/V and
  FFN input), like BERT's known outlier dimensions;
* massive tokens: ``[CLS]`` and ``[SEP]`` embeddings carry ±250 in two other channels, the attention
  sinks of trained encoders, so the first LayerNorm's input has |x| in the hundreds on those tokens.

Writes to ``--out``: ``weights.safetensors``, ``calib.npz`` / ``parity.npz`` / ``score.npz``
(``input_ids``, ``attention_mask``; parity and score also ``y``), ``head.npz`` (``w``, ``b``), ``meta.json``.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from _train_common import deterministic, save_outputs

from bench.arch import TEXT, build_text_encoder

__all__ = ["Corpus", "plant_massive", "main"]

PAD, CLS, SEP, N_FUNCTION = 0, 1, 2, 64
SIZES = {"calib": 256, "parity": 128, "score": 256}
TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


class Corpus:
    """Synthetic topic sentences over ``vocab`` token ids (see module docstring)."""

    def __init__(self, vocab: int, topics: int, seq: int, seed: int):
        rng = np.random.default_rng(seed)
        self.vocab, self.topics, self.seq = vocab, topics, seq
        content = np.arange(3 + N_FUNCTION, vocab)
        zipf = 1.0 / np.arange(1, 201) ** 1.1
        self.topic_words = [rng.permutation(content)[:200] for _ in range(topics)]
        self.topic_p = zipf / zipf.sum()
        fz = 1.0 / np.arange(1, N_FUNCTION + 1)
        self.function_p = fz / fz.sum()

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n`` sentences: (input_ids, attention_mask) int64 (n, seq), topic labels (n,)."""
        ids = np.zeros((n, self.seq), np.int64)
        mask = np.zeros((n, self.seq), np.int64)
        y = rng.integers(0, self.topics, n)
        for i in range(n):
            length = int(rng.integers(6, self.seq + 1))
            other = (y[i] + rng.integers(1, self.topics)) % self.topics
            body = length - 2
            kind = rng.random(body)
            topic = np.where(rng.random(body) < 0.65, y[i], other)
            words = np.array([self.topic_words[t][rng.choice(200, p=self.topic_p)] for t in topic])
            func = 3 + rng.choice(N_FUNCTION, size=body, p=self.function_p)
            ids[i, :length] = np.concatenate([[CLS], np.where(kind < 0.4, func, words), [SEP]])
            mask[i, :length] = 1
        return ids, mask, y.astype(np.int64)


def _norms(enc) -> list:
    """The LayerNorms that get outlier channels: all but the last (the embedding's output stays sane)."""
    bert = enc.bert
    norms = [bert.embeddings.LayerNorm]
    for layer in bert.encoder.layer:
        norms += [layer.attention.output.LayerNorm, layer.output.LayerNorm]
    return norms[:-1]


def plant_massive(enc, seed: int = 0) -> dict:
    """Choose the outlier channels and massive-token channels, and their fixed values.

    Returns:
        The plan (channel indices, gains, biases, token values), to re-apply after each step.
    """
    g = np.random.default_rng(seed + 100)
    hidden = enc.bert.config.hidden_size
    ch = g.permutation(hidden)[:5]
    outlier, token = ch[:3].tolist(), ch[3:].tolist()
    gains = (30.0 + 15.0 * g.random(3)).round(1).tolist()
    biases = (g.choice([-1.0, 1.0], 3) * (5.0 + 5.0 * g.random(3))).round(1).tolist()
    plan = {"outlier_channels": outlier, "gains": gains, "biases": biases, "token_channels": token,
            "token_values": [250.0, -250.0], "tokens": [CLS, SEP]}
    apply_massive(enc, plan)
    return plan


@torch.no_grad()
def apply_massive(enc, plan: dict) -> None:
    """Write the planted values (called after every optimiser step: they are held fixed)."""
    for norm in _norms(enc):
        for c, gain, bias in zip(plan["outlier_channels"], plan["gains"], plan["biases"]):
            norm.weight[c] = gain
            norm.bias[c] = bias
    emb = enc.bert.embeddings.word_embeddings.weight
    for tok in plan["tokens"]:
        for c, v in zip(plan["token_channels"], plan["token_values"]):
            emb[tok, c] = v


def _accuracy(enc, head, ids, mask, y) -> float:
    enc.eval()
    with torch.no_grad():
        out = [head(enc(torch.from_numpy(ids[i : i + 128]), torch.from_numpy(mask[i : i + 128]))) for i in range(0, len(ids), 128)]
    return float((torch.cat(out).argmax(1).numpy() == y).mean())


def main(argv: list[str] | None = None) -> dict:
    """Train and write the outputs; returns ``meta``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="a tiny model, a few steps, small splits (tests)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    deterministic(a.seed)
    cfg = {**TEXT, **(TINY if a.tiny else {})}
    corpus = Corpus(cfg["vocab_size"], cfg["num_topics"], cfg["seq_len"], a.seed)
    # One pool for the three evaluation splits, cut by index: disjoint by construction.
    sizes = {k: (16 if a.tiny else v) for k, v in SIZES.items()}
    ids, mask, y = corpus.sample(sum(sizes.values()), np.random.default_rng(a.seed + 1))
    splits, start = {}, 0
    for name, n in sizes.items():
        splits[name] = (ids[start : start + n], mask[start : start + n], y[start : start + n])
        start += n
    enc = build_text_encoder(**(TINY if a.tiny else {}))
    plan = plant_massive(enc, a.seed)
    head = torch.nn.Linear(cfg["hidden_size"], cfg["num_topics"])
    steps = 3 if a.tiny else a.steps
    params = list(enc.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=5e-4, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-4, total_steps=steps, pct_start=0.1)
    train_rng = np.random.default_rng(a.seed + 2)  # training sentences: a stream of their own
    for step in range(steps):
        enc.train()
        bi, bm, by = corpus.sample(32, train_rng)
        loss = F.cross_entropy(head(enc(torch.from_numpy(bi), torch.from_numpy(bm))), torch.from_numpy(by))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        apply_massive(enc, plan)
        if (step + 1) % 100 == 0:
            print(f"step {step + 1:4d}  loss {loss.item():.3f}  parity-split accuracy "
                  f"{_accuracy(enc, head, *splits['parity']):.4f}", flush=True)
    meta = {
        "dataset": "synthetic topic sentences (scripts/train_text_encoder.py:Corpus)",
        "config": cfg, "steps": steps, "seed": a.seed, "massive": plan,
        "splits": {k: len(v[0]) for k, v in splits.items()},
        "fp32_accuracy": {k: _accuracy(enc, head, *splits[k]) for k in ("parity", "score")},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    arrays = {k: {"input_ids": i, "attention_mask": m, **({"y": t} if k != "calib" else {})} for k, (i, m, t) in splits.items()}
    arrays["head"] = {"w": head.weight.detach().numpy(), "b": head.bias.detach().numpy()}
    save_outputs(a.out, enc.state_dict(), arrays, meta)
    print(f"wrote {a.out}: {meta['fp32_accuracy']} in {meta['seconds']} s")
    return meta


if __name__ == "__main__":
    main()
