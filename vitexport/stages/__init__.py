"""The pipeline's stages: torch passes → ONNX export → simplify → INT8 → what the target adds.

Each stage is a small object following the :class:`Stage` protocol (name, enabled for a recipe,
content key, run → artifacts, runner for its parity check); :func:`vitexport.pipeline.run_pipeline`
is the one loop that times, meters, gates, records and resumes them. A target adds files and stages
through :meth:`vitexport.quantize.targets.QuantTarget.contribution` (orin: ``build_engine.sh`` and
the TensorRT engine stage).
"""
from __future__ import annotations

from ..recipe import PASS_STAGES, Recipe
from .base import (
    FP32_ONNX,
    INT8_ONNX,
    RAW_ONNX,
    ArtifactWriter,
    Contribution,
    RunContext,
    Stage,
    StageOutput,
    StageSkipped,
    content_key,
    module_hash,
    trim_memory,
)
from .engine import TENSORRT, BuildEngineStage, engine_script
from .export import ExportStage, SimplifyStage
from .quantize import CALIBRATION_FILES, QuantizeStage
from .torch_passes import PassStage

__all__ = [
    "Stage",
    "StageOutput",
    "StageSkipped",
    "RunContext",
    "Contribution",
    "ArtifactWriter",
    "PassStage",
    "ExportStage",
    "SimplifyStage",
    "QuantizeStage",
    "BuildEngineStage",
    "TENSORRT",
    "engine_script",
    "target_contribution",
    "pipeline_stages",
    "content_key",
    "module_hash",
    "trim_memory",
    "RAW_ONNX",
    "FP32_ONNX",
    "INT8_ONNX",
    "CALIBRATION_FILES",
]


def target_contribution(recipe: Recipe) -> Contribution:
    """What the recipe's target adds to the pipeline (nothing for most targets)."""
    from ..quantize import get_target

    return get_target(recipe).contribution() or Contribution()


def pipeline_stages(recipe: Recipe, contribution: Contribution | None = None) -> list[Stage]:
    """The stages of a run, in order: the torch passes, export, simplify, INT8, then the target's.

    Args:
        recipe: the validated recipe (its target decides the contribution).
        contribution: instead of the target's (a custom runtime, a test).
    Returns:
        Every stage, enabled or not (the loop asks each whether the recipe runs it).
    """
    extra = contribution if contribution is not None else target_contribution(recipe)
    return [*(PassStage(name) for name in PASS_STAGES), ExportStage(), SimplifyStage(),
            QuantizeStage(artifacts=extra.artifacts), *extra.stages]
