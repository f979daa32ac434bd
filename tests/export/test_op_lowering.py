"""Ops the npu's list lacks (GlobalAveragePool, ReduceL2, Clip) rewritten exactly with ops it has."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from vitexport.export import export_onnx, simplify_onnx
from vitexport.export.op_lowering import lower_to_allowed_ops
from vitexport.graph.files import data_file, load_model, save_model
from vitexport.runners.sessions import Session
from vitexport.targets import build_target, load_recipe

NPU_OPS = load_recipe("npu").contract.allowed_ops


def _graph(nodes, x_shape, y_shape, inits=(), opset=13) -> ir.Model:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], list(inits))
    return ir.from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]))


def _scalar(name, v):
    return numpy_helper.from_array(np.asarray(v, np.float32), name)


CASES = {
    "global_average_pool": (lambda o: _graph([helper.make_node("GlobalAveragePool", ["x"], ["y"], name="gap")],
                                             [2, 8, 5, 7], [2, 8, 1, 1], opset=o), "GlobalAveragePool"),
    "reduce_l2": (lambda o: _graph([helper.make_node("ReduceL2", ["x", "axes"] if o >= 18 else ["x"], ["y"], name="l2",
                                                     keepdims=1, **({} if o >= 18 else {"axes": [-1]}))],
                                   [2, 3, 6], [2, 3, 1], [numpy_helper.from_array(np.array([-1], np.int64), "axes")] if o >= 18 else [],
                                   opset=o), "ReduceL2"),
    "clip_min": (lambda o: _graph([helper.make_node("Clip", ["x", "lo"], ["y"], name="clip")], [4, 9], [4, 9],
                                  [_scalar("lo", 1e-12)], opset=o), "Clip"),
    "clip_both": (lambda o: _graph([helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="clip")], [4, 9], [4, 9],
                                   [_scalar("lo", 0.0), _scalar("hi", 6.0)], opset=o), "Clip"),
    "clip_max": (lambda o: _graph([helper.make_node("Clip", ["x", "", "hi"], ["y"], name="clip")], [4, 9], [4, 9],
                                  [_scalar("hi", 0.5)], opset=o), "Clip"),
    "pad": (lambda o: _graph([helper.make_node("Pad", ["x", "pads", "v"], ["y"], name="pad", mode="constant")],
                             [1, 5, 5, 3], [1, 7, 8, 3], [numpy_helper.from_array(np.array([0, 0, 1, 0, 0, 2, 2, 0], np.int64), "pads"),
                                                          _scalar("v", 0.0)], opset=o), "Pad"),
}


def _run(model: ir.Model, x: np.ndarray) -> np.ndarray:
    return Session(model).run(None, {"x": x})[0]


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("case", list(CASES))
def test_rewrites_are_exact_and_use_allowed_ops_only(case, opset):
    build, op = CASES[case]
    x = (np.random.default_rng(0).standard_normal(build(opset).graph.inputs[0].shape.numpy()) * 4).astype(np.float32)
    x.flat[:3] = 0.0  # a zero norm, values at the bounds
    ref = _run(build(opset), x)
    model = build(opset)
    assert lower_to_allowed_ops(model, NPU_OPS) == {op: 1}
    ops = {n.op_type for n in model.graph}
    assert op not in ops and ops <= set(NPU_OPS), ops
    got = _run(model, x)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6 * float(np.abs(ref).max()))
    assert [o.name for o in model.graph.outputs] == ["y"]


def test_nothing_is_rewritten_where_the_op_is_allowed_or_no_list_is_given():
    build, _ = CASES["global_average_pool"]
    assert not lower_to_allowed_ops(build(13), None)
    assert not lower_to_allowed_ops(build(13), [*NPU_OPS, "GlobalAveragePool"])
    assert not lower_to_allowed_ops(build(13), [op for op in NPU_OPS if op != "ReduceMean"])  # no rewrite fits


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external-data"])
def test_an_npu_export_of_normalize_and_pooling_passes_its_contract(tmp_path, external):
    """F.normalize (ReduceL2 + Clip) and adaptive average pooling (GlobalAveragePool) export for the
    npu, whose list has none of the three, with parity at the simplify stage; also when the weights
    live in a ``.data`` file (a model over 64 MB: timm's swinv2_tiny at 112 MB once failed the
    checker run after the rewrite, which had no folder to read the ``.data`` file from)."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            # a conv weight of 19 KB: over LIFT_MIN_BYTES, so simplify holds it aside as it does a real model's
            self.conv, self.fc = torch.nn.Conv2d(3, 64, 5), torch.nn.Linear(64, 4)

        def forward(self, x):
            h = torch.nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(x)), 1).flatten(1)
            return self.fc(torch.nn.functional.normalize(h, dim=-1))

    torch.manual_seed(0)
    net, recipe = Net().eval(), load_recipe("npu")
    inputs = {"x": torch.randn(2, 3, 12, 12)}
    export_onnx(net, inputs, tmp_path / "raw.onnx", recipe.export, contract=recipe.contract)
    if external:
        save_model(load_model(tmp_path / "raw.onnx"), tmp_path / "raw.onnx", external_min_bytes=0)
        assert data_file(tmp_path / "raw.onnx").is_file()
    rep = simplify_onnx(tmp_path / "raw.onnx", tmp_path / "fp32.onnx", build_target(recipe))
    assert {"GlobalAveragePool", "ReduceL2", "Clip"} <= set(rep.ops_before) and rep.contract == "holds"
    assert not {"GlobalAveragePool", "ReduceL2", "Clip"} & set(rep.ops_after)
    assert sum("not in contract.allowed_ops" in n for n in rep.notes) == 3
    with torch.no_grad():
        want = net(inputs["x"]).numpy()
    got = Session(tmp_path / "fp32.onnx").run(None, {"x": inputs["x"].numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
