"""Annotate: which nodes of a float graph get INT8 inputs, as a :class:`~.spec.QuantPlan`.

The walk is the same for every target: Conv / MatMul / Gemm with a constant float weight are
Linears, and the two batched MatMuls next to a Softmax are attention. What differs per target comes
from the :class:`~vitexport.targets.Target` it is given: the encoding, per-channel weights, and
which attention shapes it quantizes (``Target.attention_ok``: orin's fused INT8 attention).
"""
from __future__ import annotations

from typing import Protocol

import onnx_ir as ir

from ..graph.macs import node_macs
from ..graph.query import attr, const_array, is_const, static_shape
from ..recipe import QuantizationSpec
from .spec import ActSpec, Encoding, NodeKind, NodeSpec, QuantPlan, WeightSpec

__all__ = ["annotate", "attention_role", "AnnotateTarget", "LINEAR_OPS"]


class AnnotateTarget(Protocol):
    """What annotate reads of the :class:`~vitexport.targets.Target` it is handed (a protocol: the
    targets' base module imports this one, and quantize/ never imports a target)."""

    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> QuantizationSpec: ...

    def encoding(self) -> Encoding: ...

    def per_channel(self) -> bool: ...

    def attention_ok(self, head: int, seq: int) -> tuple[bool, str]: ...


LINEAR_OPS = ("MatMul", "Gemm", "Conv")
# ops between QKᵀ and Softmax (scale, mask, bias) and between Softmax and PV (cast, dropout)
_SCORE_OPS = frozenset({"Mul", "Div", "Add", "Where", "Cast", "Identity", "Dropout", "Sub"})
# how far from a batched MatMul its Softmax may sit: scale, bias, mask, and a talking-heads mix (a
# permute, a flatten, the mix, its bias, an unflatten, a permute back) on either side
_SCORE_DEPTH = 10


def _head_mix(node: ir.Node) -> bool:
    """A talking-heads mix (EfficientFormerV2's 1x1 ``talking_head`` convs, CaiT's ``proj_l``/``proj_w``
    Linears over the permuted heads axis): a learned H x H mix of the attention maps across heads,
    still attention's scores (or probabilities), so the walk goes through it. A 1x1 group-1 Conv, a
    MatMul or a Gemm (the Linear as onnxsim writes it) with a constant square weight."""
    if node.op_type not in ("Conv", "MatMul", "Gemm") or len(node.inputs) < 2 or not is_const(node.inputs[1]):
        return False
    shape = static_shape(node.inputs[1])
    if shape is None:
        w = const_array(node.inputs[1])
        shape = None if w is None else tuple(w.shape)
    if shape is None or len(shape) != (4 if node.op_type == "Conv" else 2) or shape[0] != shape[1]:
        return False
    if node.op_type == "Gemm":
        return not attr(node, "transA", 0)
    return node.op_type == "MatMul" or (tuple(shape[2:]) == (1, 1) and attr(node, "group", 1) == 1)


def _through(node: ir.Node) -> bool:
    """Whether the scores (or probabilities) pass ``node`` on their way between a batched MatMul and its
    Softmax: scale/mask/bias ops, a head mix, the Transposes around it and the Reshapes next to it."""
    if node.op_type in _SCORE_OPS or node.op_type == "Transpose" or _head_mix(node):
        return True
    if node.op_type != "Reshape":
        return False
    before = node.inputs[0].producer() if node.inputs[0] is not None else None
    return (before is not None and _head_mix(before)) or any(_head_mix(u.node) for u in node.outputs[0].uses())


def attention_role(node: ir.Node) -> str | None:
    """'pv' if the MatMul's left operand comes from a Softmax, 'qk' if its output reaches one, else None.

    Scale, mask and bias ops (and a talking-heads mix, :func:`_head_mix`) may sit between."""
    v = node.inputs[0]
    for _ in range(_SCORE_DEPTH):
        p = v.producer() if v is not None else None
        if p is None:
            break
        if p.op_type == "Softmax":
            return "pv"
        if not _through(p):
            break
        v = p.inputs[0]
    frontier, depth = list(node.outputs), 0
    while frontier and depth < _SCORE_DEPTH:
        nxt = []
        for value in frontier:
            for use in value.uses():
                if use.node.op_type == "Softmax":
                    return "qk"
                # a bias or mask may be either operand of its Add; a mix reads the scores as its input 0
                if use.node.op_type in _SCORE_OPS or (use.idx == 0 and _through(use.node)):
                    nxt.extend(use.node.outputs)
        frontier, depth = nxt, depth + 1
    return None


def annotate(model: ir.Model, target: AnnotateTarget) -> QuantPlan:
    """Decide which nodes get INT8 inputs (needs static shapes). Never modifies the graph.

    Args:
        model: the float graph, shapes inferred.
        target: the run's target (its encoding, per-channel choice and attention rule).
    Returns:
        The frozen :class:`QuantPlan`; nodes left in float are in ``plan.skipped`` with the reason.
    """
    nodes: list[NodeSpec] = []
    skipped: dict[str, str] = {}
    per_channel = target.per_channel()
    for n in model.graph:
        if n.op_type not in LINEAR_OPS or n.domain not in ("", "ai.onnx"):
            continue
        spec, why = _node(n, per_channel, target)
        if spec is None:
            skipped[n.name] = why
        else:
            nodes.append(spec)
    return QuantPlan(target.name, tuple(nodes), target.encoding(), skipped)


def _node(n: ir.Node, per_channel: bool, target: AnnotateTarget) -> tuple[NodeSpec | None, str]:
    x = n.inputs[0]
    if x is None or x.dtype not in (None, ir.DataType.FLOAT):
        return None, "input is not float32"
    if n.op_type == "MatMul" and not is_const(n.inputs[1]):
        if is_const(x):
            return None, "no constant float weight on a supported input"
        return _attention(n, target)
    spec = _linear(n, per_channel)
    return (spec, "") if spec is not None else (None, "no constant float weight on a supported input")


def _linear(n: ir.Node, per_channel: bool) -> NodeSpec | None:
    w = n.inputs[1]
    if w is None or w.const_value is None or w.const_value.dtype != ir.DataType.FLOAT:
        return None
    wshape = tuple(w.const_value.shape)
    if n.op_type == "Conv":
        axis, kind = 0, NodeKind.conv
    elif n.op_type == "Gemm":
        if attr(n, "transA", 0):
            return None
        axis, kind = (0 if attr(n, "transB", 0) else 1), NodeKind.linear
    else:
        if len(wshape) < 2:
            return None
        axis, kind = len(wshape) - 1, NodeKind.linear
    macs = node_macs(n, wshape)
    return NodeSpec(n.name, n.op_type, kind, (ActSpec(n.inputs[0].name, 0),),
                    WeightSpec(w.name, 1, axis if per_channel else None), macs)


def _attention(n: ir.Node, target: AnnotateTarget) -> tuple[NodeSpec | None, str]:
    a, b = static_shape(n.inputs[0]), static_shape(n.inputs[1])
    if not a or not b or len(a) < 3 or len(b) < 3:
        return None, "activation x activation MatMul of unknown or 2-D shape"
    role = attention_role(n)
    if role is None:
        return None, "activation x activation MatMul that is not attention (no Softmax next to it)"
    seq, head = a[-2], (a[-1] if role == "qk" else b[-1])
    if role == "pv" and not target.spec.quantize_attention_pv:
        return None, "attn·V kept in float (quantization.quantize_attention_pv is off)"
    ok, why = target.attention_ok(head, seq)
    if not ok:
        return None, why
    macs = node_macs(n, b)
    return NodeSpec(n.name, n.op_type, NodeKind.attention,
                    (ActSpec(n.inputs[0].name, 0), ActSpec(n.inputs[1].name, 1)), None, macs), ""
