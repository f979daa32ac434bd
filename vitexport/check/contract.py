"""The recipe's ``contract`` rules: what the target's compiler accepts, whatever wrote the graph.

``contract.max_opset``, ``contract.static_shapes``, ``contract.allowed_domains``,
``contract.forbidden_ops``, ``contract.allowed_ops`` and ``contract.forbid_float16``, checked on
an ``ir.Model`` (weights stay where they are: no rule reads a weight's bytes). A violation names the
node, its op, the recipe key and a hint, so a user learns that, say, ``Erf`` is not on the NPU's op
list and that the tanh GELU approximation avoids it.
"""
from __future__ import annotations

from typing import Iterator

import onnx
import onnx_ir as ir

from ..graph.query import opset_version
from ..recipe import ContractSpec
from .violation import Violation, node_label

__all__ = ["OP_HINTS", "STANDARD_DOMAINS", "FLOAT16_HINT", "contract_violations", "float16_violations", "op_hint",
           "all_nodes"]

STANDARD_DOMAINS = ("", "ai.onnx")
FLOAT16_HINT = "export the model in float32 (model.float()); the target runs no float16"
_FLOAT16 = {ir.DataType.FLOAT16: "float16", ir.DataType.BFLOAT16: "bfloat16"}

# What to do about an op a target does not take. Keys are op types.
OP_HINTS: dict[str, str] = {
    "Erf": "use the tanh GELU approximation (--set export.gelu_approximation=tanh; it moves GELU by up "
           "to 5e-4, so parity.export_onnx may need loosening)",
    "Gelu": "export below opset 20 (GELU becomes Erf) or use the tanh GELU approximation "
            "(--set export.gelu_approximation=tanh)",
    "LayerNormalization": "decompose LayerNorm (--set export.decompose_layernorm=true)",
    "Pow": "decompose LayerNorm with vitexport (--set export.decompose_layernorm=true), which squares "
           "with Mul; elsewhere write x*x instead of x**2 in the model",
    "Einsum": "write einsum as MatMul (--set export.einsum_as_matmul=true); equations with repeated "
              "or '...' indices need rewriting in the model",
    "Abs": "the float16-safe LayerNorm uses Abs/ReduceMax/Max/ReduceSum; a target without float16 can "
           "set --set export.fp16_safe_layernorm=false",
    "Neg": "rotary position embeddings (EVA-02) negate half the channels; add Neg to "
           "contract.allowed_ops if the compiler has it, else the model must write -x as x * -1",
    "Attention": "write attention as MatMul/Softmax/MatMul (--set export.explicit_attention=true)",
    "Trilu": "a causal mask: give the model a precomputed mask instead of is_causal",
}
OP_HINTS["ReduceMax"] = OP_HINTS["Max"] = OP_HINTS["Abs"]
OP_HINTS["ReduceSum"] = OP_HINTS["Abs"]


def op_hint(op: str, where: str) -> str:
    """The known rewrite for ``op``, else what to change (``where`` names the list that refused it)."""
    hint = OP_HINTS.get(op)
    if hint:
        return hint
    return (f"no known rewrite for {op}; change the model code that produces it, or edit {where} if the "
            f"target's compiler supports it")


def all_nodes(model: ir.Model) -> Iterator[ir.Node]:
    """Every node, those in If / Loop / Scan bodies included, in graph order."""
    return iter(ir.traversal.RecursiveGraphIterator(model.graph))


def _dynamic_dims(value: ir.Value) -> list[str]:
    if value.shape is None:
        return []
    return [str(d.value) if isinstance(d, ir.SymbolicDim) and d.value else "?"
            for d in value.shape if not (isinstance(d, int) and d > 0)]


def _opset(model: ir.Model, c: ContractSpec) -> list[Violation]:
    opset = opset_version(model)
    if opset <= c.max_opset:
        return []

    def since(n: ir.Node) -> int:
        try:
            return onnx.defs.get_schema(n.op_type, opset, "").since_version
        except onnx.defs.SchemaError:  # not a standard op: the ONNX checker says so
            return 0

    # Name a node that needs the newer opset, when one does: that is what to change.
    needs = next((n for n in model.graph if n.domain in STANDARD_DOMAINS and since(n) > c.max_opset), None)
    subject = f"opset {opset}" + (f" ({node_label(needs)} needs opset {since(needs)})" if needs else "")
    return [Violation("contract.max_opset", subject, f"is above contract.max_opset {c.max_opset}",
                      f"export at opset {c.max_opset} (--set export.opset={c.max_opset})",
                      needs.name if needs else None, needs.op_type if needs else None)]


def _static_shapes(model: ir.Model) -> list[Violation]:
    out: list[Violation] = []
    for v in model.graph.inputs:
        dyn = _dynamic_dims(v)
        if dyn:
            out.append(Violation("contract.static_shapes", f"input '{v.name}'",
                                 f"has dynamic dimension(s) {dyn}, against contract.static_shapes",
                                 "export with fixed shapes (--input-shape N,C,H,W)"))
    for n in model.graph:
        for v in n.outputs:
            dyn = _dynamic_dims(v)
            if dyn:
                out.append(Violation("contract.static_shapes", f"{node_label(n)} output '{v.name}'",
                                     f"has dynamic dimension(s) {dyn}, against contract.static_shapes",
                                     "shapes that depend on data cannot be fixed by the exporter; "
                                     "remove the data-dependent op from the model", n.name, n.op_type))
    return out


def _ops(model: ir.Model, c: ContractSpec) -> list[Violation]:
    out: list[Violation] = []
    allowed_domains = set(STANDARD_DOMAINS) | set(c.allowed_domains)
    forbidden = set(c.forbidden_ops)
    allowed = set(c.allowed_ops) if c.allowed_ops is not None else None
    for n in all_nodes(model):
        label = node_label(n)
        if n.domain not in allowed_domains:
            out.append(Violation("contract.allowed_domains", label,
                                 f"is in domain '{n.domain}', not in contract.allowed_domains",
                                 "export without custom-domain ops, or add the domain if the target's "
                                 "runtime implements it", n.name, n.op_type))
        elif n.op_type in forbidden:
            out.append(Violation("contract.forbidden_ops", label, "is in contract.forbidden_ops",
                                 op_hint(n.op_type, "contract.forbidden_ops"), n.name, n.op_type))
        elif allowed is not None and n.op_type not in allowed:
            out.append(Violation("contract.allowed_ops", label, "not in contract.allowed_ops",
                                 op_hint(n.op_type, "contract.allowed_ops"), n.name, n.op_type))
    return out


def _float16_attribute(node: ir.Node) -> str | None:
    for a in node.attributes.values():
        if node.op_type == "Cast" and a.name == "to" and ir.DataType(a.value) in _FLOAT16:
            return f"casts to {_FLOAT16[ir.DataType(a.value)]}"
        if a.type == ir.AttributeType.TENSOR and a.value.dtype in _FLOAT16:
            return f"holds a {_FLOAT16[a.value.dtype]} constant"
    return None


def float16_violations(model: ir.Model, rule: str) -> list[Violation]:
    """Every float16 / bfloat16 Cast, constant, initializer, input, output and value, as ``rule``."""
    against = f", against {rule}"
    out: list[Violation] = []
    for n in all_nodes(model):
        what = _float16_attribute(n)
        if what:
            out.append(Violation(rule, node_label(n), what + against, FLOAT16_HINT, n.name, n.op_type))
    seen: set[str] = set()
    named = [("initializer", v) for v in model.graph.initializers.values()]
    named += [("input", v) for v in model.graph.inputs] + [("output", v) for v in model.graph.outputs]
    named += [("value", v) for n in model.graph for v in n.outputs]
    for kind, v in named:
        if v.dtype in _FLOAT16 and v.name not in seen:
            seen.add(v.name)
            out.append(Violation(rule, f"{kind} '{v.name}'", f"is {_FLOAT16[v.dtype]}{against}", FLOAT16_HINT))
    return out


def contract_violations(model: ir.Model, contract: ContractSpec) -> list[Violation]:
    """Every ``contract`` rule the graph breaks (the ONNX checker is not run here).

    Args:
        model: the graph to check.
        contract: the recipe's ``contract`` section.
    Returns:
        Violations in order: opset, static shapes (inputs, then node outputs), ops, float16.
    """
    out = _opset(model, contract)
    if contract.static_shapes:
        out += _static_shapes(model)
    out += _ops(model, contract)
    if contract.forbid_float16:
        out += float16_violations(model, "contract.forbid_float16")
    return out
