"""Weight rounding by output error (GPTQ): integer weights chosen for the Linear's output, not each
weight's own nearest value.

Round-to-nearest makes every weight's error independent; GPTQ (Frantar et al., 2022) quantizes a
Linear's input channels one after the other and lets the channels not yet quantized absorb the error
already made, weighted by the inverse Hessian ``H = XᵀX`` of the Linear's own input rows, so that
``‖X·Q(W) − X·W‖`` rather than ``‖Q(W) − W‖`` is what the rounding minimises. The scales stay the
ones the converter writes (per output channel, ``max|W| / qmax``): only which integer each weight
gets changes, so the Q/DQ file, TensorRT and every runtime are unaffected.

Runs on ``XᵀX`` of ``quantization.gptq_rows`` activation rows spread over those the statistics pass
sees (:class:`~vitexport.calibration.observers.GramObserver`); ``H`` is damped by a share of its mean
diagonal (``quantization.gptq_damp``): the damping keeps the rounding from trading error on directions
the rows rarely take (a trained MiniLM's held-out worst cosine 0.951 at the paper's 0.01, 0.995 at 0.1).

:func:`gptq_cost` is the arithmetic GPTQ adds, which ``weight_rounding: auto`` weighs against
:data:`GPTQ_BUDGET_MACS`.
"""
from __future__ import annotations

import numpy as np
from scipy.linalg import lapack
from threadpoolctl import threadpool_limits

__all__ = ["GPTQ_BUDGET_MACS", "GPTQ_ROWS_PER_INPUT", "gptq_cost", "gptq_round"]

#: GPTQ's lazy batches (Frantar et al.): the error of a block's rows reaches the rows beyond it in one product;
#: within a block the same again by sub-blocks, so the row-by-row updates touch at most ``_SUB`` rows
_BLOCK, _SUB = 128, 16
#: ``weight_rounding: auto`` rounds with GPTQ while :func:`gptq_cost` of the Linears it would round stays within
#: this: a MiniLM-L6 (92 G) and a ViT-S-scale encoder are in, and a BERT-base / ViT-B/16's 768-wide Linears (103 G);
#: their 3072-wide FFN outputs with it (915 G) would not be, whose quantize stage must stay beside NNCF's time
GPTQ_BUDGET_MACS = 250e9
#: ``weight_rounding: auto`` rounds a Linear with GPTQ only when its rows are at least this many times its input
#: width, else to nearest: fewer rows over-fit the Hessian (MiniLM-L6, widest input 1536, held-out worst cosine:
#: 4096 rows 0.9954, 2048 rows 0.9931, 512 rows 0.9840; rounding to nearest 0.9938)
GPTQ_ROWS_PER_INPUT = 2.5


def gptq_cost(linears: list[tuple[int, int]]) -> float:
    """Multiply-accumulates GPTQ spends on Linears given as (input width C, rows): each Linear's Hessian from
    its rows (``rows·C²``), its factorisation and triangular inverse (``C³`` together)."""
    return float(sum(rows * c * c + c ** 3 for c, rows in linears))


def _inverse_cholesky(h: np.ndarray) -> np.ndarray:
    """The upper Cholesky factor ``U`` of ``H⁻¹`` (``H⁻¹ = Uᵀ U``), in float64.

    With ``J`` the order reversal and ``J H J = L Lᵀ``, ``H⁻¹ = (J L⁻ᵀ J)(J L⁻¹ J)`` and ``J L⁻¹ J`` is upper
    triangular: one Cholesky factorisation and one triangular inverse, no general inverse.
    """
    lower = np.linalg.cholesky(h[::-1, ::-1])
    inv_lower, info = lapack.dtrtri(lower, lower=1)  # L⁻¹ (a quarter of the time of solving L X = I)
    if info:
        raise np.linalg.LinAlgError(f"dtrtri: the Cholesky factor is singular at {info}")
    return np.ascontiguousarray(inv_lower[::-1, ::-1])


def gptq_round(h: np.ndarray, w_io: np.ndarray, scale: np.ndarray, qmax: int = 127, damp: float = 0.01) -> np.ndarray:
    """GPTQ integer weights of one Linear.

    The factorisation is in float64, the rounding in float32 (as GPTQ's reference implementation), with one
    BLAS thread: its products are small and many, and two threads waiting on each other made ViT-B/16's 36
    Linears 2.5× slower (5.7 s vs 2.3 s on 2 cores).

    Args:
        h: the mean ``XᵀX / N`` (C_in, C_in) of its input rows as the quantized model feeds it (after
            smoothing; :class:`~vitexport.calibration.observers.GramObserver`).
        w_io: its weight as a (C_in, C_out) matrix (``x @ w_io`` is its output).
        scale: the per-output-channel scale (C_out,) the converter writes.
        qmax: the largest integer magnitude.
        damp: the share of the mean Hessian diagonal added to it.
    Returns:
        int8 weights (C_in, C_out): ``q · scale`` replaces ``w_io``.
    """
    h = np.array(h, np.float64)
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0
    h += damp * float(np.mean(np.diag(h))) * np.eye(len(h))
    order = np.argsort(-np.diag(h), kind="stable")  # act-order: the best-determined channels first
    w = np.array(w_io, np.float32)  # (C_in, C_out): a row per input channel, quantized one after the other
    w[dead] = 0.0
    w = w[order]
    with threadpool_limits(1, user_api="blas"):
        u = _inverse_cholesky(h[np.ix_(order, order)]).astype(np.float32)
        s = np.maximum(np.asarray(scale, np.float32), 1e-30)
        q, err = np.zeros_like(w), np.empty_like(w)
        for i1 in range(0, len(w), _BLOCK):
            i2 = min(i1 + _BLOCK, len(w))
            for j1 in range(i1, i2, _SUB):  # the error spread row by row within a sub-block, by products beyond it
                j2 = min(j1 + _SUB, i2)
                for i in range(j1, j2):
                    q[i] = np.clip(np.round(w[i] / s), -qmax, qmax)
                    err[i] = (w[i] - q[i] * s) / u[i, i]
                    w[i + 1:j2] -= np.outer(u[i, i + 1:j2], err[i])
                w[j2:i2] -= u[j1:j2, j2:i2].T @ err[j1:j2]
            w[i2:] -= u[i1:i2, i2:].T @ err[i1:i2]
    out = np.empty_like(q)
    out[order] = q
    return out.astype(np.int8)
