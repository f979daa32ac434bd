"""Units under export/: the wire-level weight hold-out, opset lowering, einsum and the rewrites."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from export_helpers import make_graph_model
from onnx import TensorProto, helper, numpy_helper

from vitexport.export.einsum import einsum_as_matmul
from vitexport.export.opset import convert_opset
from vitexport.export.rewrites import ExportRewrites
from vitexport.export.wire import joined_bytes, split_initializers, write_joined
from vitexport.errors import BadInput
from vitexport.export import simplify_onnx
from vitexport.recipe import load_recipe


def _matmul_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 300)).astype(np.float32), "w")  # 4.8 kB
    b = numpy_helper.from_array(rng.standard_normal((300,)).astype(np.float32), "b")
    f16 = numpy_helper.from_array(np.ones((3,), np.float16), "unused_f16")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Add", ["h", "b"], ["output"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 300])], initializer=[w, b, f16])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_split_and_join_give_onnx_save_bytes(tmp_path):
    model = _matmul_model()
    data = model.SerializeToString()
    stub, held = split_initializers(data, 1000)
    assert [h.name for h in held] == ["w", "b"] and held[0].dims == (4, 300) and held[0].data_type == TensorProto.FLOAT
    stub_model = onnx.ModelProto.FromString(stub)
    assert [t.name for t in stub_model.graph.initializer] == ["unused_f16"]
    # Small initializers first, then the held ones: exactly what onnx serializes for that order.
    want = onnx.ModelProto.FromString(data)
    inits = [onnx.TensorProto.FromString(t.SerializeToString()) for t in want.graph.initializer]
    del want.graph.initializer[:]
    want.graph.initializer.extend([inits[2], inits[0], inits[1]])
    assert joined_bytes(stub, held, data) == want.SerializeToString()
    # The file-to-file path (copy_file_range) writes the same bytes.
    src, dst = tmp_path / "src.onnx", tmp_path / "dst.onnx"
    src.write_bytes(data)
    with open(src, "rb") as fi, open(dst, "wb", buffering=0) as fo:
        write_joined(fo.fileno(), stub, held, fi.fileno(), data)
    assert dst.read_bytes() == want.SerializeToString()


@pytest.mark.parametrize("content", [b"", b"\x00\x01garbage", b"\x0a\xff\xff\xff\x0f"])
def test_simplify_refuses_what_is_not_onnx(content, tmp_path):
    (tmp_path / "bad.onnx").write_bytes(content)
    with pytest.raises(BadInput, match="bad.onnx"):
        simplify_onnx(tmp_path / "bad.onnx", tmp_path / "out.onnx", load_recipe("orin"))
    assert not (tmp_path / "out.onnx").exists()


def test_convert_opset_lowers_dynamo_style_graph_to_13():
    # What dynamo writes: opset 18, ReduceMean with an axes input and noop_with_empty_axes=0,
    # Reshape with allowzero=1 on a constant shape without zeros.
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    shape = numpy_helper.from_array(np.array([4, 1], np.int64), "shape")
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["m"], name="mean", keepdims=1, noop_with_empty_axes=0),
        helper.make_node("Reshape", ["m", "shape"], ["output"], name="view", allowzero=1),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [4, 1])], initializer=[axes, shape])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    low = convert_opset(m, 13)
    assert [o.version for o in low.opset_import if o.domain == ""] == [13]
    import onnxruntime as ort
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    y = ort.InferenceSession(low.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, x.mean(-1, keepdims=True), rtol=1e-6)


def test_convert_opset_refuses_what_13_cannot_say():
    m = make_graph_model("HardSwish", opset=14)
    with pytest.raises(ValueError, match="node 'the_hardswish' \\(HardSwish\\)"):
        convert_opset(m, 13)


@pytest.mark.parametrize("eq,sa,sb", [
    ("bhid,bhjd->bhij", (2, 3, 5, 4), (2, 3, 6, 4)), ("bhij,bhjd->bhid", (2, 3, 5, 6), (2, 3, 6, 4)),
    ("bij,bjk->bki", (2, 3, 4), (2, 4, 5)), ("bnc,dc->bnd", (2, 3, 4), (5, 4)), ("ijk,jl->il", (2, 3, 4), (3, 5)),
    ("i,j->ij", (3,), (4,)), ("bhid,bhid->bhi", (2, 3, 4, 5), (2, 3, 4, 5)),
])
def test_einsum_as_matmul_matches_einsum(eq, sa, sb):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(*sa, generator=g), torch.randn(*sb, generator=g)
    torch.testing.assert_close(einsum_as_matmul(eq, a, b), torch.einsum(eq, a, b))


@pytest.mark.parametrize("eq", ["ii,ij->j", "...ij,...jk->...ik", "ij,jk"])
def test_einsum_left_alone_when_not_a_matmul(eq):
    assert einsum_as_matmul(eq, torch.ones(3, 3), torch.ones(3, 3)) is None


def test_rewrites_count_calls_and_keep_results():
    spec = load_recipe("orin-jp5").export
    ln = torch.nn.LayerNorm(8)
    q = k = v = torch.randn(1, 2, 5, 8)
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        want = (ln(x), torch.nn.functional.scaled_dot_product_attention(q, k, v), torch.einsum("bij,bjk->bik", x, x.transpose(1, 2)))
        with ExportRewrites(spec) as mode:
            got = (ln(x), torch.nn.functional.scaled_dot_product_attention(q, k, v), torch.einsum("bij,bjk->bik", x, x.transpose(1, 2)))
    assert dict(mode.counts) == {"layernorm_decomposed": 1, "attention_explicit": 1, "einsum_as_matmul": 1}
    for w, g_ in zip(want, got):
        torch.testing.assert_close(g_, w, rtol=1e-5, atol=1e-5)
