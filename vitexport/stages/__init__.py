"""The pipeline's stages: torch passes → ONNX export → simplify → INT8 → what the target adds.

Each stage is a small object following the :class:`Stage` protocol (name, enabled for a recipe,
content key, run → artifacts, runner for its parity check); :func:`vitexport.pipeline.run_pipeline`
is the one loop that times, meters, gates, records and resumes them. A target adds files and stages
through :meth:`vitexport.targets.Target.contribution` (orin: ``build_engine.sh`` and the TensorRT
engine stage, defined with the target); this package is handed the run's target and names none.
"""
from __future__ import annotations


from ..recipe import PASS_STAGES
from .base import (
    FP32_ONNX,
    INT8_ONNX,
    RAW_ONNX,
    ArtifactWriter,
    Contribution,
    RunContext,
    RunTarget,
    Stage,
    StageOutput,
    StageSkipped,
    content_key,
    module_hash,
    trim_memory,
)
from .export import ExportStage, SimplifyStage
from .quantize import QuantizeStage
from .torch_passes import PassStage

__all__ = [
    "Stage",
    "StageOutput",
    "StageSkipped",
    "RunContext",
    "RunTarget",
    "Contribution",
    "ArtifactWriter",
    "PassStage",
    "ExportStage",
    "SimplifyStage",
    "QuantizeStage",
    "pipeline_stages",
    "content_key",
    "module_hash",
    "trim_memory",
    "RAW_ONNX",
    "FP32_ONNX",
    "INT8_ONNX",
]


def pipeline_stages(target: RunTarget, contribution: Contribution | None = None) -> list[Stage]:
    """The stages of a run, in order: the torch passes, export, simplify, INT8, then the target's.

    Args:
        target: the run's target (its contribution: files beside the Q/DQ model, later stages).
        contribution: instead of the target's (a custom runtime, a test).
    Returns:
        Every stage, enabled or not (the loop asks each whether the recipe runs it).
    """
    extra = contribution if contribution is not None else target.contribution()
    return [*(PassStage(name) for name in PASS_STAGES), ExportStage(), SimplifyStage(),
            QuantizeStage(artifacts=extra.artifacts), *extra.stages]
