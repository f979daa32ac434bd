"""Index plumbing an NPU op list lacks (CumSum, GatherElements, And, Or), lowered at export time."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from export_helpers import op_counts, run_ort

from vitexport.export import export_onnx, simplify_onnx
from vitexport.export.lowering import bool_and, bool_or, cumsum_as_matmul, gather_as_matmul
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
