"""rknn-toolkit2 for real, through its worker: compile, simulate on RKNN's x86 simulator, read the op
table; a segfaulting compile becomes one BadInput line naming the node and the rule; a missing venv
names `make setup-rknn`. Skipped (with the reason) only where the venv cannot be made."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from rknn_models import (
    CONV_MACS, DIM, HEADS, TOKENS, masked_attention, qdq_attention, qdq_convs, qdq_hybrid_block, qdq_linear, qdq_patch_conv, qdq_strided_conv,
    qdq_unhalved_gelu,
)
from vitexport.errors import BadInput
from vitexport.graph.files import save_model
from vitexport.targets.rknn.client import RKNN_VENV_ENV, RknnRequest, rknn_missing, run_rknn
from vitexport.targets.rknn.graph import FullShapeMasks, activation_zp_dtype, output_ranges
from vitexport.targets.rknn.qdq import LinearsAsConv, OutputQdq, PatchConvsInInt8, linear_sites
from vitexport.targets.rknn.routes import qdq_layout

# each test starts rknn-toolkit2 (~5 s) and compiles (~2-5 s): about a minute in all, so `make test`,
# not the fast lane
PLATFORM = "rk3588"
#: RKNN drops the Reshape it would run on the CPU at the output; the client reads the ONNX shape back
CONFIG = {"remove_reshape": True}


@pytest.fixture(scope="module")
def rknn():
    """Skips (saying why) only where the venv is missing or broken; checked once, when first needed."""
    missing = rknn_missing()
    if missing:
        pytest.skip(missing)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _ort(path, feeds) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, f)[0] for f in feeds])


@pytest.mark.slow
def test_masked_attention_compiles_and_simulates_after_full_shape_masks(rknn, tmp_path):
    model = ir.serde.deserialize_model(masked_attention())
    FullShapeMasks()(model)
    path = tmp_path / "attn.onnx"
    save_model(model, path)
    feeds = [{"x": np.random.RandomState(i).randn(1, 1, TOKENS, DIM).astype(np.float32)} for i in range(3)]
    res = run_rknn(RknnRequest(onnx=path, platform=PLATFORM, rknn=tmp_path / "attn.rknn", inputs=feeds), tmp_path / "work")
    assert (tmp_path / "attn.rknn").stat().st_size > 0
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = np.concatenate([sess.run(None, f)[0] for f in feeds])
    assert _cos(res.outputs[0].reshape(ref.shape), ref) > 0.999  # FP16 on the simulator
    assert res.summary.on_cpu == [] and res.summary.ops == res.summary.on_npu
    assert res.summary.gemm_macs == TOKENS * DIM * DIM + 2 * TOKENS * TOKENS * DIM  # Linear, Q·Kᵀ, attn·V
    assert res.summary.int8_share == 0.0 and set(res.summary.by_dtype) == {"FLOAT16"}
    assert res.compile_s > 0 and res.seconds_per_sample > 0
    assert "RKNN" in res.log.read_text()  # the toolchain's output went to the log, not the terminal


@pytest.mark.slow
def test_a_segfaulting_compile_is_one_bad_input_line(rknn, tmp_path):
    path = tmp_path / "broadcast_mask.onnx"
    onnx.save(masked_attention(), path)
    with pytest.raises(BadInput) as err:
        run_rknn(RknnRequest(onnx=path, platform=PLATFORM, inputs=[]), tmp_path / "work", timeout_s=300)
    msg = str(err.value)
    assert "crashed (SIGSEGV) in stage build" in msg and "RKNNSubgraphManager" in msg
    assert "node mask_where: Where condition [1, 1, 1, 8]" in msg and "[rknn.where_broadcast]" in msg  # node, rule
    assert "\n" not in msg


@pytest.mark.slow
def test_a_16x16_patch_conv_runs_int8_split_into_two_4x4_convs(rknn, tmp_path):
    model = ir.serde.deserialize_model(qdq_patch_conv(size=32, patch=16))
    feeds = [{"x": np.random.RandomState(i).randn(1, 3, 32, 32).astype(np.float32)} for i in range(3)]
    as_is = tmp_path / "patch.onnx"
    save_model(model, as_is)
    with pytest.raises(BadInput, match=r"refused the model in stage build.*\[rknn\.patch_conv\].*KeyError: 'x_dq_conv'"):
        run_rknn(RknnRequest(onnx=as_is, platform=PLATFORM), tmp_path / "as_is")  # the 16x16 stride-16 Q/DQ conv
    PatchConvsInInt8(output_ranges(model, feeds, ["c"]))(model)
    path = tmp_path / "patch_split.onnx"
    save_model(model, path)
    res = run_rknn(RknnRequest(onnx=path, platform=PLATFORM, config=CONFIG, inputs=feeds), tmp_path / "work")
    assert res.summary.int8_share == 1.0 and res.summary.on_cpu == []  # from RKNN's own op table
    assert sorted(r.op_type for r in res.ops if r.is_gemm) == ["Conv", "ConvRelu"]  # one-hot 4x4, then 4x4 + Relu
    ref = _ort(path, feeds)
    assert res.outputs[0].shape == ref.shape and _cos(res.outputs[0], ref) > 0.999


@pytest.mark.slow
def test_depthwise_and_grouped_convs_count_the_models_macs(rknn, tmp_path):
    """RKNN lists the depthwise weight as (1, C, k, k) and computes the grouped conv as a dense one: the
    op table's MACs are still each conv's own, counted by hand."""
    path = tmp_path / "convs.onnx"
    onnx.save(qdq_convs(), path)
    feeds = [{"x": np.random.RandomState(i).randn(1, 3, 16, 16).astype(np.float32)} for i in range(2)]
    res = run_rknn(RknnRequest(onnx=path, platform=PLATFORM, config=CONFIG, inputs=feeds), tmp_path / "work")
    assert {r.source: r.macs for r in res.ops if r.is_gemm} == {name: v[-1] for name, v in CONV_MACS.items()}
    assert res.summary.gemm_macs == sum(v[-1] for v in CONV_MACS.values())


@pytest.mark.slow
def test_linears_as_conv_run_int8_on_the_npu(rknn, tmp_path):
    model = ir.serde.deserialize_model(qdq_linear())
    feeds = [{"x": np.random.RandomState(i).randn(1, TOKENS, DIM).astype(np.float32)} for i in range(4)]
    site = linear_sites(model)[0]
    LinearsAsConv(output_ranges(model, feeds, [site.output.name]))(model)
    path = tmp_path / "lin.onnx"
    save_model(model, path)
    res = run_rknn(RknnRequest(onnx=path, platform=PLATFORM, config=CONFIG, inputs=feeds), tmp_path / "work")
    assert res.summary.int8_share == 1.0, res.summary.to_dict()  # from RKNN's own op table
    assert res.summary.on_cpu == []  # remove_reshape: no Reshape left for the CPU at the output
    ref = _ort(path, feeds)
    assert res.outputs[0].shape == ref.shape and _cos(res.outputs[0], ref) > 0.999


@pytest.mark.slow
def test_attention_scores_run_int8_once_quantized_before_their_scale(rknn, tmp_path):
    """As vitexport writes it, Q·Kᵀ runs in float16 (its output is not Q/DQ'd); in RKNN's layout
    (the scale moved after it, the scores Q/DQ'd) both attention MatMuls run INT8."""
    shape = (1, HEADS, TOKENS, DIM)
    feeds = [{k: np.random.RandomState(3 * i + j).randn(*shape).astype(np.float32) for j, k in enumerate("qkv")}
             for i in range(3)]
    before, after = tmp_path / "attn.onnx", tmp_path / "attn_rknn.onnx"
    model = ir.serde.deserialize_model(qdq_attention())
    save_model(model, before)
    qdq_layout(model, feeds)
    save_model(model, after)
    plain = run_rknn(RknnRequest(onnx=before, platform=PLATFORM, config=CONFIG), tmp_path / "plain")
    assert plain.summary.by_dtype.get("FLOAT16", 0) > 0  # Q·Kᵀ in float16
    res = run_rknn(RknnRequest(onnx=after, platform=PLATFORM, config=CONFIG, inputs=feeds), tmp_path / "work")
    assert res.summary.int8_share == 1.0 and res.summary.on_cpu == [], res.summary.to_dict()
    assert _cos(res.outputs[0], _ort(after, feeds)) > 0.99


def test_a_missing_toolchain_names_the_make_target(tmp_path, monkeypatch):
    monkeypatch.setenv(RKNN_VENV_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(BadInput, match=r"make setup-rknn"):
        run_rknn(RknnRequest(onnx=tmp_path / "m.onnx", platform=PLATFORM), tmp_path / "work")


@pytest.mark.slow
def test_batched_probabilities_stay_on_the_npu_once_out_of_qdq(rknn, tmp_path, monkeypatch):
    """Two windows of 16 tokens (Swin's layout): RKNN converts Q/DQ'd probabilities to int8 on the CPU;
    in the layout (its BatchedProbsInFloat) attn·V reads them in float16 and every op runs on the NPU."""
    import rknn_models

    monkeypatch.setattr(rknn_models, "TOKENS", 16)
    shape = (2, HEADS, 16, DIM)
    feeds = [{k: np.random.RandomState(3 * i + j).randn(*shape).astype(np.float32) for j, k in enumerate("qkv")}
             for i in range(3)]
    model = ir.serde.deserialize_model(rknn_models.qdq_attention(batch=2))
    assert qdq_layout(model, feeds)["rknn_batched_probs_in_float"] == 1
    after, before = tmp_path / "layout.onnx", tmp_path / "int8_probs.onnx"
    save_model(model, after)
    OutputQdq({"p": (0.0, 1.0)}, activation_zp_dtype(model))(model)  # the same layout, the probabilities Q/DQ'd again
    save_model(model, before)
    plain = run_rknn(RknnRequest(onnx=before, platform=PLATFORM, config=CONFIG), tmp_path / "before")
    assert len(plain.summary.on_cpu) == 1 and "exDataConvert" in plain.summary.on_cpu[0]  # RKNN's op table
    res = run_rknn(RknnRequest(onnx=after, platform=PLATFORM, config=CONFIG, inputs=feeds), tmp_path / "after")
    assert res.summary.on_cpu == [] and res.summary.on_npu == res.summary.ops, res.summary.to_dict()
    assert res.summary.float_gemms == ["exMatMul:pv#1"]  # attn·V in float16, Q·Kᵀ still INT8
    assert _cos(res.outputs[0], _ort(after, feeds)) > 0.99


@pytest.mark.slow
@pytest.mark.parametrize("act, fused", [("relu", "ConvRelu"), ("silu", "ConvExSwish")])
def test_a_hybrids_convs_and_pool_run_int8_on_the_npu_after_the_layout(rknn, tmp_path, act, fused):
    """As vitexport's quantizer writes the block, RKNN runs the pointwise conv (no output Q/DQ) in
    float16, the SiLU convs fused in float16 and the padded AveragePool on the CPU; in the layout every
    conv runs INT8 (a SiLU with Q/DQ on both sides fuses as ConvExSwish INT8) and no op is on the CPU."""
    feeds = [{"x": np.random.RandomState(i).randn(1, 16, 16, 16).astype(np.float32)} for i in range(3)]
    before, after = tmp_path / "block.onnx", tmp_path / "block_rknn.onnx"
    model = ir.serde.deserialize_model(qdq_hybrid_block(act=act))
    save_model(model, before)
    qdq_layout(model, feeds)
    save_model(model, after)
    convs = ("conv3x3", "depthwise", "pointwise")
    plain = run_rknn(RknnRequest(onnx=before, platform=PLATFORM, config=CONFIG), tmp_path / "plain")
    assert plain.summary.on_cpu == ["AveragePool:AveragePool:pool"]
    assert {r.source: r.dtype for r in plain.ops if r.source in convs}["pointwise"] == "FLOAT16"
    res = run_rknn(RknnRequest(onnx=after, platform=PLATFORM, config=CONFIG, inputs=feeds), tmp_path / "work")
    assert res.summary.on_cpu == [], res.summary.to_dict()  # from RKNN's own op table
    assert {r.source: (r.op_type, r.dtype) for r in res.ops if r.source in convs} == {
        "conv3x3": (fused, "INT8"), "depthwise": (fused, "INT8"), "pointwise": ("Conv", "INT8")}
    assert next(r for r in res.ops if r.op_type == "AveragePool").dtype == "INT8"
    assert _cos(res.outputs[0], _ort(after, feeds)) > 0.999


@pytest.mark.slow
def test_pits_stride_8_patch_conv_runs_int8_once_split(rknn, tmp_path):
    """RKNN crashes on any Q/DQ conv of stride 8 (PiT's 16x16 stride-8 patch embedding); split into a
    space-to-depth conv and a 4x4 stride-2 one, both run INT8."""
    feeds = [{"x": np.random.RandomState(i).randn(1, 3, 32, 32).astype(np.float32)} for i in range(3)]
    model = ir.serde.deserialize_model(qdq_strided_conv())
    as_is, path = tmp_path / "pit.onnx", tmp_path / "pit_rknn.onnx"
    save_model(model, as_is)
    with pytest.raises(BadInput, match=r"crashed \(SIGSEGV\) in stage build \(compiler pass rknn::RKNNWeightTransposePass\)"):
        run_rknn(RknnRequest(onnx=as_is, platform=PLATFORM, config=CONFIG), tmp_path / "as_is")
    qdq_layout(model, feeds)
    save_model(model, path)
    res = run_rknn(RknnRequest(onnx=path, platform=PLATFORM, config=CONFIG, inputs=feeds), tmp_path / "work")
    assert res.summary.int8_share == 1.0 and res.summary.on_cpu == [], res.summary.to_dict()
    assert [r.source for r in res.ops if r.is_gemm] == ["patch_s2d", "patch_patch"]
    assert _cos(res.outputs[0], _ort(path, feeds)) > 0.999


@pytest.mark.slow
def test_a_gelu_without_its_half_runs_on_the_npu_after_the_layout(rknn, tmp_path):
    """EfficientFormerV2's MLP: RKNN runs the lone Erf of x·(1 + erf(x/√2)) on the CPU; in the layout
    (·0.5·2 after it) it fuses exGelu on the NPU and nothing is on the CPU."""
    feeds = [{"x": np.random.RandomState(i).randn(1, 16, 8, 8).astype(np.float32)} for i in range(2)]
    before, after = tmp_path / "gelu.onnx", tmp_path / "gelu_rknn.onnx"
    model = ir.serde.deserialize_model(qdq_unhalved_gelu())
    save_model(model, before)
    assert qdq_layout(model, feeds)["rknn_halved_gelus"] == 1
    save_model(model, after)
    plain = run_rknn(RknnRequest(onnx=before, platform=PLATFORM, config=CONFIG), tmp_path / "plain")
    assert plain.summary.on_cpu == ["Erf:Erf:gelu_erf"]
    res = run_rknn(RknnRequest(onnx=after, platform=PLATFORM, config=CONFIG, inputs=feeds), tmp_path / "work")
    assert res.summary.on_cpu == [] and any(r.op_type == "exGelu" for r in res.ops), res.summary.to_dict()
    assert _cos(res.outputs[0], _ort(after, feeds)) > 0.999


def test_the_loop_watch_counts_rknns_warning_across_reads(tmp_path):
    from vitexport.targets.rknn.client import LoopWatch

    log = tmp_path / "rknn.log"
    line = b"E build: The 'swap_transpose_reshape' rule on the 'node_index_4d' node may fall into an infinite loop!\n"
    watch = LoopWatch(log, repeats=3)
    assert not watch()  # no log yet
    log.write_bytes(line + line[:60])  # the second warning cut where the phrase is
    assert not watch() and watch.count == 1
    with open(log, "ab") as f:
        f.write(line[60:] + b"D     fuse_two_reshape: remove node = ['x']\n")
    assert not watch() and watch.count == 2
    with open(log, "ab") as f:
        f.write(line)
    assert watch() and watch.count == 3


def test_a_worker_stuck_in_the_optimisers_loop_is_stopped_long_before_its_timeout(tmp_path):
    """RKNN 2.5.0's optimiser warned that a rule "may fall into an infinite loop" 35 582 times in 26 minutes on the
    task zoo's UperNet and never finished: the client stops the worker once the warning repeats."""
    import subprocess
    import sys
    import time

    from vitexport.targets._worker import wait_for_worker
    from vitexport.targets.rknn.client import LoopWatch

    log = tmp_path / "rknn.log"
    says = "E build: The 'swap_transpose_reshape' rule on the 'n' node may fall into an infinite loop!"
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-c", f"import time\nwhile True:\n print({says!r}, flush=True)\n time.sleep(0.002)"],
                                stdout=f, start_new_session=True)
        rc = wait_for_worker(proc, 600, tmp_path / "reply.json", lambda s: None, "rknn-toolkit2", stalled=LoopWatch(log))
    assert rc is None and proc.returncode is not None and time.monotonic() - t0 < 60
