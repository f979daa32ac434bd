"""OpenVINO's CPU plugin behind the runner interface: parity with ONNX Runtime on a tiny Q/DQ model,
real INT8 kernels in its runtime model, IR written atomically."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from vitexport.runners import OnnxRuntimeRunner
from vitexport.targets.openvino.runner import OpenVinoRunner, save_ir
from vitexport.runners.host import int8_dot_saturates
from vitexport.runners.sessions import QDQ_AS_FLOAT
from vitexport.errors import BadInput

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rknn"))
from rknn_models import CONV_MACS, DIM, TOKENS, qdq_convs, qdq_linear  # noqa: E402


@pytest.fixture
def qdq_file(tmp_path) -> Path:
    """7-bit weights where this CPU lacks VNNI (as reduce_range_weights=auto writes them): there OpenVINO's
    u8 x s8 int16 pair sums saturate on 8-bit weights (cosine 0.9985 to the float Q/DQ arithmetic here)."""
    path = tmp_path / "lin.onnx"
    onnx.save(qdq_linear(cout=64, qmax=63 if int8_dot_saturates() else 127), path)
    return path


def _feeds(n: int) -> list[dict[str, np.ndarray]]:
    return [{"x": np.random.RandomState(i).randn(1, TOKENS, DIM).astype(np.float32)} for i in range(n)]


def test_openvino_matches_onnxruntime_and_runs_int8(qdq_file):
    with OpenVinoRunner(qdq_file, threads=1) as ov_run, OnnxRuntimeRunner(qdq_file, config=QDQ_AS_FLOAT) as ort_run:
        assert [s.shape for s in ov_run.input_specs()] == [(1, TOKENS, DIM)]
        for feed in _feeds(3):
            a, b = ov_run.infer(feed)["output"], ort_run.infer(feed)["output"]
            assert a.shape == b.shape == (1, TOKENS, 64)
            cos = float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))
            assert cos > 0.999
        prec = ov_run.precisions()
    assert prec.macs["FullyConnected"] == {"i8": TOKENS * DIM * 64}  # int8 activations (zero point int8)
    assert prec.int8_share == 1.0


@pytest.mark.skipif(not int8_dot_saturates(), reason="this CPU has VNNI or AMX: its int8 sums do not saturate")
def test_on_a_cpu_without_vnni_8_bit_weights_saturate_and_7_bit_ones_do_not(tmp_path):
    """Why reduce_range_weights=auto: OpenVINO's u8 x s8 int16 pair sums clip on 8-bit weights here."""
    cos = {}
    for qmax in (127, 63):
        onnx.save(qdq_linear(cout=64, qmax=qmax), tmp_path / f"w{qmax}.onnx")
        with OpenVinoRunner(tmp_path / f"w{qmax}.onnx", threads=1) as ov_run, \
                OnnxRuntimeRunner(tmp_path / f"w{qmax}.onnx", config=QDQ_AS_FLOAT) as ort_run:
            pairs = [(ov_run.infer(f)["output"], ort_run.infer(f)["output"]) for f in _feeds(3)]
        cos[qmax] = min(float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in pairs)
    assert cos[63] > 0.9999 > cos[127], cos


def test_grouped_and_depthwise_convs_count_what_they_compute(tmp_path):
    """The runtime model keeps a grouped conv's weight 5-D [G, Cout/G, Cin/G, kh, kw]: read as
    [Cout, Cin, ...] it would count the 4-group conv 4-fold; every conv counts its MACs by hand."""
    path = tmp_path / "convs.onnx"
    onnx.save(qdq_convs(), path)
    with OpenVinoRunner(path, threads=1) as run:
        prec = run.precisions()
    # one integer type: i8 where VNNI takes int8 activations, u8 where AVX2's vpmaddubsw needs them unsigned
    (kind, macs), = prec.macs["Convolution"].items()
    assert set(prec.macs) == {"Convolution"} and kind in ("i8", "u8") and macs == sum(v[-1] for v in CONV_MACS.values())


def test_float_model_runs_float(tmp_path):
    m = qdq_linear()
    # strip the Q/DQ on the activation: x feeds the MatMul directly, weights stay DQ'd constants
    for n in m.graph.node:
        if n.op_type == "MatMul":
            n.input[0] = "x"
    path = tmp_path / "float.onnx"
    onnx.save(m, path)
    with OpenVinoRunner(path) as run:
        run.infer(_feeds(1)[0])
        assert run.precisions().int8_share == 0.0


def test_save_ir_writes_both_files_and_nothing_else(qdq_file, tmp_path):
    out = tmp_path / "ir"
    xml, bin_ = save_ir(qdq_file, out / "model.xml")
    assert xml.stat().st_size > 0 and bin_.stat().st_size > 0
    assert sorted(p.name for p in out.iterdir()) == ["model.bin", "model.xml"]
    feed = _feeds(1)[0]
    with OpenVinoRunner(xml) as a, OpenVinoRunner(qdq_file) as b:
        np.testing.assert_allclose(a.infer(feed)["output"], b.infer(feed)["output"], rtol=0, atol=1e-6)


def test_bad_files_are_bad_input(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    with pytest.raises(BadInput, match="OpenVINO cannot read"):
        save_ir(bad, tmp_path / "o" / "model.xml")
    assert not (tmp_path / "o" / "model.xml").exists()
    with pytest.raises(BadInput, match="no such model file"):
        OpenVinoRunner(tmp_path / "missing.onnx").activate()
