"""A broken rule as data, and the verdict of a check (Polygraphy's comparator shape: an object with
``__bool__``, rendered into lines, never assembled from log text).

A violation is an **error** (the default: the target refuses or misreads the file; ``vitexport
check`` exits 2) or a **warning** (a lint finding: the file runs, but carries dead weight or hides a
mistake; printed, exit 0). The grading rule of each lint is in :mod:`.lint`.

:meth:`CheckResult.report` is what ``vitexport check`` prints: one line per violation while there are
few, else a summary grouped by rule and hint (a file made for another target breaks hundreds of
times for a handful of reasons: the demo's Orin INT8 file 333 times on the NPU's recipe, 101 of them
one float16 rule); ``vitexport -v check`` prints every line.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from itertools import groupby

import onnx_ir as ir

__all__ = ["Severity", "Violation", "CheckResult", "node_label", "FULL_LIST_MAX", "GROUPS_MAX"]

#: up to this many violations ``vitexport check`` prints one line each; more are summarised by rule
FULL_LIST_MAX = 12
#: a summary shows this many groups (three lines each: the report stays under 40 lines)
GROUPS_MAX = 10
_EXAMPLES = 2  # subjects a group names beside its first


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

    def describe(self, recipe: str | None = None) -> str:
        """``subject problem``, a contract rule naming the recipe (no rule tag, no hint)."""
        where = f" of {recipe}" if recipe and self.rule.startswith("contract.") else ""
        return f"{self.subject} {self.problem}{where}"

    def message(self, artifact: str, recipe: str | None = None) -> str:
        """One line: ``artifact: [warning: ]subject problem [rule]; hint: ...`` (a contract rule names the recipe)."""
        tag = "" if self.rule in self.problem else f" [{self.rule}]"
        level = "" if self.is_error else "warning: "
        return f"{artifact}: {level}{self.describe(recipe)}{tag}; hint: {self.hint}"

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

    def report(self, full: bool = False) -> list[str]:
        """What ``vitexport check`` prints: every line (``full``, or at most :data:`FULL_LIST_MAX`
        violations) and the verdict when it passes; else the violations grouped by rule and hint, each
        group counted, its first subjects named and its hint given once, and one line of what to do."""
        if full or len(self.violations) <= FULL_LIST_MAX:
            return self.lines() + ([self.summary()] if self or len(self.violations) > FULL_LIST_MAX else [])
        groups = _grouped(self.errors) + _grouped(self.warnings)
        out = [f"{self.summary()}; by rule:"]
        for group in groups[:GROUPS_MAX]:
            out += self._group_lines(group)
        if len(groups) > GROUPS_MAX:
            rest = sum(len(g) for g in groups[GROUPS_MAX:])
            out.append(f"  ... and {len(groups) - GROUPS_MAX} more group(s), {rest} violation(s)")
        if not self:
            out.append(f"what to do: follow the hints (a file made for another target rarely passes: export the model "
                       f"for this one, `vitexport export --target {self.target}`, which applies them)")
        out.append(f"`vitexport -v check` lists all {len(self.violations)}, one line each")
        return out

    def _group_lines(self, group: list[Violation]) -> list[str]:
        first = group[0]
        level = "error" if first.is_error else "warning"
        out = [f"  [{first.rule}] {len(group)} {level}(s): {first.describe(self.recipe)}"]
        more = [v.subject for v in group[1:1 + _EXAMPLES]]
        if more:
            rest = len(group) - 1 - len(more)
            out.append(f"    also {', '.join(more)}" + (f" and {rest} more" if rest else ""))
        return out + [f"    hint: {first.hint}"]

    def summary(self) -> str:
        """One line: the verdict, how many rules were checked and how many warnings there are."""
        warned = f" with {len(self.warnings)} warning(s) ({', '.join(sorted({v.rule for v in self.warnings}))})" \
            if self.warnings else ""
        if self:
            return f"{self.artifact}: passes the {len(self.rules)} rules of {self.recipe} ({self.target} target){warned}"
        broken = sorted({v.rule for v in self.errors})
        return (f"{self.artifact}: {len(self.errors)} violation(s) of {self.recipe} ({self.target} target): "
                f"{', '.join(broken)}{warned}")


def _grouped(violations: list[Violation]) -> list[list[Violation]]:
    """Violations grouped by rule and hint (one fix each), in the order the rules ran."""
    order = {key: i for i, key in reversed(list(enumerate((v.rule, v.hint) for v in violations)))}
    ranked = sorted(violations, key=lambda v: order[(v.rule, v.hint)])
    return [list(g) for _, g in groupby(ranked, key=lambda v: (v.rule, v.hint))]
