"""The one checker: the ONNX checker, the recipe's contract, then its target's rules; ``vitexport
check`` adds the lint (:mod:`.lint`, warnings and errors by its grading rule).

The export's contract step (``simplify_onnx``), the quantizer's check of what it wrote
(``Target.validate``) and ``vitexport check`` all run these rules; only what they are given
differs (a proto already in memory, a file). Each is handed the run's
:class:`~vitexport.targets.Target`, whose ``recipe`` holds the contract.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import onnx
import onnx_ir as ir

from ..graph.files import load_model
from ..recipe import Recipe
from .contract import contract_violations
from .rules import RuntimeRules
from .lint import LINT_RULES, lint_model, value_info_names
from .violation import CheckResult, Violation

__all__ = ["CheckTarget", "run_checker", "model_violations", "check_model", "check_file", "recipe_label",
           "rules_checked"]


class CheckTarget(Protocol):
    """What the checker reads of the target it is handed (``vitexport.targets.Target`` satisfies it; a
    protocol, so that check/ never imports a target): its name, recipe, recipe file and runtime rules."""

    @property
    def name(self) -> str: ...

    @property
    def recipe(self) -> Recipe: ...

    def recipe_file(self) -> Path: ...

    def rules(self) -> RuntimeRules: ...


def recipe_label(target: CheckTarget, recipe_path: str | Path | None = None) -> str:
    """How messages name the run's recipe: the given path, ``recipes/<name>.yaml`` for the target's
    own recipe (as the repository's ``recipes/`` shows it), else ``recipe 'name'``."""
    if recipe_path is not None:
        return str(recipe_path)
    recipe = target.recipe
    if recipe.name == target.name and target.recipe_file().is_file():
        return f"recipes/{target.recipe_file().name}"
    return f"recipe '{recipe.name}'"


def run_checker(model: onnx.ModelProto | str | Path) -> list[Violation]:
    """The ONNX checker with full shape inference, as a violation list.

    Args:
        model: a proto, or a file (read by onnx itself: external data and files over 2 GB work).
    """
    try:
        onnx.checker.check_model(model if isinstance(model, onnx.ModelProto) else str(model), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return [Violation("onnx.checker", "the graph", f"fails the ONNX checker ({first})",
                          "the exporter, a pass or an editor wrote an invalid graph; fix the node it names")]
    return []


def _contract_rules(recipe: Recipe) -> tuple[str, ...]:
    c = recipe.contract
    keys = ["max_opset", "static_shapes" if c.static_shapes else "", "allowed_domains",
            "forbidden_ops" if c.forbidden_ops else "", "allowed_ops" if c.allowed_ops is not None else "",
            "forbid_float16" if c.forbid_float16 else ""]
    return tuple(f"contract.{k}" for k in keys if k)


def _skipped(target: CheckTarget) -> set[str]:
    # a target's own float16 rule repeats the recipe's contract.forbid_float16: report it once, by the key
    own = target.rules().FLOAT16_RULE
    return {own} if own and target.recipe.contract.forbid_float16 else set()


def rules_checked(target: CheckTarget) -> tuple[str, ...]:
    """The rule ids a check for ``target`` runs, in order (the lint's last)."""
    recipe = target.recipe
    rules = target.rules().RULES
    return ("onnx.checker", *_contract_rules(recipe), *(r for r in rules if r not in _skipped(target)), *LINT_RULES)


def model_violations(model: ir.Model, target: CheckTarget) -> list[Violation]:
    """The contract's violations, then the target's (the ONNX checker is not run here)."""
    recipe = target.recipe
    return contract_violations(model, recipe.contract) + target.rules().violations(model, skip=_skipped(target))


def check_model(model: ir.Model, target: CheckTarget, *, artifact: str = "model",
                recipe_path: str | Path | None = None, checker: list[Violation] | None = None,
                value_info: list[str] | tuple[str, ...] = ()) -> CheckResult:
    """Every rule of ``target`` and its recipe on an in-memory model, then the lint.

    Args:
        model: the graph.
        target: the target whose rules apply; its recipe's contract too.
        artifact: how to name the model in messages.
        recipe_path: how to name the recipe (default ``recipes/<name>.yaml`` for a target's own).
        checker: the ONNX checker's verdict when the caller ran it (on a proto it holds); None
            runs it on ``model``.
        value_info: the file's ``value_info`` names, for the dead-entry lint.
    Returns:
        A :class:`CheckResult` (true when no violation is an error: lint warnings pass).
    """
    if checker is None:
        checker = run_checker(ir.to_proto(model))
    return CheckResult(artifact, recipe_label(target, recipe_path), target.name, rules_checked(target),
                       checker + model_violations(model, target) + lint_model(model, value_info=value_info))


def check_file(path: str | Path, target: CheckTarget, *, recipe_path: str | Path | None = None) -> CheckResult:
    """Every rule of ``target`` and its recipe on the ONNX file ``path`` (its ``.data`` file read where needed).

    Raises:
        BadInput: ``path`` is missing or is not an ONNX model.
    """
    path = Path(path)
    model = load_model(path)
    return check_model(model, target, artifact=path.name, recipe_path=recipe_path, checker=run_checker(path),
                       value_info=value_info_names(path))
