"""Weight rounding by output error (GPTQ): integer weights chosen for the Linear's output, not each
weight's own nearest value.

Round-to-nearest makes every weight's error independent; GPTQ (Frantar et al., 2022) quantizes a
Linear's input channels one after the other and lets the channels not yet quantized absorb the error
already made, weighted by the inverse Hessian ``H = XᵀX`` of the Linear's own input rows, so that
``‖X·Q(W) − X·W‖`` rather than ``‖Q(W) − W‖`` is what the rounding minimises. The scales stay the
ones the converter writes (per output channel, ``max|W| / qmax``): only which integer each weight
gets changes, so the Q/DQ file, TensorRT and every runtime are unaffected.

Runs on the activation rows the calibration already samples (:class:`~vitexport.calibration.
observers.RowSampler`, ``quantization.gptq_rows`` of them); ``H`` is damped by a share of its mean
diagonal (``quantization.gptq_damp``): the damping keeps the rounding from trading error on directions
the rows rarely take (a trained MiniLM's held-out worst cosine 0.951 at the paper's 0.01, 0.995 at 0.1).

:func:`gptq_cost` is the arithmetic GPTQ adds, which ``weight_rounding: auto`` weighs against
:data:`GPTQ_BUDGET_MACS`.
"""
from __future__ import annotations

import numpy as np
from scipy.linalg import solve_triangular

__all__ = ["GPTQ_BUDGET_MACS", "GPTQ_ROWS_PER_INPUT", "gptq_cost", "gptq_round"]

_BLOCK = 128
#: ``weight_rounding: auto`` rounds with GPTQ while :func:`gptq_cost` stays within this: a MiniLM-L6 (92 G) and a
#: ViT-S-scale encoder are in, a BERT-base / ViT-B/16 (915 G) is not, whose quantize stage must stay beside NNCF's
#: time (issue 30: 211 s vs 213 s at 256 samples before GPTQ)
GPTQ_BUDGET_MACS = 250e9
#: ``weight_rounding: auto`` rounds a Linear with GPTQ only when its rows are at least this many times its input
#: width, else to nearest: fewer rows over-fit the Hessian (MiniLM-L6, widest input 1536, held-out worst cosine:
#: 4096 rows 0.9954, 2048 rows 0.9931, 512 rows 0.9840; rounding to nearest 0.9938)
GPTQ_ROWS_PER_INPUT = 2.5


def gptq_cost(widths: list[int], rows: int) -> float:
    """Multiply-accumulates GPTQ spends on Linears of these input widths: each Linear's Hessian from
    ``rows`` rows (``rows·C²``), its factorisation and triangular inverse (``C³`` together)."""
    return float(sum(rows * c * c + c ** 3 for c in widths))


def _inverse_cholesky(h: np.ndarray) -> np.ndarray:
    """The upper Cholesky factor ``U`` of ``H⁻¹`` (``H⁻¹ = Uᵀ U``), in float64.

    With ``J`` the order reversal and ``J H J = L Lᵀ``, ``H⁻¹ = (J L⁻ᵀ J)(J L⁻¹ J)`` and ``J L⁻¹ J`` is upper
    triangular: one Cholesky factorisation and one triangular inverse, no general inverse.
    """
    lower = np.linalg.cholesky(h[::-1, ::-1])
    inv_lower = solve_triangular(lower, np.eye(len(h)), lower=True)  # L⁻¹
    return np.ascontiguousarray(inv_lower[::-1, ::-1])


def gptq_round(x: np.ndarray, w_io: np.ndarray, scale: np.ndarray, qmax: int = 127, damp: float = 0.01) -> np.ndarray:
    """GPTQ integer weights of one Linear.

    Args:
        x: its input rows (N, C_in), as the quantized model feeds it (after smoothing).
        w_io: its weight as a (C_in, C_out) matrix (``x @ w_io`` is its output).
        scale: the per-output-channel scale (C_out,) the converter writes.
        qmax: the largest integer magnitude.
        damp: the share of the mean Hessian diagonal added to it.
    Returns:
        int8 weights (C_in, C_out): ``q · scale`` replaces ``w_io``.
    """
    w = np.asarray(w_io, np.float64).T.copy()  # (C_out, C_in): GPTQ's layout, a column per input channel
    xs = np.asarray(x, np.float32)
    h = (xs.T @ xs).astype(np.float64) / max(len(xs), 1)  # the product in float32 (BLAS), the factorisation in float64
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h += damp * float(np.mean(np.diag(h))) * np.eye(len(h))
    order = np.argsort(-np.diag(h), kind="stable")  # act-order: the best-determined channels first
    w, h = w[:, order], h[np.ix_(order, order)]
    u = _inverse_cholesky(h)
    s = np.maximum(np.asarray(scale, np.float64), 1e-30)[:, None]
    q = np.zeros_like(w)
    for i1 in range(0, w.shape[1], _BLOCK):
        i2 = min(i1 + _BLOCK, w.shape[1])
        w1, err = w[:, i1:i2].copy(), np.zeros((w.shape[0], i2 - i1))
        u1 = u[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = w1[:, i]
            qi = np.clip(np.round(col / s[:, 0]), -qmax, qmax)
            q[:, i1 + i] = qi
            e = (col - qi * s[:, 0]) / u1[i, i]
            w1[:, i:] -= np.outer(e, u1[i, i:])
            err[:, i] = e
        w[:, i2:] -= err @ u[i1:i2, i2:]
    out = np.empty_like(q)
    out[:, order] = q
    return out.T.astype(np.int8)
