"""The openvino target end to end: a timm ViT through the whole pipeline into OpenVINO IR, gated on the
CPU plugin, with every quantized Linear (the classifier head too, whose runtime layer OpenVINO names
after the graph output) found in an integer kernel of the runtime model."""
from __future__ import annotations

import json
import warnings

import numpy as np
import onnx_ir as ir
import pytest
import timm
import torch

from vitexport.calibration.data import NpzSamples
from vitexport.graph.files import load_model
from vitexport.graph.query import quantized_linears
from vitexport.pipeline import run_pipeline
from vitexport.targets.openvino.runner import OpenVinoRunner
from vitexport.targets.openvino.runner import RuntimePrecisions
from vitexport.sources.base import LoadedModel, OutputAdapter
from vitexport.targets import load_target
from vitexport.targets.openvino.target import fused_producers, linears_not_int8, runtime_share
from vitexport.runners.host import int8_dot_saturates

IMG = 32


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A one-block ViT-Tiny-width model (32x32, 8x8 patches, 10 classes) exported for openvino."""
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1, img_size=IMG, patch_size=8, num_classes=10)
    module = OutputAdapter(vit.eval(), ["image"], keyword=False).eval()
    images = np.random.default_rng(0).standard_normal((40, 3, IMG, IMG)).astype(np.float32)
    model = LoadedModel(module, {"image": torch.from_numpy(images[:1])}, "vit", "timm", "timm:vit_tiny(depth=1)")
    out = tmp_path_factory.mktemp("ov") / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arts = run_pipeline(model, load_target("openvino", ["quantization.measure_latency=false"]), out,
                            calib=NpzSamples({"image": images[:32]}), parity_data=NpzSamples({"image": images[32:]}))
    return arts, out


def test_every_quantized_linear_runs_int8_the_head_included(exported):
    arts, out = exported
    assert arts.passed
    assert (out / "model.xml").is_file() and (out / "model.bin").is_file()
    runtime = json.loads((out / "manifest.json").read_text())["runtime"]["build_engine"]
    linears = quantized_linears(load_model(out / "model.int8.onnx"))
    head = [n for n in linears if any(v.is_graph_output() for v in n.outputs)]
    assert len(head) == 1  # the classifier head writes the graph output: the case the layer naming hides
    assert runtime["quantized_linears"] == len(linears) == 5  # qkv, proj, fc1, fc2, head
    assert runtime["linears_not_int8"] == []
    assert _plugin_runs_int8_all_the_file_quantized(out)


def _plugin_runs_int8_all_the_file_quantized(out) -> bool:
    """What the plugin ran in float is what the quantizer left float (attn·V may be: its probe decides), and the
    share is what the file's Q/DQ covers, at the 0.95 gate or above."""
    doc = json.loads((out / "parity.json").read_text())
    share = next(s for s in doc["stages"] if s["stage"] == "build_engine")["details"]["int8_share"]
    return share["share"] >= 0.95 and all(f["why"].startswith("no Q/DQ on it") for f in share["float_layers"])


def test_a_linear_without_an_integer_kernel_is_named(exported):
    """The same runtime model with the head's layer dropped from the integer ones: the head is reported,
    by its ONNX node name."""
    _, out = exported
    linears = quantized_linears(load_model(out / "model.int8.onnx"))
    with OpenVinoRunner(out / "model.xml") as run:
        prec = run.precisions()
    head = next(n for n in linears if any(v.is_graph_output() for v in n.outputs))
    out_names = {v.name for v in head.outputs}
    without = RuntimePrecisions(macs=prec.macs, layers=prec.layers,
                                int8_layers=[layer for layer in prec.int8_layers if not out_names & set(layer)])
    assert len(without.int8_layers) == len(prec.int8_layers) - 1
    assert linears_not_int8(without, linears) == [head.name]
    assert linears_not_int8(prec, linears) == []


def test_the_runtime_share_is_gated_and_a_float_layer_is_named_with_why(exported):
    """build_engine gates OpenVINO's own figure (all INT8 here); a quantized Linear the runtime ran in
    float would be named after its ONNX node, Q/DQ'd in the file yet not in an integer kernel."""
    _, out = exported
    doc = json.loads((out / "parity.json").read_text())
    stage = next(s for s in doc["stages"] if s["stage"] == "build_engine")
    check = next(c for c in stage["checks"] if c["metric"] == "int8_share")
    assert check["passed"] and check["limit"] == 0.95 and _plugin_runs_int8_all_the_file_quantized(out)
    with OpenVinoRunner(out / "model.xml") as run:
        prec = run.precisions()
    fc1 = next(layer for layer in prec.int8_layers if any("fc1/MatMul" in n for n in layer))
    moved = RuntimePrecisions(macs={"FullyConnected": {"u8": 3 * 64, "f32": 64}}, layers=prec.layers,
                              int8_layers=[x for x in prec.int8_layers if x != fc1],
                              float_layers=[(fc1, "FullyConnected", "f32", 64)])
    share = runtime_share(moved, {n.name for n in quantized_linears(load_model(out / "model.int8.onnx"))}, [])
    assert share.share == 0.75 and [f.name for f in share.float_layers] == ["/model/model/blocks/blocks.0/mlp/fc1/MatMul"]
    assert "Q/DQ'd in model.int8.onnx, yet OpenVINO's CPU plugin kept it in f32" in share.float_layers[0].why


def test_a_layer_named_after_the_node_that_reads_a_matmul_is_that_matmul(exported):
    """OpenVINO may name a fused layer after a reader alone (BERT's Q·Kᵀ with its scale runs as a MatMul named
    ``attention/self/Mul``): the share reads it back to the Q/DQ'd MatMul, not 'no Q/DQ on it'."""
    _, out = exported
    qdq = load_model(out / "model.int8.onnx")
    fc1 = next(n for n in qdq.graph if n.name.endswith("fc1/MatMul"))
    reader = next(u for v in fc1.outputs for u, _ in v.uses())
    assert reader.op_type != "MatMul" and fused_producers(qdq)[reader.name] == fc1.name
    lone = RuntimePrecisions(macs={"FullyConnected": {"f32": 64}}, layers=[], int8_layers=[],
                             float_layers=[((reader.name,), "FullyConnected", "f32", 64)])
    quantized = {n.name for n in quantized_linears(qdq)}
    named = runtime_share(lone, quantized, [], fused_producers(qdq)).float_layers[0]
    assert named.name == fc1.name and named.why.startswith("Q/DQ'd in model.int8.onnx")
    assert runtime_share(lone, quantized, []).float_layers[0].why.startswith("no Q/DQ on it")  # unread: misnamed


def test_weights_are_7_bit_exactly_where_this_cpu_saturates_8_bit_ones(exported):
    """reduce_range_weights=auto (the openvino recipe's default): |q| <= 63 where the CPU lacks VNNI/AMX, the
    full int8 range where it has them, and the report says which and why; true / false force it."""
    arts, out = exported
    qdq = load_model(out / "model.int8.onnx")
    qmax = max(int(np.abs(v.const_value.numpy()).max()) for n in qdq.graph if n.op_type == "DequantizeLinear"
               for v in n.inputs[:1] if v.const_value is not None and v.const_value.dtype == ir.DataType.INT8)
    assert qmax == (63 if int8_dot_saturates() else 127)
    notes = next(s for s in json.loads((out / "parity.json").read_text())["stages"] if s["stage"] == "quantize_int8")["notes"]
    assert any(n.startswith("weights: 7-bit" if int8_dot_saturates() else "weights: 8-bit") for n in notes)
    assert load_target("openvino").encoding().weight_qmax == qmax
    assert load_target("openvino", ["quantization.reduce_range_weights=true"]).encoding().weight_qmax == 63
    assert load_target("openvino", ["quantization.reduce_range_weights=false"]).encoding().weight_qmax == 127
    assert load_target("openvino", ["quantization.reduce_range_weights=false"]).weight_range_note() is None


def test_attention_matmuls_take_int8_inputs_so_the_cpu_plugin_runs_them_integer(tmp_path):
    """OpenVINO's activations are uint8 with a zero point, yet a Q·Kᵀ whose q arrives as uint8 with zero point
    128 ran in f32 on the CPU plugin (ViT-Tiny: 11 of 12, 93.4 % INT8, under the 0.95 gate): attention's
    two-sided inputs are int8 with zero point 0, the probabilities (one-sided) stay uint8, and every
    attention MatMul the file quantizes runs an integer kernel. Its second operand (k, v) is the kernel's signed
    side: 7-bit where this CPU's 8-bit products saturate, as weights are (8-bit k took a trained YOLOS's plugin
    cosine to 0.962, 8-bit v a Conditional DETR's to 0.971)."""
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, img_size=IMG, patch_size=8, num_classes=10)
    module = OutputAdapter(vit.eval(), ["image"], keyword=False).eval()
    images = np.random.default_rng(0).standard_normal((40, 3, IMG, IMG)).astype(np.float32)
    model = LoadedModel(module, {"image": torch.from_numpy(images[:1])}, "vit", "timm", "timm:vit_tiny(depth=2)")
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arts = run_pipeline(model, load_target("openvino", ["quantization.measure_latency=false"]), out,
                            calib=NpzSamples({"image": images[:32]}), parity_data=NpzSamples({"image": images[32:]}))
    assert arts.passed
    qdq = load_model(out / "model.int8.onnx")
    scores = [n for n in qdq.graph if n.op_type == "MatMul" and n.name.endswith("attn/MatMul")]
    probs = [n for n in qdq.graph if n.op_type == "MatMul" and n.name.endswith("attn/MatMul_1")
             and n.inputs[1].producer().op_type == "DequantizeLinear"]  # attn·V the quantizer kept INT8
    assert len(scores) == 2
    zp = lambda v: v.producer().inputs[2].const_value.numpy()  # noqa: E731 - the DequantizeLinear's zero point
    for node in scores:
        assert all(zp(v).dtype == np.int8 and not zp(v).any() for v in node.inputs)
    ranges = json.loads((out / "calibration.json").read_text())["tensors"]
    qmax = 63 if int8_dot_saturates() else 127
    for node in scores + probs:
        dq = node.inputs[1].producer()
        k = dq.inputs[0].producer().inputs[0].name  # the calibrated tensor the QuantizeLinear reads
        assert float(dq.inputs[1].const_value.numpy()) == pytest.approx(ranges[k]["amax"] / qmax, rel=1e-5)
    for node in probs:
        assert zp(node.inputs[0]).dtype == np.uint8  # softmax: one-sided, uint8 as every other activation
    assert _plugin_runs_int8_all_the_file_quantized(out)
    with OpenVinoRunner(out / "model.xml") as run:  # every Q/DQ'd attention MatMul runs an integer kernel
        floats = {name for layer, _, _, _ in run.precisions().float_layers for name in layer}
    assert not floats & {n.name for n in scores + probs if n.inputs[0].producer().op_type == "DequantizeLinear"}
