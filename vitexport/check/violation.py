"""A broken rule as data, and the verdict of a check (Polygraphy's comparator shape: an object with
``__bool__``, rendered into lines, never assembled from log text)."""
from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir

__all__ = ["Violation", "CheckResult", "node_label"]


def node_label(node: ir.Node) -> str:
    """``node 'name' (Op)``, naming an unnamed node by its first output."""
    name = node.name or (node.outputs[0].name if node.outputs and node.outputs[0].name else "?")
    return f"node '{name}' ({node.op_type})"


@dataclass(frozen=True)
class Violation:
    """One broken rule.

    ``rule`` names it: the recipe key for a contract rule (``contract.allowed_ops``), else the
    target rule's id (``orin.int8``, ``tensorrt.ops``, ``qdq.scale``; see
    :data:`vitexport.check.RULES`).
    """

    rule: str
    subject: str  # "node 'X' (Erf)", "input 'x'", "initializer 'w'"
    problem: str  # "not in contract.allowed_ops"
    hint: str
    node: str | None = None
    op: str | None = None

    def message(self, artifact: str, recipe: str | None = None) -> str:
        """One line: ``artifact: subject problem [rule]; hint: ...`` (a contract rule names the recipe)."""
        where = f" of {recipe}" if recipe and self.rule.startswith("contract.") else ""
        tag = "" if self.rule in self.problem else f" [{self.rule}]"
        return f"{artifact}: {self.subject} {self.problem}{where}{tag}; hint: {self.hint}"

    def __str__(self) -> str:
        return self.message("model")


@dataclass
class CheckResult:
    """Every violation of one model against one recipe; true when there is none.

    Args:
        artifact: how the model is named in messages (its file name).
        recipe: how the recipe is named (``recipes/orin.yaml``).
        target: the recipe's target kind.
        rules: the rule ids checked, in order.
        violations: what broke, in the order the rules ran.
    """

    artifact: str
    recipe: str
    target: str
    rules: tuple[str, ...]
    violations: list[Violation] = field(default_factory=list)

    def __bool__(self) -> bool:
        return not self.violations

    def lines(self) -> list[str]:
        """One line per violation, naming node, rule and what to do."""
        return [v.message(self.artifact, self.recipe) for v in self.violations]

    def summary(self) -> str:
        """One line: the verdict and how many rules were checked."""
        if self:
            return f"{self.artifact}: passes the {len(self.rules)} rules of {self.recipe} ({self.target} target)"
        broken = sorted({v.rule for v in self.violations})
        return (f"{self.artifact}: {len(self.violations)} violation(s) of {self.recipe} ({self.target} target): "
                f"{', '.join(broken)}")
