"""INT8 as a stage: ``quantize_int8`` → ``model.int8.onnx`` (+ the calibration table and cache, and
the files the target contributes), gated in the arithmetic the target's runtime performs."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..io import sha256_file
from ..recipe import Recipe, StageName
from .base import FP32_ONNX, INT8_ONNX, ArtifactWriter, RunContext, StageOutput, content_key

__all__ = ["QuantizeStage", "CALIBRATION_FILES"]

#: what ``quantize_int8`` leaves beside the model (kept, hashed and resumed with it)
CALIBRATION_FILES = ("calibration.json", "calibration.cache")


@dataclass(frozen=True)
class QuantizeStage:
    """Calibrated Q/DQ INT8 (``vitexport.quantize.quantize_int8``).

    Attributes:
        artifacts: the target's writers of files beside the Q/DQ model (``Contribution.artifacts``).
    """

    artifacts: tuple[ArtifactWriter, ...] = ()
    name: ClassVar[StageName] = StageName.quantize_int8
    needs_torch: ClassVar[bool] = False

    def enabled(self, recipe: Recipe) -> bool:
        return recipe.stages.quantize_int8.enabled

    def key(self, ctx: RunContext) -> str:
        r = ctx.recipe
        return content_key(ctx.key, sha256_file(ctx.files[FP32_ONNX]), ctx.calib.fingerprint(),
                           r.calibration.model_dump(mode="json"), r.quantization.model_dump(mode="json"),
                           r.target.value, r.tolerance(self.name).model_dump(mode="json"))

    def run(self, ctx: RunContext) -> StageOutput:
        from ..quantize import quantize_int8

        r, fp32, int8 = ctx.recipe, ctx.files[FP32_ONNX], ctx.out_dir / INT8_ONNX
        q = quantize_int8(fp32, int8, ctx.calib, r, ctx.out_dir, parity_feeds=ctx.reference.feeds,
                          reference=ctx.reference.outputs["output"])
        notes = list(q.notes)
        if not _native(r):
            notes.append("INT8 parity: Q/DQ evaluated as float ops in ONNX Runtime (session.disable_quant_qdq), "
                         f"the arithmetic the {r.target.value} runtime performs")
        files = {INT8_ONNX: int8, **{n: ctx.out_dir / n for n in CALIBRATION_FILES if (ctx.out_dir / n).is_file()}}
        for write in self.artifacts:
            path = Path(write(int8, r))
            files[path.name] = path
        return StageOutput(files=files, notes=notes, details={"quantize": q.to_dict()},
                           layers=_layers(ctx, fp32, int8) if ctx.layers else None)

    def runner(self, ctx: RunContext, out: StageOutput):
        from ..engines import QDQ_AS_FLOAT, OnnxRuntimeRunner

        # The gate measures what the target computes: ONNX Runtime's fused integer kernels for
        # cpu, float Q/DQ semantics (fake quantization) for TensorRT and NPU targets.
        config = None if _native(ctx.recipe) else QDQ_AS_FLOAT
        return OnnxRuntimeRunner(out.files[INT8_ONNX], name=self.name, config=config)


def _native(recipe: Recipe) -> bool:
    from ..quantize import get_target

    return get_target(recipe).runs_in_onnxruntime


def _layers(ctx: RunContext, fp32: Path, int8: Path):
    """Per-layer localisation of the INT8 error against the untouched model (FP32 beside INT8)."""
    from ..parity import localize_layers

    return localize_layers(ctx.model.module, ctx.reference.feeds, {"fp32": fp32, "int8": int8},
                           budget=ctx.recipe.tolerance(StageName.quantize_int8), reference_layers=ctx.reference.layers)
