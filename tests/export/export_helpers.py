"""Tiny real models and ONNX helpers for the export tests (random weights, no network)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import timm
import torch
from onnx import TensorProto, helper, numpy_helper

from vitexport.parity.metrics import CompareResult, compare
from vitexport.recipe import Tolerance
from vitexport.runners import OnnxRuntimeRunner, TorchRunner
from vitexport.sources.base import OutputAdapter

__all__ = [
    "tiny_timm",
    "adapter",
    "image",
    "feeds",
    "leftovers",
    "to_float16",
    "float16_storage",
    "run_ort",
    "op_counts",
    "make_graph_model",
    "onnx_parity",
]

# Small but real: every block type, shifted windows for Swin, rope + SwiGLU for EVA-02.
TINY = {
    "vit": ("vit_tiny_patch16_224", dict(img_size=32, depth=2, embed_dim=64, num_heads=2)),
    "eva02": ("eva02_tiny_patch14_224", dict(img_size=28, depth=1)),
    "swin": ("swin_tiny_patch4_window7_224", dict(img_size=56, depths=(2,), num_heads=(2,), embed_dim=32, window_size=7)),
}


def tiny_timm(kind: str, seed: int = 0) -> tuple[torch.nn.Module, int]:
    """A tiny timm model of the named family in eval mode and its image size."""
    name, kw = TINY[kind]
    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False, num_classes=10, **kw).eval()
    return model, kw["img_size"]


def adapter(model: torch.nn.Module) -> OutputAdapter:
    """The wrapper the pipeline hands to ``export_onnx``: positional inputs named ``x``."""
    return OutputAdapter(model, ["x"], keyword=False).eval()


def image(size: int, batch: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))}


def feeds(size: int, batch: int = 2, n: int = 2, scale: float = 1.0) -> list[dict[str, np.ndarray]]:
    """Parity batches other than the export example."""
    return [
        {"x": (np.random.default_rng(100 + i).standard_normal((batch, 3, size, size)) * scale).astype(np.float32)}
        for i in range(n)
    ]


def leftovers(folder: Path, keep: set[str] = frozenset()) -> list[str]:
    """Files in ``folder`` other than ``keep`` (temporary or partial artifacts)."""
    return sorted(p for p in os.listdir(folder) if p not in keep)


def op_counts(path_or_model) -> dict[str, int]:
    model = onnx.load(str(path_or_model)) if isinstance(path_or_model, (str, Path)) else path_or_model
    out: dict[str, int] = {}
    for n in model.graph.node:
        out[n.op_type] = out.get(n.op_type, 0) + 1
    return out


def to_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every float32 tensor, Cast and constant of ``model`` as float16 (what an FP16 engine runs)."""
    m = onnx.ModelProto.FromString(model.SerializeToString())
    g = m.graph
    for init in g.initializer:
        if init.data_type == TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    for vi in [*g.input, *g.output]:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    del g.value_info[:]
    for node in g.node:
        for a in node.attribute:
            if node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.FLOAT16
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float16), a.t.name))
    return m


def float16_storage(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its weights and every float activation rounded to float16 between ops.

    Why not just :func:`to_float16`: ONNX Runtime's CPU provider has float16 kernels for few ops
    and runs the others in float32, dropping the casts between neighbours, so an overflow such as
    ``1000 * 1000`` in float16 never happens there. A Cast to float16 and back after each node is
    kept (the pair is lossy), which is what an FP16 engine does: compute, then store in float16.
    """
    m = onnx.shape_inference.infer_shapes(onnx.ModelProto.FromString(model.SerializeToString()))
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*m.graph.value_info, *m.graph.output]}
    for init in m.graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            arr = numpy_helper.to_array(init).astype(np.float16).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(arr, init.name))
    nodes = []
    for node in m.graph.node:
        rounding = []
        for i, name in enumerate(node.output):
            if types.get(name) == TensorProto.FLOAT:
                node.output[i] = f"{name}__f32"
                rounding += [helper.make_node("Cast", [f"{name}__f32"], [f"{name}__f16"], to=TensorProto.FLOAT16),
                             helper.make_node("Cast", [f"{name}__f16"], [name], to=TensorProto.FLOAT)]
        nodes += [node, *rounding]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    del m.graph.value_info[:]
    return m


def run_ort(model: onnx.ModelProto | str | Path, feed: dict[str, np.ndarray], optimize: bool = True) -> np.ndarray:
    """Run on the CPU provider; ``optimize=False`` stops ONNX Runtime from fusing the decomposed
    LayerNorm back into its float32-internal LayerNormalization kernel."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    sess = ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feed)[0]


def make_graph_model(
    op: str = "Relu",
    opset: int = 13,
    shape: tuple = (1, 4),
    dtype: int = TensorProto.FLOAT,
    attrs: dict | None = None,
    domain: str = "",
    out_shape: tuple | None = None,
) -> onnx.ModelProto:
    """A one-node graph ``y = op(x)`` with input ``x`` and output ``output``."""
    x = helper.make_tensor_value_info("x", dtype, list(shape))
    y = helper.make_tensor_value_info("output", dtype, list(out_shape or shape))
    node = helper.make_node(op, ["x"], ["output"], name=f"the_{op.lower()}", domain=domain, **(attrs or {}))
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=imports)
    model.ir_version = 8
    return model


def onnx_parity(model: torch.nn.Module, example_inputs: dict[str, torch.Tensor], onnx_path: str | Path,
                tolerance: Tolerance, feeds=None) -> CompareResult:
    """Run ``model`` (torch) and ``onnx_path`` (ONNX Runtime) on the same feeds and compare them.

    The pipeline gates each stage against its golden reference itself; the export tests hold a
    module and a file and compare them directly. ``feeds`` are batches of name -> array at the
    exported batch size (default: the example inputs).
    """
    batches = list(feeds) if feeds is not None else [{k: v.detach().cpu().numpy() for k, v in example_inputs.items()}]
    with TorchRunner(model, example_inputs, name="torch") as ref_runner:
        ref = ref_runner.infer_batches(batches)["output"]
    with OnnxRuntimeRunner(Path(onnx_path), name="onnxruntime") as ort_runner:
        out = ort_runner.infer_batches(batches)["output"]
    return compare(ref, out, tolerance)
