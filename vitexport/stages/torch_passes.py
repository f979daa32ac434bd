"""The torch passes as stages: ``reparameterize``, ``freeze_layernorm``, ``mask_to_where``, ``fuse_qkv``.

The first pass copies the model (the caller's module is never touched); later passes rewrite that
copy in place, so a ViT-B holds two sets of weights here, not four. A model the pipeline may
consume (``keep_source=False``: loaded for this run, no per-layer comparison to come) is rewritten
in place from the start: one set of weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..recipe import Recipe, StageName
from .base import RunContext, StageOutput

__all__ = ["PassStage"]


@dataclass(frozen=True)
class PassStage:
    """A torch pass (``vitexport.passes``) gated on the rewritten module, run by torch.

    Not resumable: it rewrites the model in memory; the export's content key hashes its result.
    """

    name: StageName
    needs_torch: ClassVar[bool] = True

    def enabled(self, recipe: Recipe) -> bool:
        return recipe.toggle(self.name).enabled

    def key(self, ctx: RunContext) -> None:
        return None

    def run(self, ctx: RunContext) -> StageOutput:
        from ..passes import get_pass  # the torch passes load torch (~2 s): ONNX-only users never need it

        spec = ctx.recipe.toggle(self.name)
        ctx.module, report = get_pass(self.name)(ctx.module, ctx.model.example_inputs, spec, inplace=ctx.owned)
        ctx.owned = True
        notes = [report.summary(), *[f"skipped {s.site}: {s.reason}" for s in report.skipped], *report.notes]
        return StageOutput(notes=notes, details={"pass_report": report.to_dict()}, changed=report.changed)

    def runner(self, ctx: RunContext, out: StageOutput):
        from ..runners import TorchRunner  # torch, as above

        return TorchRunner(ctx.module, ctx.model.example_inputs, name=self.name)
