"""ONNX export and simplification as stages: ``export_onnx`` → ``model.raw.onnx``, ``simplify`` →
``model.fp32.onnx``, each gated with ONNX Runtime against the golden reference."""
from __future__ import annotations

from typing import ClassVar

from ..errors import BadInput
from ..recipe import Recipe, StageName
from ..runners import OnnxRuntimeRunner
from ..runners.sessions import missing_kernel
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
        return _ExportedRunner(out.files[RAW_ONNX], name=self.name)


class _ExportedRunner(OnnxRuntimeRunner):
    """The exported file's runner: an op ONNX Runtime has no kernel for is the model's limit (exit 2
    naming the node), where on a file vitexport rewrote it would be vitexport's bug (exit 3)."""

    def activate_impl(self) -> None:
        try:
            super().activate_impl()
        except Exception as exc:  # noqa: BLE001 - onnxruntime's pybind errors share no public base
            what = missing_kernel(exc, self.model)
            if what is None:
                raise
            import onnxruntime  # noqa: PLC0415 - only for the message's version

            raise BadInput(f"{RAW_ONNX}: ONNX Runtime {onnxruntime.__version__} has no CPU kernel for {what}, and every "
                           "stage's parity runs on it: make the model compute that op in float32 (or export without "
                           "it, e.g. --outputs)") from None


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
