"""A small linear Resize by a fractional factor written as one MatMul with its interpolation matrix."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

from vitexport.export.resize_matmul import MAX_KERNEL, fractional_resize_as_matmul
from vitexport.runners.sessions import Session


def _resize(shape, out_hw, mode="linear", transform="half_pixel", by="sizes", opset=13) -> onnx.ModelProto:
    n, c, h, w = shape
    if by == "sizes":
        extra = [onnx.numpy_helper.from_array(np.asarray([n, c, *out_hw], np.int64), "sizes")]
        inputs = ["x", "", "", "sizes"]
    else:
        extra = [onnx.numpy_helper.from_array(np.asarray([1, 1, *out_hw], np.float32), "scales")]
        inputs = ["x", "", "scales"]
    node = helper.make_node("Resize", inputs, ["y"], name="resize", mode=mode, coordinate_transformation_mode=transform)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], extra)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _rewritten(proto: onnx.ModelProto) -> tuple[int, onnx.ModelProto]:
    model = ir.serde.deserialize_model(proto)
    done = fractional_resize_as_matmul(model)
    return done, ir.serde.serialize_model(model)


@pytest.mark.parametrize("transform", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("shape,out_hw,by", [((1, 3, 3, 3), (16, 16), "sizes"), ((2, 4, 6, 6), (16, 16), "sizes"),
                                             ((1, 2, 3, 3), (2, 2), "sizes"), ((1, 2, 5, 7), (3, 11), "sizes"),
                                             ((1, 2, 4, 4), (1.5, 2.5), "scales")])
def test_the_matmul_gives_onnx_runtimes_resize(shape, out_hw, by, transform):
    proto = _resize(shape, out_hw, transform=transform, by=by)
    done, out = _rewritten(proto)
    assert done == 1 and [n.op_type for n in out.graph.node] == ["Reshape", "MatMul", "Reshape"]
    x = np.random.default_rng(0).standard_normal(shape, np.float32)
    want = Session(proto.SerializeToString()).run(None, {"x": x})[0]
    got = Session(out.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,out_hw,mode", [
    ((1, 2, 2, 2), (16, 16), "linear"),    # integer factor: the NPU runs it
    ((1, 2, 6, 6), (2, 2), "linear"),      # the inverse of one: the NPU runs it
    ((1, 2, 3, 3), (16, 16), "nearest"),   # not linear
    ((1, 1, 24, 24), (40, 40), "linear"),  # a matrix of 576 x 1600 entries: over MAX_KERNEL
])
def test_what_the_npu_runs_or_a_large_map_is_left_as_it_is(shape, out_hw, mode):
    assert 24 * 24 * 40 * 40 > MAX_KERNEL
    done, out = _rewritten(_resize(shape, out_hw, mode=mode))
    assert done == 0 and [n.op_type for n in out.graph.node] == ["Resize"]
