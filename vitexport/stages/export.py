"""ONNX export and simplification as stages: ``export_onnx`` → ``model.raw.onnx``, ``simplify`` →
``model.fp32.onnx``, each gated with ONNX Runtime against the golden reference."""
from __future__ import annotations

from typing import ClassVar

from ..recipe import Recipe, StageName
from ..runners import OnnxRuntimeRunner
from .base import FP32_ONNX, RAW_ONNX, RunContext, StageOutput, content_key, model_files, model_hash, module_hash, trim_memory

__all__ = ["ExportStage", "SimplifyStage"]


class ExportStage:
    """The rewritten torch model → fixed-shape ONNX (``vitexport.export.export_onnx``)."""

    name: ClassVar[StageName] = StageName.export_onnx
    needs_torch: ClassVar[bool] = True

    def enabled(self, recipe: Recipe) -> bool:
        return True

    def key(self, ctx: RunContext) -> str:
        # The passes' rewrites of attention live in hooks and attributes a state dict does not show:
        # the stage settings are part of the key. The contract decides which index ops the export lowers.
        r = ctx.recipe
        return content_key(ctx.key, module_hash(ctx.module, ctx.model.example_inputs), r.export.model_dump(mode="json"),
                           r.stages.model_dump(mode="json"), r.contract.allowed_ops)

    def run(self, ctx: RunContext) -> StageOutput:
        from ..export import export_onnx  # vitexport.export loads torch (~2 s): quantize-only users of vitexport.targets never need it

        raw = ctx.out_dir / RAW_ONNX
        trim_memory()  # the exporter holds about two more copies of the weights: start from a trimmed heap
        exp = export_onnx(ctx.module, ctx.model.example_inputs, raw, ctx.recipe.export, contract=ctx.recipe.contract)
        return StageOutput(files=model_files(raw), notes=[f"exporter: {exp.exporter}, opset {exp.opset}", *exp.notes],
                           details={"export": exp.to_dict()})

    def runner(self, ctx: RunContext, out: StageOutput):
        return OnnxRuntimeRunner(out.files[RAW_ONNX], name=self.name)


class SimplifyStage:
    """onnxsim plus the target's contract check (``vitexport.export.simplify_onnx``)."""

    name: ClassVar[StageName] = StageName.simplify
    needs_torch: ClassVar[bool] = False

    def enabled(self, recipe: Recipe) -> bool:
        return True

    def key(self, ctx: RunContext) -> str:
        r = ctx.recipe
        return content_key(ctx.key, model_hash(ctx.files[RAW_ONNX]), r.contract.model_dump(mode="json"), r.export.simplify)

    def run(self, ctx: RunContext) -> StageOutput:
        from ..export import simplify_onnx  # vitexport.export loads torch (~2 s): quantize-only users of vitexport.targets never need it

        fp32 = ctx.out_dir / FP32_ONNX
        simp = simplify_onnx(ctx.files[RAW_ONNX], fp32, ctx.target)
        return StageOutput(files=model_files(fp32), notes=list(simp.notes), details={"simplify": simp.to_dict()})

    def runner(self, ctx: RunContext, out: StageOutput):
        return OnnxRuntimeRunner(out.files[FP32_ONNX], name=self.name)
