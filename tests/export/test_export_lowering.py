"""Index plumbing an NPU op list lacks (CumSum, GatherElements, And, Or), lowered at export time."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
from export_helpers import op_counts, run_ort

from vitexport.export import export_onnx, simplify_onnx
from vitexport.export.lowering import (adaptive_avg_pool_as_matmul, bool_and, bool_or, cumsum_as_matmul,
                                       fold_as_conv_transpose, gather_as_matmul)
from vitexport.targets import build_target, load_recipe

G = torch.Generator().manual_seed(0)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.float32])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum_as_matmul_is_cumsum(dtype, dim):
    x = torch.randint(0, 3, (3, 5, 4), generator=G).to(dtype)
    want = torch.cumsum(x, dim)
    got = cumsum_as_matmul(x, dim)
    assert got.dtype == want.dtype and torch.equal(got, want)
    assert torch.equal(cumsum_as_matmul(x, dim, dtype=torch.float64), torch.cumsum(x, dim, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
@pytest.mark.parametrize("dim", [0, 1])
def test_gather_as_matmul_is_gather(dtype, dim):
    x = torch.randn(4, 6, generator=G).mul(10).to(dtype)
    index_shape = (3, 5)  # smaller than the input on both axes, as gather allows
    index = torch.randint(0, x.shape[dim], index_shape, generator=G)
    got = gather_as_matmul(x, dim, index)
    assert got.dtype == x.dtype and torch.equal(got, torch.gather(x, dim, index))


def test_boolean_and_or():
    a, b = torch.rand(4, 7, generator=G) > 0.5, torch.rand(4, 7, generator=G) > 0.5
    assert torch.equal(bool_and(a, b), a & b) and torch.equal(bool_or(a, b), a | b)


class Plumbing(torch.nn.Module):
    """RoBERTa-style position ids and token types, and a mask combined with & and |."""

    def __init__(self):
        super().__init__()
        self.register_buffer("token_types", torch.arange(40).remainder(3).unsqueeze(0))
        self.emb = torch.nn.Embedding(50, 8)

    def forward(self, ids, attention_mask):
        real = ids.ne(1).int()
        pos = (torch.cumsum(real, dim=1).type_as(real) * real + 1).long()
        types = torch.gather(self.token_types.expand(ids.shape[0], -1), 1, pos)
        keep = attention_mask.bool() & (ids != 2) | (ids == 0)
        return self.emb(pos) + self.emb(types) * keep.unsqueeze(-1)


@pytest.mark.parametrize("target", ["npu", "orin"])
def test_lowered_only_for_a_contract_without_the_op(target, tmp_path):
    recipe = load_recipe(target)
    ids = torch.randint(0, 6, (2, 12), generator=G)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 7:] = 0
    inputs = {"ids": ids, "attention_mask": mask}
    model = Plumbing().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = export_onnx(model, inputs, tmp_path / "raw.onnx", recipe.export, contract=recipe.contract)
    ops = op_counts(tmp_path / "raw.onnx")
    lowered = {"CumSum", "GatherElements", "And", "Or"}
    if target == "npu":
        assert not lowered & set(ops), ops
        assert all(report.rewrites.get(f"lowered_{op}") == 1 for op in lowered), report.rewrites
        assert any(n.startswith("CumSum written as MatMul") for n in report.notes)
    else:  # orin's compiler takes them: nothing is rewritten
        assert lowered <= set(ops) and not any(k.startswith("lowered_") for k in report.rewrites)
    with torch.no_grad():
        want = model(**inputs).numpy()
    got = run_ort(tmp_path / "raw.onnx", {k: v.numpy() for k, v in inputs.items()})
    assert np.array_equal(got, want)


def test_index_plumbing_passes_the_npu_contract(tmp_path):
    recipe = load_recipe("npu")
    inputs = {"ids": torch.randint(0, 6, (2, 12), generator=G), "attention_mask": torch.ones(2, 12, dtype=torch.long)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_onnx(Plumbing().eval(), inputs, tmp_path / "raw.onnx", recipe.export, contract=recipe.contract)
    simplify_onnx(tmp_path / "raw.onnx", tmp_path / "fp32.onnx", build_target(recipe))  # raises on a contract violation


@pytest.mark.parametrize("channels,kernel,stride,padding,size,dilation",
                         [(3, 3, 1, 1, 8, 1), (2, 3, 2, 1, 9, 1), (4, 2, 2, 0, 8, 1), (2, 3, 1, 0, 7, 2)])
def test_fold_as_conv_transpose_is_fold(channels, kernel, stride, padding, size, dilation):
    torch.manual_seed(0)
    blocks = (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    x = torch.randn(2, channels * kernel * kernel, blocks * blocks)
    want = torch.nn.functional.fold(x, (size, size), kernel, dilation=dilation, padding=padding, stride=stride)
    got = fold_as_conv_transpose(x, (size, size), kernel, dilation, padding, stride)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)


def test_fold_exports_at_opset_17_without_col2im(tmp_path):
    """VOLO's outlook attention folds patches back (ONNX Col2Im: opset 18 only, no TensorRT 10.3
    importer): written as ConvTranspose, the model exports at the orin recipe's opset 17."""
    class Outlook(torch.nn.Module):
        def forward(self, x):
            cols = torch.nn.functional.unfold(x, 3, padding=1, stride=2)
            return torch.nn.functional.fold(cols * 0.5, x.shape[-2:], 3, padding=1, stride=2)

    recipe = load_recipe("orin")
    x = {"x": torch.randn(1, 4, 8, 8)}
    rep = export_onnx(Outlook(), x, tmp_path / "m.onnx", recipe.export, contract=recipe.contract)
    ops = {n.op_type for n in onnx.load(str(tmp_path / "m.onnx")).graph.node}
    assert rep.opset == 17 and "ConvTranspose" in ops and "Col2Im" not in ops
    assert any("F.fold written as a grouped ConvTranspose" in n for n in rep.notes)


@pytest.mark.parametrize("size,out", [((2, 2), 3), ((2, 2), 6), ((16, 16), 3), ((16, 16), 6), ((7, 5), (3, 2)),
                                      ((10, 10), (6, None))])
def test_adaptive_avg_pool_as_matmul_is_adaptive_avg_pool(size, out):
    x = torch.randn(2, 4, *size)
    torch.testing.assert_close(adaptive_avg_pool_as_matmul(x, out), torch.nn.functional.adaptive_avg_pool2d(x, out),
                               rtol=1e-6, atol=1e-6)


def test_adaptive_avg_pool_that_divides_is_left_to_the_exporter():
    assert adaptive_avg_pool_as_matmul(torch.randn(1, 2, 8, 8), 4) is None
    assert adaptive_avg_pool_as_matmul(torch.randn(1, 2, 8, 6), (1, None)) is None


@pytest.mark.parametrize("target", ["orin", "rk3588"])
def test_pyramid_pooling_exports_as_matmuls_without_gathers(target, tmp_path):
    """UperNet's pyramid pooling: adaptive pooling of a map to 1, 2, 3 and 6 cells. Where the size does not divide
    the map's, the exporters wrote index gathers (GatherND, on which RKNN 2.5.0's optimiser looped); the export
    writes one MatMul with the window matrix, and the file matches torch."""
    class Pyramid(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pools = torch.nn.ModuleList(torch.nn.AdaptiveAvgPool2d(s) for s in (1, 2, 3, 6))

        def forward(self, x):
            return torch.cat([torch.nn.functional.interpolate(p(x), size=x.shape[-2:], mode="bilinear")
                              for p in self.pools], 1)

    recipe = load_recipe(target)
    x = torch.randn(1, 4, 4, 4)
    rep = export_onnx(Pyramid(), {"x": x}, tmp_path / "m.onnx", recipe.export, contract=recipe.contract)
    ops = op_counts(tmp_path / "m.onnx")
    assert not {"GatherND", "Gather", "GatherElements"} & set(ops) and ops.get("MatMul") == 2  # 3 and 6 cells
    assert rep.rewrites["adaptive_pool_as_matmul"] == 2
    assert any("adaptive average pooling to a size that does not divide" in n for n in rep.notes)
    np.testing.assert_allclose(run_ort(tmp_path / "m.onnx", {"x": x.numpy()}), Pyramid()(x).numpy(), atol=1e-5)
