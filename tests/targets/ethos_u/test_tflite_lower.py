"""The ethos-u targets' tflite route: vitexport's FP32 ONNX lowered to TFLite ops (``tflite_lower``), then
written, quantized (LiteRT 16x8), run on the LiteRT interpreter and compiled by Vela in the worker's venv
(``tflite_worker``). The lowering's own tests run everywhere; those that run the file skip, saying why,
where ``.venv-ethos`` is missing."""
from __future__ import annotations

import collections
import json
import subprocess
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import onnxsim
import pytest
import torch

from vitexport.errors import BadInput
from vitexport.targets.ethos_u.client import ethos_missing, ethos_python
from vitexport.targets.ethos_u.tflite_lower import calibrated_mask_fill, lower_onnx

from vitexport.targets.ethos_u.client import WORKER

WORKER_DIR = str(WORKER.parent)  # tflite_worker runs in .venv-ethos only, never imported here


class TinyViT(torch.nn.Module):
    """What a ViT puts in front of Vela: a stride-4 patch conv, a CLS token, a LayerNorm with loaded affine
    terms, 2-head attention whose last key is masked by ``where`` (-inf), an erf GELU MLP, the CLS token's
    head."""

    def __init__(self):
        super().__init__()
        self.patch = torch.nn.Conv2d(1, 16, 4, 4)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, 16))
        self.norm = torch.nn.LayerNorm(16)
        torch.nn.init.normal_(self.norm.weight, 1.0, 0.2)
        torch.nn.init.normal_(self.norm.bias, 0.0, 0.2)
        self.qkv, self.proj = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)
        self.fc1, self.fc2, self.head = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16), torch.nn.Linear(16, 5)
        self.register_buffer("keep", torch.tensor([True] * 16 + [False]))

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(x.shape[0], -1, -1), t], 1)
        b, n, c = t.shape  # timm's attention: 2 heads split by a 5-D permute, merged by a transpose
        q, k, v = self.qkv(self.norm(t)).reshape(b, n, 3, 2, c // 2).permute(2, 0, 3, 1, 4).unbind(0)
        s = torch.where(self.keep, q @ k.transpose(-2, -1) * 0.25, torch.tensor(float("-inf")))
        t = t + self.proj((s.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c))
        t = t + self.fc2(torch.nn.functional.gelu(self.fc1(t)))
        return self.head(t[:, 0])


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    torch.manual_seed(0)
    model = TinyViT().eval()
    path = tmp_path_factory.mktemp("tfl") / "m.onnx"
    x = torch.randn(1, 1, 16, 16)
    torch.onnx.export(model, (x,), str(path), input_names=["x"], output_names=["y"], opset_version=17, dynamo=False)
    simple, ok = onnxsim.simplify(onnx.load(str(path)))  # as the pipeline's simplify stage leaves it
    assert ok
    onnx.save(simple, path)
    return path


def _feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 1, 16, 16)).astype(np.float32)} for _ in range(n)]


def test_a_vit_lowers_to_ops_vela_runs_in_int16(onnx_file):
    program = lower_onnx(onnx_file, calibrated_mask_fill(onnx_file, _feeds(4, 1)))
    ops = collections.Counter(o["op"] for o in program.ops)
    # 5 Linears as FULLY_CONNECTED, their bias Adds folded in; attention's two activation matmuls
    assert ops["FULLY_CONNECTED"] == 5 and ops["BATCH_MATMUL"] == 2
    fcs = [o for o in program.ops if o["op"] == "FULLY_CONNECTED"]
    assert all(o["inputs"][2] is not None for o in fcs)
    # GELU in its tanh form (Vela runs TFLite's GELU on int8 only), never an Erf; LayerNorm as MEAN/RSQRT
    assert ops["TANH"] == 1 and "GELU" not in ops and ops["RSQRT"] == 1 and ops["MEAN"] == 2
    # the 1-channel image to NHWC and the patch tokens out of it are reshapes, kᵀ the matmul's adj_y, the
    # 5-D split into heads 3 × 2 slices (Vela decomposes a rank-5 TRANSPOSE into a long chain of its own);
    # the one TRANSPOSE left is the 4-D merge of the heads
    assert ops["CONV_2D"] == 1 and ops["TRANSPOSE"] == 1 and ops["SLICE"] == 3 * 2 + 1
    transposed = [o for o in program.ops if o["op"] == "TRANSPOSE"][0]
    assert len(program.shapes[transposed["inputs"][0]]) == 4
    assert [o["options"]["adj_y"] for o in program.ops if o["op"] == "BATCH_MATMUL"] == [True, False]
    # the mask: x·keep + fill, the fill the calibrated floor of the scores (not -inf or -1e9)
    assert len(program.mask_fill) == 1 and -200 < program.mask_fill[0]["fill"] < 0
    fill = [program.consts[i] for o in program.ops for i in o["inputs"] if i and "_fill" in i][0]
    assert np.isfinite(fill).all() and fill.min() == pytest.approx(program.mask_fill[0]["fill"], abs=1e-3)


def test_an_op_without_a_rule_names_its_node(tmp_path):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8])
    model = onnx.helper.make_model(onnx.helper.make_graph([onnx.helper.make_node("Cos", ["x"], ["y"], name="the_cos")],
                                                          "g", [x], [y]), opset_imports=[onnx.helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "cos.onnx")
    with pytest.raises(BadInput, match="Cos.*the_cos.*route=executorch"):
        lower_onnx(tmp_path / "cos.onnx")


@pytest.fixture(scope="module")
def worker_run(onnx_file, tmp_path_factory):
    """The program written as float and 16x8 TFLite, both run on LiteRT, the integer file compiled by Vela."""
    missing = ethos_missing()
    if missing:
        pytest.skip(missing)
    work = tmp_path_factory.mktemp("tflw")
    program = lower_onnx(onnx_file, calibrated_mask_fill(onnx_file, _feeds(4, 1)))
    js, npz = program.save(work)
    calib, test = _feeds(32, 1), _feeds(16, 2)
    np.save(work / "calib.npy", np.concatenate([f["x"] for f in calib]))
    np.save(work / "test.npy", np.concatenate([f["x"] for f in test]))
    script = textwrap.dedent(f"""
        import json, sys, numpy as np
        sys.path.insert(0, {WORKER_DIR!r})
        import tflite_worker as tw
        w = {str(work)!r}
        tw.write_float({str(js)!r}, {str(npz)!r}, w + "/f.tflite")
        cal, test = np.load(w + "/calib.npy"), np.load(w + "/test.npy")
        tw.quantize(w + "/f.tflite", [[cal[i:i + 1]] for i in range(len(cal))], "int16", w + "/q.tflite")
        rows = [[test[i:i + 1]] for i in range(len(test))]
        np.save(w + "/float_out.npy", np.concatenate(tw.interpret(w + "/f.tflite", rows)[0]))
        np.save(w + "/int_out.npy", np.concatenate(tw.interpret(w + "/q.tflite", rows)[0]))
        opt, row = tw.compile_vela(w + "/q.tflite", ["--accelerator-config=ethos-u85-256", "--config=Arm/vela.ini",
                                   "--system-config=Ethos_U85_SYS_DRAM_Mid", "--memory-mode=Sram_Only"], w + "/vela")
        cpu, npu = tw.placement(opt)
        json.dump({{"cpu": cpu, "npu": npu, "macs": row["nn_macs"]}}, open(w + "/placement.json", "w"))
    """)
    done = subprocess.run([str(ethos_python()), "-I", "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    sess = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    golden = np.concatenate([sess.run(None, f)[0] for f in test])
    return work, golden


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.mark.slow
def test_the_float_tflite_computes_what_onnx_runtime_does(worker_run):
    work, golden = worker_run
    got = np.load(work / "float_out.npy")
    # the tanh GELU is the only approximation: a few 1e-4 on logits of size ~1
    assert np.abs(got - golden).max() < 5e-3 and _cos(got, golden).min() > 0.99999


@pytest.mark.slow
def test_the_16x8_file_keeps_parity_and_vela_puts_every_op_on_the_npu(worker_run):
    work, golden = worker_run
    got = np.load(work / "int_out.npy")
    assert _cos(got, golden).min() > 0.99
    placed = json.loads((work / "placement.json").read_text())
    # one NPU part; on the CPU only the float boundary's QUANTIZE / DEQUANTIZE (moves, no arithmetic)
    assert placed["npu"] == 1 and int(float(placed["macs"])) > 0
    assert {c["op"] for c in placed["cpu"]} <= {"quantize", "dequantize"} and all(c["moves"] for c in placed["cpu"])


class Upsampler(torch.nn.Module):
    """A conv and a 2× bilinear upsample (MobileViT, SegFormer's decoder): the lowering has no rule for Resize."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return torch.nn.functional.interpolate(self.conv(x), scale_factor=2.0, mode="bilinear")


@pytest.mark.parametrize("route", ["auto", "tflite"])
def test_auto_falls_back_to_executorch_naming_the_op_an_explicit_tflite_refuses(tmp_path, route):
    from types import SimpleNamespace

    from vitexport.targets import load_recipe, target_class
    from vitexport.targets.ethos_u.stages import CompileEthosUStage

    torch.manual_seed(0)
    model, x = Upsampler().eval(), torch.randn(1, 3, 8, 8)
    path = tmp_path / "m.onnx"
    torch.onnx.export(model, (x,), str(path), input_names=["x"], opset_version=17, dynamo=False)
    recipe = load_recipe("ethos-u85").model_copy(update={"target_options": {"route": route}})
    target = target_class("ethos-u85")(recipe)
    feeds = [{"x": x.numpy()}]
    ctx = SimpleNamespace(target=target, files={"model.fp32.onnx": path}, reference=SimpleNamespace(feeds=feeds),
                          module=model, model=SimpleNamespace(example_inputs={"x": x}))
    if route == "tflite":
        with pytest.raises(BadInput, match="Resize"):
            CompileEthosUStage._request(ctx, tmp_path, feeds)
        return
    req, why = CompileEthosUStage._request(ctx, tmp_path, feeds)
    assert req.route == "executorch" and req.program.is_file() and req.program.suffix == ".pt2"
    assert why.startswith("route executorch") and "Resize" in why and "falls back" in why


def test_reductions_reach_vela_with_a_unit_axis(tmp_path):
    """Vela reduces over depth only when one of h, w, c is 1: MobileViT's LayerNorm over [4, 16, 64] patches
    and an NCHW global pool went to the CPU. Both are lowered as means over the last axis of [1, rows, n]."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 16, 8])
    p = onnx.helper.make_tensor_value_info("p", onnx.TensorProto.FLOAT, [1, 4, 1, 1])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 16, 8])
    nodes = [onnx.helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], name="ln", axis=-1),
             onnx.helper.make_node("Reshape", ["y", "s"], ["img"], name="img"),
             onnx.helper.make_node("GlobalAveragePool", ["img"], ["p"], name="pool")]
    inits = [onnx.numpy_helper.from_array(np.ones(8, np.float32), "g"),
             onnx.numpy_helper.from_array(np.zeros(8, np.float32), "b"),
             onnx.numpy_helper.from_array(np.array([1, 4, 16, 8], np.int64), "s")]
    model = onnx.helper.make_model(onnx.helper.make_graph(nodes, "g", [x], [y, p], initializer=inits),
                                   opset_imports=[onnx.helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "r.onnx")
    program = lower_onnx(tmp_path / "r.onnx")
    means = [program.shapes[o["inputs"][0]] for o in program.ops if o["op"] == "MEAN"]
    assert means == [[1, 64, 8], [1, 64, 8], [1, 4, 128]]
    assert program.shapes["y"] == [4, 16, 8] and program.shapes["p"] == [1, 4, 1, 1]
