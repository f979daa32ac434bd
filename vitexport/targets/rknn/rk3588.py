"""Rockchip RK3588's NPU through rknn-toolkit2 2.5.0: ``model.rknn``, gated on RKNN's x86 simulator.

rknn-toolkit2 lives in a venv of its own (``make setup-rknn``: it pins numpy<=1.26.4 / onnx<=1.18 and
imports torch) and runs in a worker process (:mod:`.client`). The target owns
- where Q/DQ goes: activations as ``quantization.asymmetric_activations: auto`` picks them (uint8 with a zero
  point, as RKNN's own quantizer, on a graph with conv stages; int8 with zero point 0 on a transformer, measured
  better on RKNN's simulator: docs/bench.md), per-channel weights (RKNN's own default), attention's
  Q·Kᵀ and attn·V quantized; smoothing Muls inserted before Linears stay (RKNN refused them,
  ``Invalid w_par['dtype'] = float16``, only while the Linears read float inputs; in the Q/DQ layout
  the demo with its 4 inserted Muls compiles with 100 % of its GEMM/Conv MACs in INT8);
- the route by which the INT8 reaches RKNN (``target_options.route``, :mod:`.routes`):
  ``qdq`` (default, the best measured in ``bench/results-npu.md``: vitexport's Q/DQ in the layout
  RKNN runs as INT8: every quantized Conv's output Q/DQ'd, after the Relu/Clip RKNN fuses; the conv
  kinds and ops measured are tabled in :mod:`.qdq`), ``rknn`` (RKNN's own quantizer on vitexport's float graph), ``hybrid``
  (vitexport's ranges written into RKNN's quantization config);
- what its runtime accepts: :class:`RknnRules`, the patterns RKNN crashes on, hangs on or runs on the
  CPU, checked on the file as it will be laid out for RKNN;
- the INT8 gate's arithmetic: float Q/DQ semantics (the float parts run in FP16 on the NPU; the
  ``simulate`` stage measures that);
- two stages (:mod:`.stages`): ``build_engine`` → ``model.rknn``, ``simulate`` on RKNN's simulator.

RKNN's config: ``remove_reshape`` drops the Reshape RKNN otherwise runs on the CPU at the model's
output ((1, C, 1, 1) → (1, C)); ``model.rknn`` then returns the same values in RKNN's 4-D layout,
which an application reads as the ONNX shape (a view, no copy).
"""
from __future__ import annotations

from typing import Any, ClassVar

import onnx_ir as ir

from ...check.rules import RuntimeRules, violation
from ...check.violation import Violation
from ...stages.base import Contribution
from .client import require_rknn
from .graph import HAZARD_RULES
from .routes import layout_hazards
from .._base import Target
from .._registry import register_target
from .stages import BUILD_ENGINE, RKNN, SIMULATE, Rk3588Options

__all__ = ["Rk3588Target", "Rk3588Options", "RknnRules"]


class RknnRules(RuntimeRules):
    """What rknn-toolkit2 2.5.0 crashes on, hangs on or runs on the CPU, in the file as it will be laid
    out for RKNN (the Q/DQ layout for a Q/DQ file, the float forms otherwise)."""

    RULES = RuntimeRules.RULES + HAZARD_RULES

    def graph(self, model: ir.Model, opset: int) -> list[Violation]:
        return [violation(h.rule, h.node, h.problem, h.hint) for h in layout_hazards(model)]


@register_target
class Rk3588Target(Target):
    """Rockchip RK3588 NPU: ``model.rknn`` compiled by rknn-toolkit2, gated on its simulator."""

    name = "rk3588"
    description = "Rockchip RK3588 NPU, rknn-toolkit2 2.5.0: model.rknn, parity on RKNN's x86 simulator"
    #: the recipe's ``quantization.asymmetric_activations`` decides (rk3588.yaml: true). Symmetric int8 spends
    #: half its levels on the negative side a SiLU/GELU output barely reaches; RKNN's INT8 convs compounded
    #: that over MobileViT-XXS's stages. Measured 2026-12-06 (256 held-out crops, simulator, symmetric →
    #: asymmetric): MobileViT-XXS worst cosine 0.725 → 0.930, agreement 96.9 → 98.8 %, INT8 96.0 → 97.9 %,
    #: its gate exit 1 → 0; EfficientViT-B0 0.956 → 0.968, 95.7 → 97.3 %
    force_symmetric = False
    dedicated_pairs = False
    Options = Rk3588Options
    #: RKNN 2.5.0's ``squeeze_nd_mul`` rule crashes on a Mul over a rank-6 tensor (Swin's window
    #: partition, [1, 2, 2, 4, 4, 32]: ``'IRGraph' object has no attribute 'node_use_target_const'``) and,
    #: with the rule disabled, its ``swap_transpose_reshape`` loops without end
    max_insert_rank: ClassVar[int | None] = 4
    #: RKNN 2.5.0 crashes (SIGSEGV in OpEmit) on a Mul after SegFormer's one-head attention output
    #: (attn·V → Transpose → Mul → Reshape → Linear); such sites fold into V where they can, else stay
    insert_after_attention: ClassVar[bool] = False
    #: RKNN 2.5.0 runs a depthwise conv's equalising Mul as an op of its own in float16 on the full-size
    #: map (MobileViT-XXS at 64×64: 7 of them, up to 32×32×32), not folded into the conv. Measured on the
    #: trained MobileViT-XXS (simulator, 64 held-out, same load): 501 ops / 204 ms per sample without, 528 /
    #: 419 ms with; but with it the simulator's cosine mean 0.982 → 0.994 and top-1 agreement 92.2 → 98.4 %
    #: (worst 0.65 → 0.84). Off: not slower than before the equalisation; True buys that quality
    equalise_depthwise: ClassVar[bool] = False
    #: rknn-toolkit2's ``target_platform``
    platform: ClassVar[str] = "rk3588"
    #: the toolkit the worker's venv holds (``make setup-rknn``)
    toolkit: ClassVar[str] = "rknn-toolkit2==2.5.0"
    #: ``RKNN.config`` beyond the platform (see the module docstring)
    rknn_config: ClassVar[dict[str, Any]] = {"remove_reshape": True}
    engine = "RKNN"
    #: RKNN re-decides precisions while it fuses: its op table (build_engine) is the figure gated, not the file's
    int8_share_stage = BUILD_ENGINE.name
    target_stages = (BUILD_ENGINE, SIMULATE)
    #: an NPU is bought for INT8 throughput: ≥ 95 % of GEMM/Conv multiply-accumulates in INT8 (issue 28)
    int8_share_min = 0.95
    #: no compute op on the CPU: each one is a round trip NPU → CPU → NPU and float arithmetic on a slow
    #: core. Reshape/Transpose-like data movement on the CPU is reported, not gated (a copy, no arithmetic)
    cpu_compute_ops_max = 0
    int8_share_hints = (
        "target_options.route=rknn or route=hybrid (RKNN's own quantizer decides each conv's precision itself)",)
    runs_on = "the RK3588 NPU through RKNN (model.rknn, rknn-toolkit2 2.5.0; parity on its x86 simulator)"

    @property
    def arithmetic(self) -> str:
        # the gate's float parts are FP32 while the NPU runs them in FP16: the simulate stage measures that
        return ("INT8 parity: Q/DQ evaluated as float ops in ONNX Runtime (session.disable_quant_qdq), float parts "
                "in FP32; the NPU runs its float parts in FP16, which the simulate stage measures on RKNN's simulator")

    def rules(self) -> RknnRules:
        return RknnRules()

    def contribution(self) -> Contribution:
        """The ``build_engine`` (``model.rknn``) and ``simulate`` stages."""
        return RKNN

    def require_toolchain(self) -> None:
        """rknn-toolkit2's venv, when this run compiles (``make setup-rknn`` creates it)."""
        stages = self.recipe.stages
        if stages.quantize_int8.enabled and stages.build_engine.enabled:
            require_rknn()
