"""What a target decides, as frozen data (torchao pt2e's split: annotate → calibrate → convert).

A target *annotates* a float graph into a :class:`QuantPlan`: one :class:`NodeSpec` per node whose
inputs run in INT8, naming each activation input (calibrated) and the weight (quantized offline),
plus the :class:`Encoding` every Q/DQ pair of the plan follows. Calibration measures the plan's
tensors; conversion writes the Q/DQ. The plan is immutable: the fallback derives smaller plans
with :meth:`QuantPlan.without`, never edits one.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Mapping

__all__ = ["NodeKind", "ActSpec", "WeightSpec", "NodeSpec", "Encoding", "QuantPlan"]


class NodeKind(str, enum.Enum):
    """What a quantized node is: a Linear (MatMul/Gemm with a constant weight), a Conv, or one of
    attention's two batched MatMuls (both inputs activations)."""

    linear = "linear"
    conv = "conv"
    attention = "attention"


@dataclass(frozen=True)
class ActSpec:
    """Activation ``tensor`` feeding input ``index`` of the node."""

    tensor: str
    index: int


@dataclass(frozen=True)
class WeightSpec:
    """A constant weight at input ``index``: quantized per channel along ``axis`` (None: per tensor)."""

    initializer: str
    index: int
    axis: int | None


@dataclass(frozen=True)
class NodeSpec:
    """One node whose inputs run in INT8, and its multiply-accumulates (for the float-share report)."""

    node: str
    op_type: str
    kind: NodeKind
    acts: tuple[ActSpec, ...]
    weight: WeightSpec | None = None
    macs: int = 0


@dataclass(frozen=True)
class Encoding:
    """How Q/DQ is written for a target.

    Attributes:
        symmetric: int8 activations with zero point 0 (else uint8 with a zero point).
        dedicated_pairs: one Q/DQ pair per consumer (TensorRT fuses a pair into its one consumer)
            rather than one shared pair per tensor.
        int32_bias: Gemm/Conv biases as int32 (ONNX Runtime's QGemm fusion needs them).
        weight_qmax: largest int8 weight magnitude (63: 7-bit weights for CPUs without VNNI).
        symmetric_attention: where activations are uint8 with a zero point, an attention MatMul's two-sided
            inputs are int8 with zero point 0 (q, k, v; the probabilities, one-sided, stay uint8), and the second
            input (k, v), the signed side of an integer kernel, within ``weight_qmax`` as a weight.
    """

    symmetric: bool = True
    dedicated_pairs: bool = True
    int32_bias: bool = False
    weight_qmax: int = 127
    symmetric_attention: bool = False


@dataclass(frozen=True)
class QuantPlan:
    """What a target decided for one graph."""

    target: str
    nodes: tuple[NodeSpec, ...]
    encoding: Encoding
    skipped: Mapping[str, str] = field(default_factory=dict)

    def tensors(self) -> list[str]:
        """Activation tensors to calibrate, each once, in graph order."""
        seen: dict[str, None] = {}
        for n in self.nodes:
            for a in n.acts:
                seen.setdefault(a.tensor, None)
        return list(seen)

    def node(self, name: str) -> NodeSpec | None:
        return next((n for n in self.nodes if n.node == name), None)

    def without(self, names: set[str] | frozenset[str], reason: str = "kept in float (fallback)") -> "QuantPlan":
        """The same plan with the nodes ``names`` kept in float, for ``reason``."""
        kept = tuple(n for n in self.nodes if n.node not in names)
        dropped = {n.node: reason for n in self.nodes if n.node in names}
        return replace(self, nodes=kept, skipped={**self.skipped, **dropped})

    @property
    def total_macs(self) -> int:
        return sum(n.macs for n in self.nodes)
