"""fuse_qkv: the fused weights, what is left of the old projections, reasons for skipped sites."""
from __future__ import annotations

import torch
from torch import nn

from passes_zoo import _Heads, build_case, token_case
from vitexport.parity.metrics import compare
from vitexport.passes import fuse_qkv, mask_to_where
from vitexport.passes.attention import FusedProjection, ProjectionSlice
from vitexport.recipe import Tolerance
from vitexport.sources import OutputAdapter

TOL = Tolerance(max_abs=1e-5)


def _out(model, inputs):
    with torch.no_grad():
        return model(**inputs).numpy()


def test_hf_projections_become_one_linear():
    case = build_case("hf_vit_eager")
    model, report = fuse_qkv(case.model, case.inputs)
    assert report.changed == 2
    old, new = (next(m for m in mm.modules() if type(m).__name__ == "ViTAttention") for mm in (case.model, model))
    assert isinstance(new.qkv, FusedProjection) and isinstance(new.o_proj, nn.Linear)
    # the module's own forward still calls q_proj / k_proj / v_proj: they are slices of the fused Linear
    assert all(isinstance(getattr(new, n), ProjectionSlice) and getattr(new, n).fused is new.qkv for n in ("q_proj", "k_proj", "v_proj"))
    assert "forward" not in vars(new) and not new.q_proj._parameters
    torch.testing.assert_close(new.qkv.weight, torch.cat([old.q_proj.weight, old.k_proj.weight, old.v_proj.weight]), rtol=0, atol=0)
    torch.testing.assert_close(new.qkv.bias, torch.cat([old.q_proj.bias, old.k_proj.bias, old.v_proj.bias]), rtol=0, atol=0)
    keys = set(model.state_dict())
    assert {"model.vit.layers.0.attention.qkv.weight", "model.vit.layers.0.attention.o_proj.weight"} <= keys
    assert not any("q_proj" in k for k in keys)  # the weights are held once, in the fused Linear
    for i in range(4):
        inputs = case.make_inputs(i)
        assert compare(_out(case.model, inputs), _out(model, inputs), TOL)


def test_traced_projections_become_one_linear_and_split():
    case = build_case("seed")
    model, report = fuse_qkv(case.model, case.inputs)
    attn = model.model.blocks[0].attn
    assert [c.detail for c in report.changes] == ["observed: q/k/v -> one Linear"] * 2
    assert isinstance(attn.qkv, nn.Linear) and attn.qkv.out_features == 96
    assert all(isinstance(getattr(attn, n), ProjectionSlice) for n in ("q", "k", "v"))
    # one projection per block runs: the slices share the fused result
    calls = []
    handle = attn.qkv.register_forward_hook(lambda *a: calls.append(1))
    try:
        with torch.no_grad():
            model(**case.inputs)
    finally:
        handle.remove()
    assert len(calls) == 1


def test_already_fused_layouts_are_reported_with_reasons():
    for name, reason in (("timm_vit", "one Linear 'qkv'"), ("tv_vit", "in_proj_weight"), ("timm_swin", "one Linear 'qkv'")):
        case = build_case(name)
        model, report = fuse_qkv(case.model, case.inputs)
        assert report.changed == 0 and report.found == len(report.skipped) > 0
        assert all(s.reason.startswith("already fused: ") and reason in s.reason for s in report.skipped), report.to_dict()
    case = token_case("sdpa")
    _, report = fuse_qkv(case.model, case.inputs)
    assert {s.reason for s in report.skipped} == {"already fused: q, k and v come from one Linear 'qkv'"}


def test_second_run_is_already_fused():
    for name in ("seed", "hf_bert_eager"):
        case = build_case(name)
        model, first = fuse_qkv(case.model, case.inputs)
        _, second = fuse_qkv(model, case.inputs)
        assert first.changed == 2 and second.found == 2 and second.changed == 0
        assert all(s.reason.startswith("already fused") for s in second.skipped)


class CrossAttention(_Heads):
    """q from x, k and v from a context: three Linears, but not one input."""

    def forward(self, x, context):
        q, k, v = self.split(self.q(x)), self.split(self.k(context)), self.split(self.v(context))
        return self.merge(torch.softmax((q @ k.transpose(-2, -1)) * self.scale, -1) @ v)


class CrossModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = CrossAttention(32, 4)

    def forward(self, x, context):
        return self.attn(x, context)


def test_cross_attention_is_not_fused():
    model = OutputAdapter(CrossModel().eval(), ["x", "context"], keyword=False)
    inputs = {"x": torch.randn(2, 5, 32), "context": torch.randn(2, 7, 32)}
    out, report = fuse_qkv(model, inputs)
    assert report.found == 1 and report.changed == 0
    assert report.skipped[0].reason == "q, k and v read different inputs (cross-attention)"


def test_where_then_fuse_on_bert():
    case = build_case("hf_bert_sdpa")
    where, _ = mask_to_where(case.model, case.inputs)
    model, report = fuse_qkv(where, case.inputs)
    assert report.changed == 2
    for i in range(4):
        inputs = case.make_inputs(i)
        ref, out = _out(case.model, inputs), _out(model, inputs)
        keep = case.unmasked(inputs, ref)
        assert compare(ref[keep], out[keep], TOL)
