"""Units under export/: simplify's weight hold-out, opset lowering, einsum and the rewrites."""
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
from vitexport.errors import BadInput
from vitexport.export import simplify_onnx
from vitexport.targets import load_recipe, load_target


def _matmul_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 300)).astype(np.float32), "w")  # 77 kB: held aside
    b = numpy_helper.from_array(rng.standard_normal((300,)).astype(np.float32), "b")
    scale = numpy_helper.from_array(np.full((300,), 2.0, np.float32), "scale")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Add", ["h", "b"], ["hb"], name="add"),
             helper.make_node("Mul", ["hb", "scale"], ["output"], name="mul")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 300])], initializer=[w, b, scale])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_simplify_holds_weights_aside_and_puts_the_same_bytes_back(tmp_path):
    import onnxsim

    model = _matmul_model()
    onnx.save(model, str(tmp_path / "raw.onnx"))
    seen = []
    real = onnxsim.simplify

    def spy(proto, *a, **kw):  # what onnxsim is given: the weight is a typed graph input, not data
        seen.append(({i.name for i in proto.graph.initializer}, {i.name for i in proto.graph.input}))
        return real(proto, *a, **kw)

    onnxsim.simplify = spy
    try:
        rep = simplify_onnx(tmp_path / "raw.onnx", tmp_path / "fp32.onnx", load_target("orin"))
    finally:
        onnxsim.simplify = real
    assert seen and "w" not in seen[0][0] and "w" in seen[0][1]
    assert rep.held_initializers == 1 and rep.held_bytes == 64 * 300 * 4
    out = onnx.load(str(tmp_path / "fp32.onnx"))
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    assert np.array_equal(inits["w"], numpy_helper.to_array(model.graph.initializer[0]))
    assert [i.name for i in out.graph.input] == ["x"]


def _masked_softmax(cond: np.ndarray) -> onnx.ModelProto:
    """Softmax(Where(cond, x @ w, -inf)): a DETR-style attention mask, here a constant condition."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(-np.inf, np.float32), "fill")]
    nodes = [helper.make_node("Constant", [], ["cond"], value=numpy_helper.from_array(cond, "c")),
             helper.make_node("MatMul", ["x", "w"], ["s"]), helper.make_node("Where", ["cond", "s", "fill"], ["m"]),
             helper.make_node("Softmax", ["m"], ["output"], axis=-1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4, 8])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("cond,folded", [(np.ones((1, 1, 8), bool), True), (np.eye(4, 8, dtype=bool)[None] | True, True),
                                         (np.arange(8) < 6, False)])
def test_simplify_folds_a_where_whose_constant_condition_always_takes_one_branch(tmp_path, cond, folded):
    import onnxruntime as ort

    onnx.save(_masked_softmax(np.asarray(cond)), str(tmp_path / "raw.onnx"))
    rep = simplify_onnx(tmp_path / "raw.onnx", tmp_path / "fp32.onnx", load_target("cpu"))
    ops = [n.op_type for n in onnx.load(str(tmp_path / "fp32.onnx")).graph.node]
    assert ("Where" not in ops) == folded
    assert any("Where node(s) with a constant" in n for n in rep.notes) == folded
    x = {"x": np.random.default_rng(1).standard_normal((1, 4, 8)).astype(np.float32)}
    before, after = (ort.InferenceSession(str(tmp_path / f), providers=["CPUExecutionProvider"]).run(None, x)[0]
                     for f in ("raw.onnx", "fp32.onnx"))
    np.testing.assert_array_equal(before, after)


@pytest.mark.parametrize("content", [b"", b"\x00\x01garbage", b"\x0a\xff\xff\xff\x0f"])
def test_simplify_refuses_what_is_not_onnx(content, tmp_path):
    (tmp_path / "bad.onnx").write_bytes(content)
    with pytest.raises(BadInput, match="bad.onnx"):
        simplify_onnx(tmp_path / "bad.onnx", tmp_path / "out.onnx", load_target("orin"))
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


def _padding_masked_scores(compare: str, mask_first: bool) -> onnx.ModelProto:
    """Softmax(Where(compare(Where(keep, 0, -inf), -1e4), x @ w, -inf)): an additive padding mask built
    from an integer ``attention_mask`` and turned back into a condition (all-mpnet-base-v2's form)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(-np.inf, np.float32), "fill"),
             numpy_helper.from_array(np.array(-1e4, np.float32), "t"),
             numpy_helper.from_array(np.array([1, 1, 8], np.int64), "shape")]
    nodes = [helper.make_node("Cast", ["mask"], ["keep0"], to=TensorProto.BOOL),
             helper.make_node("Reshape", ["keep0", "shape"], ["keep"]),
             helper.make_node("Where", ["keep", "zero", "fill"], ["additive"]),
             helper.make_node(compare, ["additive", "t"] if mask_first else ["t", "additive"], ["cond"]),
             helper.make_node("MatMul", ["x", "w"], ["s"]),
             helper.make_node("Where", ["cond", "s", "fill"] if compare == "Greater" and mask_first or
                              compare == "Less" and not mask_first else ["cond", "fill", "s"], ["m"]),
             helper.make_node("Softmax", ["m"], ["output"], axis=-1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8]),
                                       helper.make_tensor_value_info("mask", TensorProto.INT64, [1, 8])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4, 8])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("compare,mask_first", [("Greater", True), ("Less", True), ("Less", False), ("Greater", False)])
def test_simplify_reads_a_padding_masks_condition_instead_of_comparing_its_additive_form(tmp_path, compare, mask_first):
    """The float compare goes, every reader takes the boolean (or its Not), the outputs stay bit-equal, and
    the integer prefix the NPU routes cut off now ends in that boolean: no float compare left for the NPU."""
    import onnxruntime as ort

    from vitexport.graph.split import split_integer_prefix

    onnx.save(_padding_masked_scores(compare, mask_first), str(tmp_path / "raw.onnx"))
    rep = simplify_onnx(tmp_path / "raw.onnx", tmp_path / "fp32.onnx", load_target("cpu"))
    graph = onnx.load(str(tmp_path / "fp32.onnx")).graph
    ops = [n.op_type for n in graph.node]
    assert compare not in ops and ops.count("Where") == 1, ops
    assert any("comparison(s) of a Where(mask, a, b)" in n for n in rep.notes)
    rng = np.random.default_rng(1)
    for keep in ([1] * 8, [1] * 5 + [0] * 3, [1, 0] * 4):
        feed = {"x": rng.standard_normal((1, 4, 8)).astype(np.float32), "mask": np.array([keep], np.int64)}
        before, after = (ort.InferenceSession(str(tmp_path / f), providers=["CPUExecutionProvider"]).run(None, feed)[0]
                         for f in ("raw.onnx", "fp32.onnx"))
        np.testing.assert_array_equal(before, after)
    prefix = split_integer_prefix(tmp_path / "fp32.onnx", tmp_path / "npu.onnx", tmp_path / "host.onnx")
    npu_inputs = {v.name: v.type.tensor_type.elem_type for v in onnx.load(str(tmp_path / "npu.onnx")).graph.input}
    assert prefix is not None and compare not in prefix.ops
    assert [t for name, t in npu_inputs.items() if name != "x"] == [TensorProto.BOOL], npu_inputs
