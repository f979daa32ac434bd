"""OpenVINO: IR (``model.xml`` / ``model.bin``) of the Q/DQ file, gated on OpenVINO's CPU plugin.

OpenVINO reads vitexport's Q/DQ file as it is: its low-precision transformations turn each Q/DQ'd
MatMul / Conv into an integer kernel (``FullyConnected u8``, ``Convolution u8`` in the runtime model)
and keep LayerNorm, Softmax and GELU in FP32. The IR is what Intel's NPU plugin compiles too. The
target owns
- where Q/DQ goes: uint8 activations when the recipe allows (``openvino.yaml``: asymmetric, OpenVINO's
  u8 x i8 kernels), per-channel int8 weights, float biases (OpenVINO folds them itself), one shared
  Q/DQ pair per tensor;
- the INT8 gate's arithmetic: float Q/DQ semantics; the ``build_engine`` stage then gates the
  compiled model on the CPU plugin itself (the engine the artifact runs on) and reports, from the
  runtime model, the INT8 share of GEMM/Conv multiply-accumulates and every quantized Linear that does
  not run an integer kernel.
"""
from __future__ import annotations

from typing import ClassVar, Sequence

import onnx_ir as ir

from ..graph.files import load_model
from ..graph.query import quantized_linears
from ..recipe import Recipe, StageName
from ..runners import OpenVinoRunner, save_ir
from ..runners.openvino_runner import RuntimePrecisions
from ..stages.base import INT8_ONNX, Contribution, RunContext, StageOutput, content_key, model_hash
from .base import Target
from .registry import register_target

__all__ = ["OpenVinoTarget", "BuildIrStage", "OPENVINO", "IR_XML", "IR_BIN", "linears_not_int8"]

IR_XML, IR_BIN = "model.xml", "model.bin"


def linears_not_int8(precisions: RuntimePrecisions, linears: Sequence[ir.Node]) -> list[str]:
    """The quantized Linears (ONNX node names) no integer GEMM kernel of the runtime model runs.

    OpenVINO names a runtime layer after the source nodes it fused (a Gemm's MatMul part is
    ``<node>/WithoutBiases``), except a node that writes a graph output: its layer takes the output
    tensor's name (ViT-Tiny's head ``/model/model/head/Gemm`` runs as ``FullyConnected u8`` named
    ``output``), so a Linear counts as INT8 when a layer names the node or one of its outputs.
    """
    int8 = {name.split("/WithoutBiases")[0] for layer in precisions.int8_layers for name in layer}
    return [n.name for n in linears if not int8 & {n.name, *(v.name for v in n.outputs)}]


class BuildIrStage:
    """The Q/DQ model → OpenVINO IR, gated on the CPU plugin with the runtime's precisions reported."""

    name: ClassVar[StageName] = StageName.build_engine
    needs_torch: ClassVar[bool] = False

    def enabled(self, recipe: Recipe) -> bool:
        return recipe.stages.quantize_int8.enabled and recipe.stages.build_engine.enabled

    def key(self, ctx: RunContext) -> str:
        return content_key(ctx.key, model_hash(ctx.files[INT8_ONNX]), "openvino-ir")

    def run(self, ctx: RunContext) -> StageOutput:
        xml, bin_ = save_ir(ctx.files[INT8_ONNX], ctx.out_dir / IR_XML)
        linears = quantized_linears(load_model(ctx.files[INT8_ONNX]))
        with OpenVinoRunner(xml) as runner:
            prec = runner.precisions()
        missing = linears_not_int8(prec, linears)
        runtime = {**prec.to_dict(), "quantized_linears": len(linears), "linears_not_int8": missing}
        notes = [f"OpenVINO CPU plugin runtime model: {prec.int8_share:.1%} of GEMM/Conv multiply-accumulates in "
                 f"INT8 kernels; {len(linears) - len(missing)} of {len(linears)} quantized Linears run INT8"
                 + (f" (not: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''})" if missing else "")]
        return StageOutput(files={IR_XML: xml, IR_BIN: bin_}, notes=notes, details={"runtime": runtime})

    def runner(self, ctx: RunContext, out: StageOutput) -> OpenVinoRunner:
        return OpenVinoRunner(out.files[IR_XML], name=self.name)


#: what the openvino target adds to a run (``OpenVinoTarget.contribution()``)
OPENVINO = Contribution(stages=(BuildIrStage(),))


@register_target
class OpenVinoTarget(Target):
    """OpenVINO IR of the Q/DQ file, gated on the CPU plugin."""

    name = "openvino"
    description = "OpenVINO IR (model.xml/.bin), parity on OpenVINO's CPU plugin; Intel's NPU plugin compiles the same IR"
    force_symmetric = False  # the recipe's asymmetric_activations decides: u8 activations for OpenVINO's kernels
    dedicated_pairs = False
    engine = "OpenVINO"
    runs_on = "OpenVINO's CPU plugin (model.xml/.bin; Intel's NPU plugin compiles the same IR)"

    def contribution(self) -> Contribution:
        """The ``build_engine`` stage: the IR, gated on the CPU plugin."""
        return OPENVINO
