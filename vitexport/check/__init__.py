"""Will the target take this ONNX file? The ONNX checker, the recipe's contract and the target's
runtime rules, as data (``Violation`` / ``CheckResult``), for any file: vitexport's own or not.

``vitexport check MODEL.onnx --target T`` (:func:`vitexport.api.check`) runs :func:`check_file`;
the export's contract step and the quantizer's validation run the same rules. Rule ids:
``onnx.checker``; ``onnx.types`` (operand types against the schemas, :mod:`.types`); ``contract.*``
(the recipe's keys, :mod:`.contract`); ``qdq.*`` (the rules every target shares, :mod:`.rules`) and
the target's own (its ``Target.rules()``, in its module under :mod:`vitexport.targets`); ``lint.*``
(:mod:`.lint`: dead tensors, names, float64, Q/DQ that does nothing; warnings or errors, the same for
every target). This package is handed the run's target and names none.
"""
from .checker import CheckTarget, check_file, check_model, model_violations, recipe_label, rules_checked, run_checker
from .contract import OP_HINTS, contract_violations, float16_violations
from .lint import LINT_RULES, lint_model
from .rules import RuntimeRules
from .violation import CheckResult, Severity, Violation

__all__ = [
    "CheckTarget",
    "Violation",
    "Severity",
    "CheckResult",
    "LINT_RULES",
    "lint_model",
    "check_file",
    "check_model",
    "model_violations",
    "run_checker",
    "recipe_label",
    "rules_checked",
    "contract_violations",
    "float16_violations",
    "OP_HINTS",
    "RuntimeRules",
]
