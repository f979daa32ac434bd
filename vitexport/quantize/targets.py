"""Where Q/DQ goes, per target: the rules are code in the target classes, not string flags.

A target *annotates* a float graph (pt2e's split): it returns a :class:`QuantPlan` naming each node
whose inputs become INT8, which of its inputs are activations (observed during calibration) and
which is a weight (quantized offline, per channel or per tensor), and how activations are encoded.
Calibration measures the plan's tensors; :mod:`vitexport.quantize.convert` writes the Q/DQ.

Rules by target:

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

from dataclasses import dataclass, field

import onnx

from ..recipe import QuantizationSpec, Recipe, TargetKind
from .graph import GraphIndex

__all__ = [
    "ActInput",
    "WeightInput",
    "QuantNode",
    "QuantPlan",
    "QuantTarget",
    "OrinTarget",
    "NpuTarget",
    "CpuTarget",
    "TARGETS",
    "get_target",
]

_LINEAR_OPS = ("MatMul", "Gemm", "Conv")
# ops between QKᵀ and Softmax (scale, mask, bias) and between Softmax and PV (cast, dropout)
_SCORE_OPS = frozenset({"Mul", "Div", "Add", "Where", "Cast", "Identity", "Dropout", "Sub"})


@dataclass(frozen=True)
class ActInput:
    """An activation input of a quantized node: ``tensor`` feeds input ``index`` of ``node``."""

    node: str
    index: int
    tensor: str


@dataclass(frozen=True)
class WeightInput:
    """A constant weight input; ``axis`` is the per-channel axis (None: per tensor)."""

    node: str
    index: int
    initializer: str
    axis: int | None


@dataclass
class QuantNode:
    """A node whose inputs run in INT8. ``kind``: ``linear`` | ``conv`` | ``attention``."""

    name: str
    op_type: str
    kind: str
    acts: list[ActInput]
    weight: WeightInput | None = None
    macs: int = 0


@dataclass
class QuantPlan:
    """What a target decided for one graph, plus how to encode it."""

    target: str
    nodes: list[QuantNode]
    skipped: dict[str, str] = field(default_factory=dict)
    symmetric_activations: bool = True
    per_channel_weights: bool = True
    dedicated_pairs: bool = True
    forbid_float16: bool = False
    int32_bias: bool = False
    weight_qmax: int = 127

    def tensors(self) -> list[str]:
        """Activation tensors to calibrate, each once, in graph order."""
        seen: dict[str, None] = {}
        for n in self.nodes:
            for a in n.acts:
                seen.setdefault(a.tensor, None)
        return list(seen)

    def without(self, names: set[str] | frozenset[str]) -> "QuantPlan":
        """The same plan with ``names`` kept in float."""
        return QuantPlan(
            self.target, [n for n in self.nodes if n.name not in names],
            {**self.skipped, **{n: "kept in float (fallback)" for n in names}},
            self.symmetric_activations, self.per_channel_weights, self.dedicated_pairs, self.forbid_float16,
            self.int32_bias, self.weight_qmax,
        )


def _numel(shape: tuple[int, ...] | None) -> int:
    if not shape or any(d <= 0 for d in shape):
        return 0
    n = 1
    for d in shape:
        n *= d
    return n


class QuantTarget:
    """Base: the rules common to all targets. Subclasses override the class attributes / hooks."""

    kind: TargetKind
    #: symmetric (int8, zero point 0) activations regardless of the recipe
    force_symmetric: bool = True
    #: per-tensor weights regardless of the recipe
    force_per_tensor: bool = False
    dedicated_pairs: bool = False
    forbid_float16: bool = False
    #: store Gemm / Conv biases as int32 (scale = activation scale × weight scale) so ONNX Runtime
    #: fuses QGemm / QLinearConv; TensorRT wants float biases
    int32_bias: bool = False
    #: ONNX Runtime's fused integer kernels are this target's runtime, so parity is measured through
    #: them; other targets are measured with float Q/DQ semantics (what TensorRT / an NPU computes)
    runs_in_onnxruntime: bool = False

    def __init__(self, spec: QuantizationSpec):
        self.spec = spec

    # --- hooks ------------------------------------------------------------------------------------
    def contribution(self):
        """Files and stages this target adds to the pipeline (a ``vitexport.stages.Contribution``), or None."""
        return None

    def symmetric_activations(self) -> bool:
        return self.force_symmetric or not self.spec.asymmetric_activations

    def per_channel(self) -> bool:
        return self.spec.per_channel_weights and not self.force_per_tensor

    def attention_ok(self, head: int, seq: int) -> tuple[bool, str]:
        """Whether an attention batched MatMul with this head size / sequence length is quantized."""
        if not self.spec.quantize_attention_matmuls:
            return False, "quantization.quantize_attention_matmuls is off"
        return True, ""

    # --- annotate ---------------------------------------------------------------------------------
    def annotate(self, index: GraphIndex) -> QuantPlan:
        """Decide which nodes get INT8 inputs. Never modifies the graph."""
        nodes: list[QuantNode] = []
        skipped: dict[str, str] = {}
        per_channel = self.per_channel()
        for n in index.nodes:
            if n.op_type not in _LINEAR_OPS:
                continue
            q = self._linear(index, n, per_channel) if n.op_type != "MatMul" or index.is_const(n.input[1]) else None
            if q is None and n.op_type == "MatMul" and not index.is_const(n.input[0]) and not index.is_const(n.input[1]):
                q, why = self._attention(index, n)
                if q is None:
                    skipped[n.name] = why
                    continue
            if q is None:
                skipped[n.name] = "no constant float weight on a supported input"
                continue
            if index.elem_type(n.input[0]) not in (None, onnx.TensorProto.FLOAT):
                skipped[n.name] = "input is not float32"
                continue
            nodes.append(q)
        return QuantPlan(
            self.kind.value, nodes, skipped, self.symmetric_activations(), per_channel, self.dedicated_pairs,
            self.forbid_float16, self.int32_bias, 63 if self.spec.reduce_range_weights else 127,
        )

    def _linear(self, index: GraphIndex, n: onnx.NodeProto, per_channel: bool) -> QuantNode | None:
        if n.op_type == "Conv":
            w = n.input[1]
            if w not in index.initializers:
                return None
            axis = 0
            macs = _numel(index.shape(n.output[0])) * _numel(index.shape(w)[1:])
            kind = "conv"
        elif n.op_type == "Gemm":
            if index.attr(n, "transA", 0):
                return None
            w = n.input[1]
            if w not in index.initializers:
                return None
            axis = 0 if index.attr(n, "transB", 0) else 1
            shp = index.shape(w)
            macs = _numel(index.shape(n.output[0])) * (shp[1] if axis == 0 else shp[0])
            kind = "linear"
        else:  # MatMul with a constant right operand
            w = n.input[1]
            if w not in index.initializers:
                return None
            shp = index.shape(w)
            if len(shp) < 2:
                return None
            axis = len(shp) - 1
            macs = _numel(index.shape(n.output[0])) * shp[-2]
            kind = "linear"
        if index.initializers[w].data_type != onnx.TensorProto.FLOAT:
            return None
        return QuantNode(
            n.name, n.op_type, kind, [ActInput(n.name, 0, n.input[0])],
            WeightInput(n.name, 1, w, axis if per_channel else None), macs,
        )

    def _attention(self, index: GraphIndex, n: onnx.NodeProto) -> tuple[QuantNode | None, str]:
        a, b = index.shape(n.input[0]), index.shape(n.input[1])
        if not a or not b or len(a) < 3 or len(b) < 3:
            return None, "activation x activation MatMul of unknown or 2-D shape"
        role = _attention_role(index, n)
        if role is None:
            return None, "activation x activation MatMul that is not attention (no Softmax next to it)"
        seq = a[-2]
        head = a[-1] if role == "qk" else b[-1]
        ok, why = self.attention_ok(head, seq)
        if not ok:
            return None, why
        macs = _numel(index.shape(n.output[0])) * a[-1]
        return QuantNode(n.name, n.op_type, "attention", [ActInput(n.name, 0, n.input[0]), ActInput(n.name, 1, n.input[1])],
                         None, macs), ""


def _attention_role(index: GraphIndex, n: onnx.NodeProto) -> str | None:
    """'pv' if the left operand comes from a Softmax, 'qk' if the output reaches one, else None."""
    t = n.input[0]
    for _ in range(4):
        p = index.producer.get(t)
        if p is None:
            break
        if p.op_type == "Softmax":
            return "pv"
        if p.op_type not in _SCORE_OPS:
            break
        t = p.input[0]
    frontier, depth = [n.output[0]], 0
    while frontier and depth < 6:
        nxt = []
        for t in frontier:
            for c, _ in index.consumers.get(t, []):
                if c.op_type == "Softmax":
                    return "qk"
                if c.op_type in _SCORE_OPS:
                    nxt.extend(c.output)
        frontier, depth = nxt, depth + 1
    return None


class OrinTarget(QuantTarget):
    """TensorRT 8.6 / 10 on Jetson Orin: explicit, symmetric, strongly typed Q/DQ."""

    kind = TargetKind.orin
    force_symmetric = True  # TensorRT rejects a non-zero zero point
    dedicated_pairs = True  # TensorRT fuses a Q/DQ pair into its one consumer
    #: fused INT8 multi-head attention (TensorRT's MHA fusion) needs these head sizes and ≤ 512 tokens
    FUSED_HEAD_SIZES = (16, 32, 64)
    MAX_FUSED_SEQ = 512

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
    AVX-512 CPUs lacking VNNI saturate ``vpmaddubsw``'s int16 sums (measured here: fused
    per-channel U8S8 drifted to cosine 0.995 of its own float Q/DQ semantics).
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
