"""The export's contract step: the checker of :mod:`vitexport.check` (ONNX checker, the recipe's
contract, its target's rules), raised as one :class:`~vitexport.errors.ContractViolation` before
an artifact is written, so a user learns at export time (not on the device) what the target
refuses and what to change.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Sequence

import onnx
import onnx_ir as ir

from ..check import CheckTarget, Violation, model_violations, recipe_label, run_checker
from ..errors import ContractViolation

__all__ = ["raise_violations", "check_contract"]


def _summary(rest: Sequence[Violation]) -> str:
    counts = Counter(f"{v.op or v.rule.split('.')[-1]}" for v in rest)
    return ", ".join(f"{k}×{n}" if n > 1 else k for k, n in counts.items())


def raise_violations(violations: Sequence[Violation], target: CheckTarget, recipe_path: str | Path | None,
                     artifact: str) -> None:
    """Raise :class:`ContractViolation` for the first violation, counting the others.

    Raises:
        ContractViolation: when ``violations`` is not empty; ``err.violations`` lists them all.
    """
    if not violations:
        return
    first, rest = violations[0], violations[1:]
    msg = first.message(artifact, recipe_label(target, recipe_path))
    if rest:
        msg += f" (+{len(rest)} more: {_summary(rest)})"
    err = ContractViolation(msg)
    err.violations = list(violations)  # type: ignore[attr-defined]
    raise err


def check_contract(
    model: onnx.ModelProto,
    target: CheckTarget,
    recipe_path: str | Path | None = None,
    *,
    artifact: str = "model",
) -> None:
    """Run the ONNX checker, every contract rule of the target's recipe and the target's rules on ``model``.

    Args:
        model: the graph (with its initializers).
        target: the run's target (its rules; its recipe's ``contract`` section).
        recipe_path: how to name the recipe in messages (default ``recipes/<name>.yaml`` for a
            target's own recipe).
        artifact: how to name the model in messages (e.g. ``model.fp32.onnx``).
    Raises:
        ContractViolation: the first violation, naming node, op, rule and a hint, plus a count of
            the others; ``err.violations`` lists them all.
    """
    violations = run_checker(model) + model_violations(ir.from_proto(model), target)
    raise_violations(violations, target, recipe_path, artifact)
