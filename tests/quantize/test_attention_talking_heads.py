"""Talking-heads attention is attention (issue 28): Q·Kᵀ → a learned mix across heads → Softmax → a mix →
·V. EfficientFormerV2 mixes with 1x1 convs, CaiT with Linears over a permuted heads axis; both batched
MatMuls are annotated as attention (orin: Q·Kᵀ INT8 at head size 32; attn·V by its head size), and an
activation product whose Softmax sits behind a conv that is no head mix is still not attention."""
from __future__ import annotations

import io

import onnx
import onnx_ir as ir
import onnxsim
import pytest
import torch
from torch import nn

from qcases import target
from vitexport.export.simplify import SKIPPED_OPTIMIZERS
from vitexport.quantize import attention_role


class _TalkingHeads(nn.Module):
    """(B, C, H, W) → attention over H*W tokens, ``heads`` heads of size ``dim``; ``mix``: ``conv``
    (EfficientFormerV2's talking_head1/2), ``linear`` (CaiT's proj_l/proj_w), ``none``, or ``widen``
    (1x1 convs from heads to 2*heads channels and back: no H x H mix, so not attention's scores as
    far as annotate can tell)."""

    def __init__(self, mix: str, c: int = 16, heads: int = 4, dim: int = 32) -> None:
        super().__init__()
        self.mix, self.heads, self.dim = mix, heads, dim
        self.q, self.k, self.v = (nn.Conv2d(c, heads * dim, 1) for _ in range(3))
        self.proj = nn.Conv2d(heads * dim, c, 1)
        wide = 2 * heads if mix == "widen" else heads
        self.th1, self.th2 = nn.Conv2d(heads, wide, 1), nn.Conv2d(wide, heads, 1)
        self.pl, self.pw = nn.Linear(heads, heads), nn.Linear(heads, heads)

    def _mix(self, attn: torch.Tensor, conv: nn.Conv2d, lin: nn.Linear) -> torch.Tensor:
        if self.mix in ("conv", "widen"):
            return conv(attn)
        if self.mix == "linear":
            return lin(attn.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return attn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        q, k, v = (m(x).reshape(b, self.heads, self.dim, h * w) for m in (self.q, self.k, self.v))
        attn = (q.transpose(-2, -1) @ k) * self.dim ** -0.5
        attn = self._mix(attn, self.th1, self.pl).softmax(dim=-1)
        attn = self._mix(attn, self.th2, self.pw)
        out = attn @ v.transpose(-2, -1)
        return self.proj(out.transpose(-2, -1).reshape(b, -1, h, w))


def _model(tmp_path, mix: str) -> ir.Model:
    """Exported as the pipeline does: TorchScript, then onnxsim without the optimizers it leaves off
    (a Linear on the permuted heads stays MatMul + Add, not Reshape/Gemm/Reshape)."""
    torch.manual_seed(0)
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(_TalkingHeads(mix).eval(), (torch.randn(1, 16, 4, 4),), buf, input_names=["x"],
                          output_names=["output"], opset_version=17, dynamo=False)
    proto, ok = onnxsim.simplify(onnx.load_from_string(buf.getvalue()), skipped_optimizers=list(SKIPPED_OPTIMIZERS))
    assert ok
    return ir.from_proto(proto)


def _batched(model: ir.Model) -> list[ir.Node]:
    return [n for n in model.graph if n.op_type == "MatMul" and n.inputs[1].const_value is None
            and n.inputs[1].producer() is not None and n.inputs[1].producer().op_type != "Constant"]


@pytest.mark.parametrize("mix", ["conv", "linear", "none"])
def test_a_talking_heads_mix_keeps_both_matmuls_attention(tmp_path, mix):
    model = _model(tmp_path, mix)
    assert [attention_role(n) for n in _batched(model)] == ["qk", "pv"]
    plan = target("orin").annotate(model)
    kinds = {n.node: n.kind.value for n in plan.nodes}
    qk, pv = (n.name for n in _batched(model))
    assert kinds.get(qk) == "attention"  # head size 32: TensorRT's fused INT8 attention takes it
    assert kinds.get(pv) == "attention"  # attn·V's head size is V's: 32 here too
    assert "not attention" not in " ".join(plan.skipped.values())


def test_a_conv_that_is_no_head_mix_is_not_attention(tmp_path):
    model = _model(tmp_path, "widen")  # heads -> 2*heads channels: a new tensor, not the mixed scores
    assert [attention_role(n) for n in _batched(model)] == [None, None]
    plan = target("openvino").annotate(model)
    assert all("not attention" in plan.skipped[n.name] for n in _batched(model))
