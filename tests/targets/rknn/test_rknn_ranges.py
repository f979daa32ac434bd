"""The ranges of the Q/DQ pairs RKNN's layout adds: a tensor an activation flattens keeps its levels for the side
the activation passes (checked in ONNX Runtime on held-out feeds; RKNN itself is not needed)."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from rknn_models import qdq_hybrid_block, qdq_linear
from vitexport.runners.sessions import Session, SessionConfig
from vitexport.targets.rknn.qdq import _qparams
from vitexport.targets.rknn.ranges import activation_output, flattened_low, measure_layout_ranges
from vitexport.targets.rknn.routes import qdq_layout

UINT8 = np.dtype(np.uint8)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _qdq(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    s, z = (float(a) for a in _qparams(lo, hi, UINT8))
    return (np.clip(np.round(x / s) + z, 0, 255) - z) * s


def _values(model: ir.Model) -> dict[str, ir.Value]:
    return {o.name: o for n in model.graph for o in n.outputs}


def _feeds(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rs = np.random.RandomState(seed)
    return [{"x": (rs.randn(1, 16, 16, 16) * 1.5).astype(np.float32)} for _ in range(n)]


@pytest.mark.parametrize("act,out", [("silu", "a1_a"), ("hardswish", "a1_a")])
def test_activation_output_follows_the_activation_to_its_output(act, out):
    model = ir.serde.deserialize_model(qdq_hybrid_block(act=act))
    got = activation_output(_values(model)["conv3x3_c"])
    assert got is not None and got.name == out


def test_no_activation_output_where_the_tensor_has_another_reader_or_none_at_all():
    model = ir.serde.deserialize_model(qdq_hybrid_block(act="silu"))
    values = _values(model)
    assert activation_output(values["pointwise_c"]) is None  # read by the residual Add, whose other input is x
    relu = ir.serde.deserialize_model(qdq_linear())
    assert activation_output(_values(relu)["lin"]) is None  # its Relu's output is the graph's: not quantized here
    assert activation_output(_values(relu)["y"]) is None  # nothing reads a graph output in the graph


def test_flattened_low_cuts_what_a_silu_flattens_and_nothing_of_a_linear_function():
    rs = np.random.RandomState(1)
    x = np.concatenate([rs.randn(20000) * 2.0, -rs.uniform(6, 14, 200)]).astype(np.float32)
    lo, hi = float(x.min()), float(x.max())
    cut = flattened_low(x, _silu(x), lo, hi, UINT8)
    assert lo < cut < -1.0  # the low end moves towards zero, but not past SiLU's minimum at -1.28
    fresh = (np.random.RandomState(2).randn(20000) * 2.0).astype(np.float32)
    err = [float(np.mean((_silu(_qdq(fresh, a, hi)) - _silu(fresh)) ** 2)) for a in (lo, cut)]
    assert err[1] < 0.7 * err[0]
    assert flattened_low(x, x * 0.5, lo, hi, UINT8) == lo  # a linear function: every level counts
    assert flattened_low(np.abs(x), _silu(np.abs(x)), 0.0, hi, UINT8) == 0.0  # nothing below zero to cut
    # symmetric int8 (zero point 0): the scale follows the larger side, so a cut pays only while -lo > hi
    sym = flattened_low(x, _silu(x), lo, hi, np.dtype(np.int8))
    assert 0.8 * hi <= -sym <= 1.05 * hi  # near -hi: cutting further clips without a finer scale


def test_layout_cuts_the_low_end_of_a_conv_output_its_silu_flattens():
    model = ir.serde.deserialize_model(qdq_hybrid_block(act="silu"))
    measured = measure_layout_ranges(model, _feeds(8), ["conv3x3_c", "pointwise_c"], UINT8)
    assert "conv3x3_c" in measured.cut and "pointwise_c" not in measured.cut
    lo, cut = measured.cut["conv3x3_c"]
    assert measured.ranges["conv3x3_c"][0] == cut > lo
    assert measured.ranges["pointwise_c"][0] == pytest.approx(float(measured.per_channel["pointwise_c"][0].min()))
    # on feeds the calibration never saw, the SiLU's output is closer to float with the cut than with min/max
    sess = Session(model, SessionConfig(), outputs=["conv3x3_c", "y"])
    x = np.concatenate([sess.run(["conv3x3_c"], f)[0].ravel() for f in _feeds(4, seed=9)])
    hi = measured.ranges["conv3x3_c"][1]
    err = [float(np.mean((_silu(_qdq(x, a, hi)) - _silu(x)) ** 2)) for a in (lo, cut)]
    assert err[1] < err[0]
    report = qdq_layout(ir.serde.deserialize_model(qdq_hybrid_block(act="silu")), _feeds(8))
    assert report["rknn_activation_low_ends"] >= 1 and report["rknn_conv_outputs_qdq"] >= 2
