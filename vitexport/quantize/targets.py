"""Where Q/DQ goes, per target: the rules are code in the target classes, not string flags.

A target *annotates* a float graph into a :class:`~.spec.QuantPlan` (which nodes get INT8 inputs,
how activations and weights are encoded), *validates* a Q/DQ graph against its runtime's rules, and
says which arithmetic its parity gate must run. Everything target-specific lives here.

- :class:`OrinTarget` (TensorRT explicit quantization): symmetric int8 everywhere (zero point 0),
  per-channel weights on the output-channel axis, INT8 inputs of Conv / MatMul / Gemm with a constant
  weight, and of the two attention batched MatMuls only when TensorRT's fused INT8 attention applies
  (head size 16/32/64, sequence ≤ 512). LayerNorm, Softmax, GELU and residual Adds stay in higher
  precision (no Q/DQ on their inputs). A dedicated Q/DQ pair per consumer.
- :class:`NpuTarget`: per-tensor activations *and* weights, asymmetric uint8 activations when the
  recipe allows, no float16 anywhere, one shared Q/DQ pair per tensor.
- :class:`CpuTarget` (ONNX Runtime, x86): the layout ONNX Runtime fuses into integer kernels
  (``QGemm`` / ``MatMulIntegerToFloat`` / ``QLinearMatMul``): int32 biases so Gemms fuse, uint8
  activations and 7-bit weights where the recipe says (cpu.yaml does), one shared pair per tensor.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx_ir as ir

from ..check import Violation, float16_violations, target_rules
from ..runners.sessions import LOW_MEMORY, QDQ_AS_FLOAT, SessionConfig
from ..graph.query import attr, is_const, static_shape
from ..recipe import QuantizationSpec, Recipe, TargetKind
from .spec import ActSpec, Encoding, NodeKind, NodeSpec, QuantPlan, WeightSpec

__all__ = [
    "QuantTarget", "OrinTarget", "NpuTarget", "CpuTarget", "TARGETS", "get_target", "attention_role", "check_placement",
    "float16_tensors",
]

_LINEAR_OPS = ("MatMul", "Gemm", "Conv")
# ops between QKᵀ and Softmax (scale, mask, bias) and between Softmax and PV (cast, dropout)
_SCORE_OPS = frozenset({"Mul", "Div", "Add", "Where", "Cast", "Identity", "Dropout", "Sub"})


def _numel(shape: tuple[int, ...] | None) -> int:
    if not shape:
        return 0
    return int(np.prod(shape, dtype=np.int64))


def attention_role(node: ir.Node) -> str | None:
    """'pv' if the MatMul's left operand comes from a Softmax, 'qk' if its output reaches one, else None."""
    v = node.inputs[0]
    for _ in range(4):
        p = v.producer() if v is not None else None
        if p is None:
            break
        if p.op_type == "Softmax":
            return "pv"
        if p.op_type not in _SCORE_OPS:
            break
        v = p.inputs[0]
    frontier, depth = list(node.outputs), 0
    while frontier and depth < 6:
        nxt = []
        for value in frontier:
            for use in value.uses():
                if use.node.op_type == "Softmax":
                    return "qk"
                if use.node.op_type in _SCORE_OPS:
                    nxt.extend(use.node.outputs)
        frontier, depth = nxt, depth + 1
    return None


class QuantTarget:
    """Base: the rules common to all targets. Subclasses override the class attributes / hooks."""

    kind: ClassVar[TargetKind]
    #: symmetric (int8, zero point 0) activations regardless of the recipe
    force_symmetric: ClassVar[bool] = True
    #: per-tensor weights regardless of the recipe
    force_per_tensor: ClassVar[bool] = False
    dedicated_pairs: ClassVar[bool] = False
    forbid_float16: ClassVar[bool] = False
    #: Gemm / Conv biases as int32 (scale = activation scale × weight scale) so ONNX Runtime fuses
    #: QGemm / QLinearConv; TensorRT wants float biases
    int32_bias: ClassVar[bool] = False
    #: ONNX Runtime's fused integer kernels are this target's runtime, so parity is measured through
    #: them; other targets are measured with float Q/DQ semantics (what TensorRT / an NPU computes)
    runs_in_onnxruntime: ClassVar[bool] = False

    def __init__(self, spec: QuantizationSpec):
        self.spec = spec

    # --- what the target wants ----------------------------------------------------------------------
    def contribution(self):
        """Files and stages this target adds to the pipeline (a ``vitexport.stages.Contribution``), or None."""
        return None

    @property
    def gate_config(self) -> SessionConfig:
        """The ONNX Runtime arithmetic that reproduces this target's (the INT8 gate and fallback run it)."""
        return LOW_MEMORY if self.runs_in_onnxruntime else QDQ_AS_FLOAT

    def high_precision(self) -> str:
        """``fp16`` or ``fp32``: the type of the Q/DQ model's float parts (the recipe's, else the target's)."""
        return self.spec.high_precision or "fp32"

    @property
    def arithmetic(self) -> str:
        """One line for the report: which arithmetic the INT8 gate ran."""
        if self.runs_in_onnxruntime:
            return "INT8 parity: ONNX Runtime's fused integer kernels (the cpu target's runtime)"
        floats = ("float parts in FP16 as written (float16 tensors between ops, the 65504 range), FP32 islands in FP32"
                  if self.high_precision() == "fp16" else "float parts in FP32")
        return ("INT8 parity: Q/DQ evaluated as float ops in ONNX Runtime (session.disable_quant_qdq), "
                f"{floats}: the arithmetic the {self.kind.value} runtime performs")

    def encoding(self) -> Encoding:
        symmetric = self.force_symmetric or not self.spec.asymmetric_activations
        return Encoding(symmetric, self.dedicated_pairs, self.int32_bias, 63 if self.spec.reduce_range_weights else 127)

    def per_channel(self) -> bool:
        return self.spec.per_channel_weights and not self.force_per_tensor

    def attention_ok(self, head: int, seq: int) -> tuple[bool, str]:
        """Whether an attention batched MatMul with this head size / sequence length is quantized."""
        if not self.spec.quantize_attention_matmuls:
            return False, "quantization.quantize_attention_matmuls is off"
        return True, ""

    # --- annotate -----------------------------------------------------------------------------------
    def annotate(self, model: ir.Model) -> QuantPlan:
        """Decide which nodes get INT8 inputs (needs static shapes). Never modifies the graph."""
        nodes: list[NodeSpec] = []
        skipped: dict[str, str] = {}
        per_channel = self.per_channel()
        for n in model.graph:
            if n.op_type not in _LINEAR_OPS or n.domain not in ("", "ai.onnx"):
                continue
            spec, why = self._node(n, per_channel)
            if spec is None:
                skipped[n.name] = why
            else:
                nodes.append(spec)
        return QuantPlan(self.kind.value, tuple(nodes), self.encoding(), skipped)

    def _node(self, n: ir.Node, per_channel: bool) -> tuple[NodeSpec | None, str]:
        x = n.inputs[0]
        if x is None or x.dtype not in (None, ir.DataType.FLOAT):
            return None, "input is not float32"
        if n.op_type == "MatMul" and not is_const(n.inputs[1]):
            if is_const(x):
                return None, "no constant float weight on a supported input"
            return self._attention(n)
        spec = self._linear(n, per_channel)
        return (spec, "") if spec is not None else (None, "no constant float weight on a supported input")

    def _linear(self, n: ir.Node, per_channel: bool) -> NodeSpec | None:
        w = n.inputs[1]
        if w is None or w.const_value is None or w.const_value.dtype != ir.DataType.FLOAT:
            return None
        wshape = tuple(w.const_value.shape)
        out = static_shape(n.outputs[0])
        if n.op_type == "Conv":
            axis, kind, macs = 0, NodeKind.conv, _numel(out) * _numel(wshape[1:])
        elif n.op_type == "Gemm":
            if attr(n, "transA", 0):
                return None
            axis = 0 if attr(n, "transB", 0) else 1
            kind, macs = NodeKind.linear, _numel(out) * (wshape[1] if axis == 0 else wshape[0])
        else:
            if len(wshape) < 2:
                return None
            axis, kind, macs = len(wshape) - 1, NodeKind.linear, _numel(out) * wshape[-2]
        return NodeSpec(n.name, n.op_type, kind, (ActSpec(n.inputs[0].name, 0),),
                        WeightSpec(w.name, 1, axis if per_channel else None), macs)

    def _attention(self, n: ir.Node) -> tuple[NodeSpec | None, str]:
        a, b = static_shape(n.inputs[0]), static_shape(n.inputs[1])
        if not a or not b or len(a) < 3 or len(b) < 3:
            return None, "activation x activation MatMul of unknown or 2-D shape"
        role = attention_role(n)
        if role is None:
            return None, "activation x activation MatMul that is not attention (no Softmax next to it)"
        seq, head = a[-2], (a[-1] if role == "qk" else b[-1])
        if role == "pv" and not self.spec.quantize_attention_pv:
            return None, "attn·V kept in float (quantization.quantize_attention_pv is off)"
        ok, why = self.attention_ok(head, seq)
        if not ok:
            return None, why
        macs = _numel(static_shape(n.outputs[0])) * a[-1]
        return NodeSpec(n.name, n.op_type, NodeKind.attention,
                        (ActSpec(n.inputs[0].name, 0), ActSpec(n.inputs[1].name, 1)), None, macs), ""

    def write_artifacts(self, work_dir: Path, scales: dict[str, float], method: str) -> dict[str, Path]:
        """Files this target's toolchain reads besides the Q/DQ model (none by default).

        Args:
            work_dir: the output folder.
            scales: activation tensor → int8 scale of the written model.
            method: the calibration method (some formats record it).
        """
        return {}

    # --- validate -----------------------------------------------------------------------------------
    def validate(self, model: ir.Model) -> list[Violation]:
        """Rule violations of a Q/DQ model for this target's runtime (empty when it follows them):
        the rules ``vitexport check`` runs (:mod:`vitexport.check.target_rules`)."""
        return target_rules(self.kind, self.spec).violations(model)


def float16_tensors(model: ir.Model) -> list[str]:
    """'initializer X is float16', one per float16 tensor, Cast or constant of the graph."""
    return [f"{v.subject} {v.problem.split(',')[0]}" for v in float16_violations(model, "float16")]


class OrinTarget(QuantTarget):
    """TensorRT 8.6 / 10 on Jetson Orin: explicit, symmetric, strongly typed Q/DQ."""

    kind = TargetKind.orin
    force_symmetric = True  # TensorRT rejects a non-zero zero point
    dedicated_pairs = True  # TensorRT fuses a Q/DQ pair into its one consumer
    #: fused INT8 multi-head attention (TensorRT's MHA fusion) needs these head sizes and ≤ 512 tokens
    FUSED_HEAD_SIZES = (16, 32, 64)
    MAX_FUSED_SEQ = 512

    def high_precision(self) -> str:
        # TensorRT 10 strongly typed runs what the file says: FP16 float parts are what make INT8 pay.
        # TensorRT 8 (--int8 --fp16) picks per layer from an FP32 file.
        return self.spec.high_precision or ("fp16" if self.spec.strongly_typed else "fp32")

    def attention_ok(self, head: int, seq: int) -> tuple[bool, str]:
        ok, why = super().attention_ok(head, seq)
        if not ok:
            return ok, why
        if head not in self.FUSED_HEAD_SIZES:
            return False, f"head size {head} is not one TensorRT fuses in INT8 {self.FUSED_HEAD_SIZES}"
        if seq > self.MAX_FUSED_SEQ:
            return False, f"sequence length {seq} > {self.MAX_FUSED_SEQ}: no fused INT8 attention"
        return True, ""

    def contribution(self):
        """``build_engine.sh`` and the TensorRT engine stage."""
        from ..stages.engine import TENSORRT  # lazy: quantize/ does not import the pipeline's stages

        return TENSORRT

    def write_artifacts(self, work_dir: Path, scales: dict[str, float], method: str) -> dict[str, Path]:
        """TensorRT's legacy calibration cache (``calibration.cache``) beside the scale table."""
        from ..calibration.table import write_trt_cache

        header = "TRT-8501-MinMaxCalibration" if method == "minmax" else "TRT-8501-EntropyCalibration2"
        return {"calibration_cache": write_trt_cache(work_dir / "calibration.cache", scales, header)}


class NpuTarget(QuantTarget):
    """A generic edge NPU: per-tensor everything, uint8 activations when allowed, no float16."""

    kind = TargetKind.npu
    force_symmetric = False
    force_per_tensor = True
    dedicated_pairs = False
    forbid_float16 = True


class CpuTarget(QuantTarget):
    """ONNX Runtime on x86: the layout its QDQ fusions turn into integer kernels.

    Gemm / Conv biases are int32 (scale = activation × weight scale), which ONNX Runtime requires
    to fuse ``QGemm`` (an unfused Q/DQ Gemm dequantizes its weights on every run and is slower
    than float). The recipe's ``asymmetric_activations`` picks uint8 activations (U8S8, ONNX
    Runtime's x86 fast path) and ``reduce_range_weights`` 7-bit weights, without which AVX2 /
    AVX-512 CPUs lacking VNNI saturate ``vpmaddubsw``'s int16 sums.
    """

    kind = TargetKind.cpu
    force_symmetric = False
    dedicated_pairs = False
    int32_bias = True
    runs_in_onnxruntime = True


TARGETS: dict[TargetKind, type[QuantTarget]] = {}
for _cls in (OrinTarget, NpuTarget, CpuTarget):
    if _cls.kind in TARGETS:  # pragma: no cover - registry refuses duplicates
        raise RuntimeError(f"duplicate target {_cls.kind}")
    TARGETS[_cls.kind] = _cls


def get_target(recipe: Recipe) -> QuantTarget:
    """The target object for a recipe's ``target`` kind."""
    return TARGETS[TargetKind(recipe.target)](recipe.quantization)


def check_placement(model: ir.Model | str | Path, target: str | TargetKind) -> list[Violation]:
    """Rule violations of a Q/DQ model (an ``ir.Model`` or a file) for ``target``'s runtime."""
    from ..graph.files import load_model

    m = model if isinstance(model, ir.Model) else load_model(model)
    return TARGETS[TargetKind(target)](QuantizationSpec()).validate(m)
