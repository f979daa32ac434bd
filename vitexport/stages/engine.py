"""What the orin target contributes: ``build_engine.sh`` beside the Q/DQ model, and the
``build_engine`` stage (a TensorRT engine built and gated here, where TensorRT and a GPU exist)."""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from ..recipe import Recipe, StageName
from .base import INT8_ONNX, Contribution, RunContext, StageOutput, StageSkipped

__all__ = ["BuildEngineStage", "engine_script", "TENSORRT", "ENGINE_PLAN", "ENGINE_SCRIPT"]

ENGINE_PLAN, ENGINE_SCRIPT = "model.int8.plan", "build_engine.sh"


def engine_script(int8: Path, recipe: Recipe) -> Path:
    """Write ``build_engine.sh`` (the trtexec command for the Jetson) beside the Q/DQ model."""
    from ..quantize import write_engine_script

    return write_engine_script(int8, Path(int8).parent / ENGINE_SCRIPT, recipe)


class BuildEngineStage:
    """The Q/DQ model → a TensorRT engine through Polygraphy (``quantization.strongly_typed`` picks
    TensorRT 10's strongly typed build or TensorRT 8's ``--int8 --fp16``), gated with TensorRT itself.

    Never resumed: an engine belongs to the GPU and TensorRT version that built it.
    """

    name: ClassVar[StageName] = StageName.build_engine
    needs_torch: ClassVar[bool] = False

    def enabled(self, recipe: Recipe) -> bool:
        return recipe.stages.quantize_int8.enabled and recipe.stages.build_engine.enabled

    def key(self, ctx: RunContext) -> None:
        return None

    def run(self, ctx: RunContext) -> StageOutput:
        from ..runners import tensorrt_missing

        missing = tensorrt_missing()
        if missing:
            raise StageSkipped(f"TensorRT or a GPU is not available here (missing: {', '.join(missing)}); "
                               f"{ENGINE_SCRIPT} holds the trtexec command")
        return _build(ctx)  # pragma: no cover - needs TensorRT and a GPU

    def runner(self, ctx: RunContext, out: StageOutput):  # pragma: no cover - needs TensorRT and a GPU
        from ..runners import TensorRTRunner

        return TensorRTRunner(out.files[ENGINE_PLAN], name=self.name)


def _build(ctx: RunContext) -> StageOutput:  # pragma: no cover - needs TensorRT and a GPU
    from ..quantize import build_engine

    plan = ctx.out_dir / ENGINE_PLAN
    build_engine(ctx.files[INT8_ONNX], plan, strongly_typed=ctx.recipe.quantization.strongly_typed)
    return StageOutput(files={ENGINE_PLAN: plan})


#: the TensorRT targets' contribution (``OrinTarget.contribution()``)
TENSORRT = Contribution(artifacts=(engine_script,), stages=(BuildEngineStage(),))
