"""Train the bench's doc encoder (``bench/arch.py:doc_encoder``), deterministically, offline, on 1 thread.

A recipe unlike the BERT-style text encoder's: a *pre-LN* RoBERTa (Hugging Face ``RobertaPreLayerNorm``)
with ReLU feed-forward layers, [CLS] pooling and a classifier inside the exported model, a word-level
vocabulary, trained with AdamW, linear warm-up and linear decay on a real corpus that ships with Python:
the docstrings of eight standard-library packages (asyncio, email, xml, unittest, http + urllib,
logging, importlib, tkinter), read with ``ast`` from the interpreter's own source files. The class of a
passage is the package it documents. A docstring goes to one split only (train, calib, parity, score),
so held-out passages are text the model never saw. No outliers are planted: whatever structure the
trained weights have is their own.

Writes to ``--out``: ``weights.safetensors``, ``calib.npz`` (``input_ids``, ``attention_mask``),
``parity.npz`` and ``score.npz`` (also ``y``), ``meta.json`` (with the vocabulary size and sources).
"""
from __future__ import annotations

import argparse
import ast
import math
import re
import sysconfig
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from _train_common import deterministic, save_outputs

from bench.arch import DOC, build_doc_encoder

__all__ = ["PACKAGES", "docstrings", "Vocab", "passages", "main"]

#: class → standard-library packages whose docstrings are its text
PACKAGES = {"asyncio": ("asyncio",), "email": ("email",), "xml": ("xml",), "unittest": ("unittest",),
            "web": ("http", "urllib"), "logging": ("logging",), "importlib": ("importlib",), "tkinter": ("tkinter",)}
PAD, CLS, SEP, UNK = 0, 1, 2, 3
SIZES = {"calib": 192, "parity": 672, "score": 704}  # the gate draws 512 parity samples (parity.num_samples): 1 may be lost at 0.3 pt; 256 allowed none
TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
_TOKEN = re.compile(r"[a-z]+|\d+|[^\sa-z\d]")


def docstrings(packages: tuple[str, ...]) -> list[str]:
    """Every module / class / function docstring of the packages' sources (their tests excluded), in a
    fixed order."""
    std = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for pkg in packages:
        for f in sorted((std / pkg).rglob("*.py")):
            if "test" in f.relative_to(std / pkg).parts:
                continue
            try:
                tree = ast.parse(f.read_text(encoding="utf-8", errors="ignore"))
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc and len(doc.split()) >= 4:
                        out.append(doc)
    return out


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


class Vocab:
    """The most frequent training tokens; ids from 4 (0 pad, 1 [CLS], 2 [SEP], 3 unknown)."""

    def __init__(self, texts: list[list[str]], size: int):
        counts = Counter(t for toks in texts for t in toks)
        self.ids = {t: i + 4 for i, (t, _) in enumerate(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: size - 4])}

    def encode(self, toks: list[str]) -> list[int]:
        return [self.ids.get(t, UNK) for t in toks]


def passages(docs: list[list[str]], seq: int, rng: np.random.Generator) -> list[list[str]]:
    """Cut each tokenised docstring into consecutive windows of 8 to ``seq − 2`` tokens."""
    out = []
    for toks in docs:
        i = 0
        while len(toks) - i >= 6:
            n = int(rng.integers(8, seq - 1))
            out.append(toks[i : i + n])
            i += n
    return out


def _encode(items: list[tuple[list[str], int]], vocab: Vocab, seq: int) -> dict[str, np.ndarray]:
    ids = np.zeros((len(items), seq), np.int64)
    mask = np.zeros((len(items), seq), np.int64)
    for i, (toks, _) in enumerate(items):
        row = [CLS, *vocab.encode(toks)[: seq - 2], SEP]
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return {"input_ids": ids, "attention_mask": mask, "y": np.array([c for _, c in items], np.int64)}


def build_splits(seq: int, vocab_size: int, seed: int, sizes: dict[str, int]) -> tuple[dict[str, dict[str, np.ndarray]], dict]:
    """Docstrings → splits (a docstring in one split only) → passages → token ids."""
    rng = np.random.default_rng(seed)
    by_split: dict[str, list[tuple[list[str], int]]] = {k: [] for k in ("train", *sizes)}
    held_share = 0.3  # of the docstrings, shared among calib / parity / score in proportion to their sizes
    total = sum(sizes.values())
    for c, (_, pkgs) in enumerate(PACKAGES.items()):
        docs = [tokenize(d) for d in docstrings(pkgs)]
        for d in docs:
            r = rng.random()
            if r >= held_share:
                name = "train"
            else:
                acc, name = 0.0, "score"
                for k, n in sizes.items():
                    acc += held_share * n / total
                    if r < acc:
                        name = k
                        break
            by_split[name].extend((p, c) for p in passages([d], seq, rng))
    vocab = Vocab([p for p, _ in by_split["train"]], vocab_size)
    out = {}
    for k, items in by_split.items():
        order = rng.permutation(len(items))
        keep = order if k == "train" else order[: sizes[k]]
        out[k] = _encode([items[i] for i in keep], vocab, seq)
    return out, {"vocab": len(vocab.ids) + 4, "passages": {k: len(v) for k, v in by_split.items()}}


def _accuracy(model, d: dict[str, np.ndarray]) -> float:
    model.eval()
    with torch.no_grad():
        out = [model(torch.from_numpy(d["input_ids"][i : i + 128]), torch.from_numpy(d["attention_mask"][i : i + 128]))
               for i in range(0, len(d["y"]), 128)]
    return float((torch.cat(out).argmax(1).numpy() == d["y"]).mean())


def _train(model, train: dict[str, np.ndarray], steps: int, seed: int) -> None:
    batch = 32
    warm = max(1, steps // 10)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warm if s < warm else max(0.0, (steps - s) / (steps - warm)))
    g = np.random.default_rng(seed + 3)
    n = len(train["y"])
    for step in range(steps):
        model.train()
        idx = g.integers(0, n, batch)
        logits = model(torch.from_numpy(train["input_ids"][idx]), torch.from_numpy(train["attention_mask"][idx]))
        loss = F.cross_entropy(logits, torch.from_numpy(train["y"][idx]))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if (step + 1) % 100 == 0:
            print(f"step {step + 1:4d}  loss {loss.item():.3f}", flush=True)


def main(argv: list[str] | None = None) -> dict:
    """Train and write the outputs; returns ``meta``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="a tiny model, a few steps, small splits (tests)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    deterministic(a.seed)
    cfg = {**DOC, **(TINY if a.tiny else {})}
    sizes = {k: 16 for k in SIZES} if a.tiny else SIZES
    splits, info = build_splits(cfg["seq_len"], cfg["vocab_size"], a.seed, sizes)
    model = build_doc_encoder(**(TINY if a.tiny else {}))
    steps = 3 if a.tiny else a.steps
    _train(model, splits["train"], steps, a.seed)
    meta = {
        "dataset": "docstrings of Python standard-library packages (class = package: "
                   + ", ".join(f"{k}={'+'.join(v)}" for k, v in PACKAGES.items()) + "), one split per docstring",
        "config": cfg, "steps": steps, "seed": a.seed, **info,
        "splits": {k: int(len(v["y"])) for k, v in splits.items()},
        "fp32_accuracy": {k: _accuracy(model, splits[k]) for k in ("parity", "score")},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    arrays = {"calib": {k: v for k, v in splits["calib"].items() if k != "y"}, "parity": splits["parity"], "score": splits["score"]}
    save_outputs(a.out, model.state_dict(), arrays, meta)
    print(f"wrote {a.out}: {meta['fp32_accuracy']} in {meta['seconds']} s")
    return meta


if __name__ == "__main__":
    main()
