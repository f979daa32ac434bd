"""Weight rounding by output error (GPTQ): integer weights chosen for the Linear's output, not each
weight's own nearest value.

Round-to-nearest makes every weight's error independent; GPTQ (Frantar et al., 2022) quantizes a
Linear's input channels one after the other and lets the channels not yet quantized absorb the error
already made, weighted by the inverse Hessian ``H = XᵀX`` of the Linear's own input rows, so that
``‖X·Q(W) − X·W‖`` rather than ``‖Q(W) − W‖`` is what the rounding minimises. The scales stay the
ones the converter writes (per output channel, ``max|W| / qmax``): only which integer each weight
gets changes, so the Q/DQ file, TensorRT and every runtime are unaffected.

Runs on the activation rows the calibration already samples (:class:`~vitexport.calibration.
observers.RowSampler`); ``H`` is damped by a share of its mean diagonal because a few hundred rows
do not determine it in thousands of dimensions.
"""
from __future__ import annotations

import numpy as np

__all__ = ["gptq_round"]

_BLOCK = 128


def _inverse_cholesky(h: np.ndarray) -> np.ndarray:
    """The upper Cholesky factor ``U`` of ``H⁻¹`` (``H⁻¹ = Uᵀ U``), in float64."""
    inv = np.linalg.inv(h)
    inv = (inv + inv.T) / 2.0
    return np.linalg.cholesky(inv).T


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
    xs = np.asarray(x, np.float64)
    h = xs.T @ xs / max(len(xs), 1)
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
