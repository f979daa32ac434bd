"""The target contract: what the recipe's compiler accepts, checked before an artifact is written.

A violation names the node, its op, the recipe key it breaks and a hint, so a user learns at export
time (not on the device) that, say, ``Erf`` is not on the NPU's op list and that the tanh GELU
approximation avoids it. Checks: the ONNX checker, ``contract.max_opset``, ``contract.static_shapes``,
``contract.allowed_domains``, ``contract.forbidden_ops``, ``contract.allowed_ops`` and
``contract.forbid_float16``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import onnx
from onnx import TensorProto

from ..errors import ContractViolation
from ..recipe import RECIPES_DIR, Recipe
from .opset import default_opset

__all__ = [
    "Violation", "OP_HINTS", "contract_violations", "run_checker", "raise_violations", "check_contract",
    "recipe_label",
]

_STANDARD_DOMAINS = ("", "ai.onnx")
_FLOAT16 = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}

# What to do about an op a target does not take. Keys are op types; ``{max_opset}`` is filled in.
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


@dataclass(frozen=True)
class Violation:
    """One broken rule. ``key`` is the recipe key (``contract.allowed_ops``)."""

    key: str
    subject: str  # "node 'X' (Erf)", "input 'x'", "initializer 'w'"
    problem: str  # "not in contract.allowed_ops"
    hint: str
    node: str | None = None
    op: str | None = None

    def message(self, artifact: str, recipe: str) -> str:
        where = f" of {recipe}" if self.key.startswith("contract.") else ""
        return f"{artifact}: {self.subject} {self.problem}{where}; hint: {self.hint}"


def recipe_label(recipe: Recipe, recipe_path: str | Path | None = None) -> str:
    """``recipes/npu.yaml`` for a shipped recipe, the given path, or ``recipe 'name'``."""
    if recipe_path is not None:
        return str(recipe_path)
    shipped = RECIPES_DIR / f"{recipe.name}.yaml"
    if shipped.is_file():
        return f"{RECIPES_DIR.name}/{shipped.name}"
    return f"recipe '{recipe.name}'"


def _node_label(node: onnx.NodeProto) -> str:
    return f"node '{node.name or (node.output[0] if node.output else '?')}' ({node.op_type})"


def _op_hint(op: str, key: str) -> str:
    hint = OP_HINTS.get(op)
    if hint:
        return hint
    return (f"no known rewrite for {op}; change the model code that produces it, or edit {key} if the "
            f"target's compiler supports it")


def _dynamic_dims(vi: onnx.ValueInfoProto) -> list[str]:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return []
    return [d.dim_param or "?" for d in t.shape.dim if not d.HasField("dim_value") or d.dim_value <= 0]


def _float16_attribute(node: onnx.NodeProto) -> str | None:
    for a in node.attribute:
        if node.op_type == "Cast" and a.name == "to" and a.i in _FLOAT16:
            return f"casts to {_FLOAT16[a.i]}"
        if a.type == onnx.AttributeProto.TENSOR and a.t.data_type in _FLOAT16:
            return f"holds a {_FLOAT16[a.t.data_type]} constant"
    return None


def contract_violations(
    model: onnx.ModelProto,
    recipe: Recipe,
    extra_initializers: Iterable[tuple[str, int]] = (),
) -> list[Violation]:
    """Every contract rule the graph breaks (the ONNX checker is not run here).

    Args:
        model: the graph to check.
        recipe: its ``contract`` section is the rule set.
        extra_initializers: ``(name, data_type)`` of initializers kept outside ``model`` (the
            simplifier holds large weights aside), checked by the dtype rule.
    Returns:
        Violations in graph order: opset first, then inputs, nodes, initializers, values.
    """
    c = recipe.contract
    out: list[Violation] = []
    nodes = list(model.graph.node)

    opset = default_opset(model)
    if opset > c.max_opset:
        # Name a node that needs the newer opset, when one does: that is what to change.
        needs = next((n for n in nodes if n.domain in _STANDARD_DOMAINS and
                      onnx.defs.get_schema(n.op_type, opset, "").since_version > c.max_opset), None)
        subject = f"opset {opset}" + (f" ({_node_label(needs)} needs opset "
                                      f"{onnx.defs.get_schema(needs.op_type, opset, '').since_version})" if needs else "")
        out.append(Violation("contract.max_opset", subject, f"is above contract.max_opset {c.max_opset}",
                             f"export at opset {c.max_opset} (--set export.opset={c.max_opset})",
                             needs.name if needs else None, needs.op_type if needs else None))

    if c.static_shapes:
        for vi in model.graph.input:
            dyn = _dynamic_dims(vi)
            if dyn:
                out.append(Violation("contract.static_shapes", f"input '{vi.name}'",
                                     f"has dynamic dimension(s) {dyn}, against contract.static_shapes",
                                     "export with fixed shapes (--input-shape N,C,H,W)"))
        producers = {o: n for n in nodes for o in n.output}
        for vi in [*model.graph.value_info, *model.graph.output]:
            dyn = _dynamic_dims(vi)
            if dyn:
                node = producers.get(vi.name)
                subject = (f"{_node_label(node)} output '{vi.name}'" if node else f"value '{vi.name}'")
                out.append(Violation("contract.static_shapes", subject,
                                     f"has dynamic dimension(s) {dyn}, against contract.static_shapes",
                                     "shapes that depend on data cannot be fixed by the exporter; "
                                     "remove the data-dependent op from the model",
                                     node.name if node else None, node.op_type if node else None))

    allowed_domains = set(_STANDARD_DOMAINS) | set(c.allowed_domains)
    forbidden = set(c.forbidden_ops)
    allowed = set(c.allowed_ops) if c.allowed_ops is not None else None
    for n in nodes:
        label = _node_label(n)
        if n.domain not in allowed_domains:
            out.append(Violation("contract.allowed_domains", label,
                                 f"is in domain '{n.domain}', not in contract.allowed_domains",
                                 "export without custom-domain ops, or add the domain if the target's "
                                 "runtime implements it", n.name, n.op_type))
        elif n.op_type in forbidden:
            out.append(Violation("contract.forbidden_ops", label, "is in contract.forbidden_ops",
                                 _op_hint(n.op_type, "contract.forbidden_ops"), n.name, n.op_type))
        elif allowed is not None and n.op_type not in allowed:
            out.append(Violation("contract.allowed_ops", label, "not in contract.allowed_ops",
                                 _op_hint(n.op_type, "contract.allowed_ops"), n.name, n.op_type))
        if c.forbid_float16:
            what = _float16_attribute(n)
            if what:
                out.append(Violation("contract.forbid_float16", label, f"{what}, against contract.forbid_float16",
                                     "export the model in float32 (model.float()); the target runs no float16",
                                     n.name, n.op_type))

    if c.forbid_float16:
        fp16_hint = "export the model in float32 (model.float()); the target runs no float16"
        inits = [(t.name, t.data_type) for t in model.graph.initializer] + list(extra_initializers)
        for name, dtype in inits:
            if dtype in _FLOAT16:
                out.append(Violation("contract.forbid_float16", f"initializer '{name}'",
                                     f"is {_FLOAT16[dtype]}, against contract.forbid_float16", fp16_hint))
        for kind, values in (("input", model.graph.input), ("output", model.graph.output),
                             ("value", model.graph.value_info)):
            for vi in values:
                dtype = vi.type.tensor_type.elem_type
                if dtype in _FLOAT16:
                    out.append(Violation("contract.forbid_float16", f"{kind} '{vi.name}'",
                                         f"is {_FLOAT16[dtype]}, against contract.forbid_float16", fp16_hint))
    return out


def _summary(rest: Sequence[Violation]) -> str:
    counts = Counter(f"{v.op or v.key.split('.')[-1]}" for v in rest)
    return ", ".join(f"{k}×{n}" if n > 1 else k for k, n in counts.items())


def raise_violations(violations: Sequence[Violation], recipe: Recipe, recipe_path: str | Path | None,
                     artifact: str) -> None:
    """Raise :class:`ContractViolation` for the first violation, counting the others."""
    if not violations:
        return
    first, rest = violations[0], violations[1:]
    msg = first.message(artifact, recipe_label(recipe, recipe_path))
    if rest:
        msg += f" (+{len(rest)} more: {_summary(rest)})"
    err = ContractViolation(msg)
    err.violations = list(violations)  # type: ignore[attr-defined]
    raise err


def run_checker(model: onnx.ModelProto) -> list[Violation]:
    """The ONNX checker (with shape inference) as a violation list."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return [Violation("onnx.checker", "the graph", f"fails the ONNX checker ({first})",
                          "the exporter or a pass wrote an invalid graph; please report it")]
    return []


def check_contract(
    model: onnx.ModelProto,
    recipe: Recipe,
    recipe_path: str | Path | None = None,
    *,
    artifact: str = "model",
) -> None:
    """Run the ONNX checker and every contract rule of ``recipe`` on ``model``.

    Args:
        model: the graph (with its initializers).
        recipe: the target recipe; its ``contract`` section holds the rules.
        recipe_path: how to name the recipe in messages (default ``recipes/<name>.yaml`` for a
            shipped recipe).
        artifact: how to name the model in messages (e.g. ``model.fp32.onnx``).
    Raises:
        ContractViolation: the first violation, naming node, op, recipe key and a hint, plus a
            count of the others; ``err.violations`` lists them all.
    """
    violations = run_checker(model) + contract_violations(model, recipe)
    raise_violations(violations, recipe, recipe_path, artifact)
