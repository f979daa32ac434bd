"""A generic edge NPU (Rockchip / HiSilicon / Qualcomm class): per-tensor INT8, no float16.

Where Q/DQ goes: per-tensor activations *and* weights (one scale per tensor), asymmetric uint8
activations when the recipe allows, one shared Q/DQ pair per tensor. What its runtime accepts:
one scale per tensor (``npu.per_tensor``) and no float16 anywhere (``npu.float16``; HiSilicon
Hi3559A has none), so no recipe may ask for FP16 float parts. The op list and opset 13 are its
recipe's contract (``npu.yaml``).
"""
from __future__ import annotations

import onnx_ir as ir

from ..check.contract import float16_violations
from ..check.rules import RuntimeRules, qdq_scale, violation
from ..check.violation import Violation
from ._base import Target
from ._registry import register_target

__all__ = ["NpuTarget", "NpuRules"]


class NpuRules(RuntimeRules):
    """A generic edge NPU: one scale per tensor, no float16 anywhere."""

    RULES = RuntimeRules.RULES + ("npu.per_tensor", "npu.float16")
    FLOAT16_RULE = "npu.float16"

    def qdq(self, n: ir.Node, opset: int) -> list[Violation]:
        out = super().qdq(n, opset)
        scale = qdq_scale(n)
        if scale is not None and scale.size > 1:
            out.append(violation("npu.per_tensor", n, f"has {scale.size} scales (per channel); the NPU takes one per "
                                 "tensor", "quantize per tensor (--set quantization.per_channel_weights=false, as "
                                 "npu.yaml does)"))
        return out

    def graph(self, model: ir.Model, opset: int) -> list[Violation]:
        return float16_violations(model, "npu.float16")


@register_target
class NpuTarget(Target):
    """A generic edge NPU: per-tensor everything, uint8 activations when allowed, no float16."""

    name = "npu"
    description = "Generic edge NPU, opset 13, per-tensor INT8, no float16"
    force_symmetric = False
    force_per_tensor = True
    dedicated_pairs = False
    forbid_float16 = True
    runs_on = "a generic edge NPU's runtime (per-tensor INT8, no float16)"
    #: the paper contract: the file's Q/DQ coverage is what the vendor's compiler is handed, gated at
    #: quantize_int8 at the NPU bar (0.95, Target's default): an NPU is bought for INT8 throughput
    int8_share_min = 0.95

    def rules(self) -> NpuRules:
        return NpuRules()
