"""Will the target take this ONNX file? The ONNX checker, the recipe's contract and the target's
runtime rules, as data (``Violation`` / ``CheckResult``), for any file: vitexport's own or not.

``vitexport check MODEL.onnx --target T`` (:func:`vitexport.api.check`) runs :func:`check_file`;
the export's contract step and the quantizer's validation run the same rules. Rule ids:
``onnx.checker``; ``onnx.types`` (operand types against the schemas, :mod:`.types`); ``contract.*``
(the recipe's keys, :mod:`.contract`); ``qdq.*``, ``orin.*``,
``tensorrt.*``, ``npu.*`` (:mod:`.target_rules`, TensorRT's operators in :mod:`.tensorrt_ops`).
"""
from .checker import check_file, check_model, model_violations, recipe_label, rules_checked, run_checker
from .contract import OP_HINTS, contract_violations, float16_violations
from .target_rules import TARGET_RULES, CpuRules, NpuRules, OrinRules, TargetRules, target_rules
from .tensorrt_ops import TENSORRT_8_6, TENSORRT_10_3, TensorRTParser, tensorrt_parser
from .violation import CheckResult, Violation

__all__ = [
    "Violation",
    "CheckResult",
    "check_file",
    "check_model",
    "model_violations",
    "run_checker",
    "recipe_label",
    "rules_checked",
    "contract_violations",
    "float16_violations",
    "OP_HINTS",
    "TargetRules",
    "OrinRules",
    "NpuRules",
    "CpuRules",
    "TARGET_RULES",
    "target_rules",
    "TensorRTParser",
    "TENSORRT_10_3",
    "TENSORRT_8_6",
    "tensorrt_parser",
]
