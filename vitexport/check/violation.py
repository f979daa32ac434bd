"""A broken rule as data, and the verdict of a check (Polygraphy's comparator shape: an object with
``__bool__``, rendered into lines, never assembled from log text).

A violation is an **error** (the default: the target refuses or misreads the file; ``vitexport
check`` exits 2) or a **warning** (a lint finding: the file runs, but carries dead weight or hides a
mistake; printed, exit 0). The grading rule of each lint is in :mod:`.lint`.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import onnx_ir as ir

__all__ = ["Severity", "Violation", "CheckResult", "node_label"]


def node_label(node: ir.Node) -> str:
    """``node 'name' (Op)``, naming an unnamed node by its first output."""
    name = node.name or (node.outputs[0].name if node.outputs and node.outputs[0].name else "?")
    return f"node '{name}' ({node.op_type})"


class Severity(str, enum.Enum):
    error = "error"
    warning = "warning"


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
    severity: Severity = Severity.error

    @property
    def is_error(self) -> bool:
        return self.severity == Severity.error

    def message(self, artifact: str, recipe: str | None = None) -> str:
        """One line: ``artifact: [warning: ]subject problem [rule]; hint: ...`` (a contract rule names the recipe)."""
        where = f" of {recipe}" if recipe and self.rule.startswith("contract.") else ""
        tag = "" if self.rule in self.problem else f" [{self.rule}]"
        level = "" if self.is_error else "warning: "
        return f"{artifact}: {level}{self.subject} {self.problem}{where}{tag}; hint: {self.hint}"

    def __str__(self) -> str:
        return self.message("model")


@dataclass
class CheckResult:
    """Every violation of one model against one recipe; true when none is an error (warnings pass).

    Args:
        artifact: how the model is named in messages (its file name).
        recipe: how the recipe is named (``recipes/orin.yaml``).
        target: the recipe's target kind.
        rules: the rule ids checked, in order.
        violations: what broke (errors and warnings), in the order the rules ran.
    """

    artifact: str
    recipe: str
    target: str
    rules: tuple[str, ...]
    violations: list[Violation] = field(default_factory=list)

    def __bool__(self) -> bool:
        return not self.errors

    @property
    def errors(self) -> list[Violation]:
        return [v for v in self.violations if v.is_error]

    @property
    def warnings(self) -> list[Violation]:
        return [v for v in self.violations if not v.is_error]

    def lines(self) -> list[str]:
        """One line per violation (errors first, then warnings), naming node, rule and what to do."""
        return [v.message(self.artifact, self.recipe) for v in self.errors + self.warnings]

    def summary(self) -> str:
        """One line: the verdict, how many rules were checked and how many warnings there are."""
        warned = f" with {len(self.warnings)} warning(s) ({', '.join(sorted({v.rule for v in self.warnings}))})" \
            if self.warnings else ""
        if self:
            return f"{self.artifact}: passes the {len(self.rules)} rules of {self.recipe} ({self.target} target){warned}"
        broken = sorted({v.rule for v in self.errors})
        return (f"{self.artifact}: {len(self.errors)} violation(s) of {self.recipe} ({self.target} target): "
                f"{', '.join(broken)}{warned}")
