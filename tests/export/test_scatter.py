"""A ScatterND that overwrites one slice, written as Slice and Concat (``export.slice_scatter``)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

from vitexport.errors import ContractViolation
from vitexport.export import export_onnx, simplify_onnx
from vitexport.export.scatter import slice_scatter_as_concat
from vitexport.graph.files import load_model
from vitexport.runners.sessions import Session
from vitexport.targets import build_target, load_recipe


class Assign(torch.nn.Module):
    """A Linear whose output gets one slice overwritten or added to in place (Conditional DETR's box update)."""

    def __init__(self, where: str):
        super().__init__()
        self.lin, self.other = torch.nn.Linear(8, 6), torch.nn.Linear(8, 6)
        self.where = where

    def forward(self, x):
        y, z = self.lin(x), self.other(x)
        if self.where == "last axis, start":
            y[..., :2] += z[..., :2]
        elif self.where == "last axis, end":
            y[..., 4:] = z[..., :2].sigmoid()
        elif self.where == "middle axis":
            y[:, 1:3] = z[:, :2] * 2
        elif self.where == "every other":
            y[..., ::2] = z[..., :3]
        return y.relu()


def _export(tmp_path, net, target="rk3588", sets=()):
    recipe = load_recipe(target, list(sets))
    x = torch.randn(1, 5, 8)
    export_onnx(net, {"x": x}, tmp_path / "raw.onnx", recipe.export, contract=recipe.contract)
    rep = simplify_onnx(tmp_path / "raw.onnx", tmp_path / "fp32.onnx", build_target(recipe))
    return rep, x


def _ops(path) -> list[str]:
    return [n.op_type for n in load_model(path).graph]


@pytest.mark.parametrize("where", ["last axis, start", "last axis, end", "middle axis"])
def test_a_slice_assignment_becomes_a_concat_with_the_same_outputs(tmp_path, where):
    torch.manual_seed(0)
    net = Assign(where).eval()
    rep, x = _export(tmp_path, net)
    assert "ScatterND" in _ops(tmp_path / "raw.onnx")
    ops = _ops(tmp_path / "fp32.onnx")
    assert "ScatterND" not in ops and "Concat" in ops
    assert any("ScatterND node(s) that overwrite one slice written as Slice and Concat" in n for n in rep.notes), rep.notes
    with torch.no_grad():
        want = net(x).numpy()
    got = Session(tmp_path / "fp32.onnx").run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    model = load_model(tmp_path / "fp32.onnx")
    assert all(v.uses() for v in model.graph.initializers.values())  # the scatter's indices went with it


def test_a_strided_slice_is_left_a_scatter(tmp_path):
    _export(tmp_path, Assign("every other").eval())
    assert "ScatterND" in _ops(tmp_path / "fp32.onnx")


def test_the_npu_contract_holds_for_a_slice_assignment(tmp_path):
    """ScatterND is not on the generic NPU's op list; written as Slice and Concat the contract holds."""
    rep, _ = _export(tmp_path, Assign("last axis, end").eval(), target="npu")
    assert rep.contract == "holds" and "ScatterND" not in _ops(tmp_path / "fp32.onnx")
    with pytest.raises(ContractViolation, match="ScatterND"):
        _export(tmp_path, Assign("last axis, end").eval(), target="npu", sets=["export.slice_scatter=keep"])


def test_only_a_recipe_that_asks_rewrites(tmp_path):
    _export(tmp_path, Assign("last axis, start").eval(), target="orin")
    assert "ScatterND" in _ops(tmp_path / "fp32.onnx")
    _export(tmp_path, Assign("last axis, start").eval(), sets=["export.slice_scatter=keep"])
    assert "ScatterND" in _ops(tmp_path / "fp32.onnx")


def _scatter_graph(indices: np.ndarray, data_shape, update_shape) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("ScatterND", ["data", "indices", "updates"], ["y"], name="scatter")], "g",
        [helper.make_tensor_value_info("data", onnx.TensorProto.FLOAT, data_shape),
         helper.make_tensor_value_info("updates", onnx.TensorProto.FLOAT, update_shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, data_shape)],
        [onnx.numpy_helper.from_array(indices.astype(np.int64), "indices")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("name,indices,update_shape,rewritten", [
    # rows 1..2 of axis 0, every position of axis 1: a box, its updates in row-major order
    ("rows", np.array([[1], [2]]), (2, 4, 3), True),
    ("a full index into a box", np.stack(np.meshgrid([0, 1, 2, 3], [1, 2], indexing="ij"), -1), (4, 2, 3), True),
    ("negative indices", np.array([[-2], [-1]]), (2, 4, 3), True),
    # the same box listed out of order: the updates land elsewhere than a Concat would put them
    ("out of order", np.array([[2], [1]]), (2, 4, 3), False),
    ("a gap", np.array([[0], [2]]), (2, 4, 3), False),
    ("a repeat", np.array([[1], [1]]), (2, 4, 3), False),
    ("two partial axes", np.array([[[0, 1], [0, 2]], [[1, 1], [1, 2]]]), (2, 2, 3), False),
])
def test_which_index_sets_are_one_slice(tmp_path, name, indices, update_shape, rewritten):
    import onnx_ir as ir

    proto = _scatter_graph(indices, (4, 4, 3), update_shape)
    model = ir.serde.deserialize_model(proto)
    assert slice_scatter_as_concat(model) == int(rewritten)
    out = ir.serde.serialize_model(model)
    onnx.checker.check_model(out, full_check=True)
    rng = np.random.default_rng(0)
    feeds = {"data": rng.standard_normal((4, 4, 3), np.float32), "updates": rng.standard_normal(update_shape, np.float32)}
    want = Session(proto.SerializeToString()).run(None, feeds)[0] if name != "a repeat" else None
    got = Session(out.SerializeToString()).run(None, feeds)[0]
    if want is not None:
        np.testing.assert_array_equal(got, want)
    assert ("ScatterND" in [n.op_type for n in out.graph.node]) is not rewritten
