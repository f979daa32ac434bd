"""Score any ONNX model against a case's held-out reference: ``python -m bench.score CASE MODEL.onnx``.

The held-out split (``bench/work/<case>/score.npz``) is what no tool saw; the reference is the
untouched torch model's FP32 output on it (``reference.npz``, written by the bench's prepare step,
so run ``python -m bench.run --models CASE`` once first). By default Q/DQ nodes run as float ops
(ONNX Runtime's ``session.disable_quant_qdq``): the arithmetic TensorRT performs with explicit
quantization (fake-quantized values, float accumulation), not ONNX Runtime's integer kernels.

Figures: per-sample cosine of the output vectors (mean, min), top-1 agreement and accuracy for
classifiers; for the text encoder accuracy goes through its trained topic head. A dense case
(``detection`` / ``segmentation``, :mod:`bench.dense_case`) is scored by its task on every output by name:
mAP / mIoU against FP32 and against the scenes' labels.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from .dense_case import DENSE_KINDS, score_dense
from .splits import inputs_only

__all__ = ["score_onnx", "cosines", "main"]

BENCH = Path(__file__).resolve().parent


def cosines(ref: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Per-sample cosine similarity of two (N, ...) arrays, in float64."""
    r = ref.astype(np.float64).reshape(len(ref), -1)
    o = out.astype(np.float64).reshape(len(out), -1)
    return (r * o).sum(1) / (np.linalg.norm(r, axis=1) * np.linalg.norm(o, axis=1) + 1e-30)


def score_onnx(onnx_path: str | Path, score_npz: str | Path, reference_npz: str | Path, *,
               qdq_as_float: bool = True, threads: int = 2, kind: str = "classifier") -> dict:
    """Run ``onnx_path`` on every held-out sample (batch 1) and compare with the reference.

    Args:
        onnx_path: the model (any tool's INT8, or an FP32 one).
        score_npz: held-out inputs by ONNX input name (``y``: labels, not fed).
        reference_npz: ``out`` (or legacy ``logits``): the torch FP32 outputs; optional ``y``,
            ``head_w`` / ``head_b`` (an embedding model's classifier, for accuracy).
        qdq_as_float: ``session.disable_quant_qdq=1`` (TensorRT's arithmetic); False: ORT's int8 kernels.
        threads: ONNX Runtime intra-op threads.
        kind: ``classifier`` (top-1 agreement of the outputs), ``embedding``, or a dense task
            (``detection`` / ``segmentation``: :func:`bench.dense_case.score_dense` on the outputs by name).
    Returns:
        ``cosine_mean``, ``cosine_min``, ``n``, ``qdq_as_float``; ``top1_agreement`` when the outputs
        are logits (directly or through a head); ``accuracy`` / ``fp32_accuracy`` with labels.
    Raises:
        ValueError: an ONNX input the data does not have.
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    if qdq_as_float:
        opts.add_session_config_entry("session.disable_quant_qdq", "1")
    sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    with np.load(score_npz) as z:
        data = inputs_only(z)
    with np.load(reference_npz) as z:
        ref = {k: z[k] for k in z.files}
    names = [i.name for i in sess.get_inputs()]
    missing = [n for n in names if n not in data]
    if missing:
        raise ValueError(f"{score_npz}: no array for ONNX input(s) {missing} (has {sorted(data)})")
    n = len(data[names[0]])
    if kind in DENSE_KINDS:
        return _score_dense(onnx_path, sess, data, names, ref, kind, qdq_as_float)
    out = np.concatenate([sess.run(None, {k: data[k][i : i + 1] for k in names})[0] for i in range(n)])
    r = ref.get("out", ref.get("logits"))
    o = out.reshape(r.shape)
    cos = cosines(r, o)
    res = {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()), "n": int(n), "qdq_as_float": qdq_as_float}
    if "head_w" in ref:  # an embedding: its trained head makes logits of it
        r = r @ ref["head_w"].T + ref["head_b"]
        o = o @ ref["head_w"].T + ref["head_b"]
    elif kind != "classifier":
        return res
    res["top1_agreement"] = float((r.argmax(1) == o.argmax(1)).mean())
    if "y" in ref:
        res["accuracy"] = float((o.argmax(1) == ref["y"]).mean())
        res["fp32_accuracy"] = float((r.argmax(1) == ref["y"]).mean())
    return res


def _score_dense(onnx_path, sess, data: dict, names: list[str], ref: dict, kind: str, qdq_as_float: bool) -> dict:
    """Every output by name, batch 1; cosine of the task's first output, then the task figures."""
    outputs = [o.name for o in sess.get_outputs()]
    wanted = DENSE_KINDS[kind]
    # vitexport names a model's only output 'output' (a segmenter's logits): the task's only output then
    fetch = outputs if len(outputs) == 1 == len(wanted) else list(wanted)
    missing = [w for w in fetch if w not in outputs]
    if missing:
        raise ValueError(f"{onnx_path}: no output(s) {missing} (has {outputs}): a dense case scores them by name")
    rows = [sess.run(fetch, {k: data[k][i : i + 1] for k in names}) for i in range(len(data[names[0]]))]
    outs = {w: np.concatenate([r[j] for r in rows]) for j, w in enumerate(wanted)}
    cos = cosines(ref[wanted[0]], outs[wanted[0]])
    return {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()), "n": len(rows), "qdq_as_float": qdq_as_float,
            **score_dense(kind, outs, ref)}


def main(argv: list[str] | None = None) -> int:
    """Command line: see ``--help``."""
    ap = argparse.ArgumentParser(prog="python -m bench.score", description=__doc__.splitlines()[0])
    ap.add_argument("case", help="a case key (bench.cases.CASES) whose bench/work/<case> is prepared")
    ap.add_argument("onnx", help="the ONNX model to score")
    ap.add_argument("--work", default=str(BENCH / "work"))
    ap.add_argument("--int8-kernels", action="store_true", help="run ONNX Runtime's int8 kernels instead of Q/DQ as float")
    a = ap.parse_args(argv)
    from bench.cases import CASES

    if a.case not in CASES:
        ap.error(f"unknown case {a.case!r}; known: {', '.join(CASES)}")
    d = Path(a.work) / a.case
    if not (d / "reference.npz").is_file():
        ap.error(f"{d}/reference.npz missing: run `python -m bench.run --models {a.case}` first")
    res = score_onnx(a.onnx, d / "score.npz", d / "reference.npz", qdq_as_float=not a.int8_kernels, kind=CASES[a.case].kind)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
