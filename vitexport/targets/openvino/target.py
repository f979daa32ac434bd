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

from typing import ClassVar, Mapping, Sequence

import onnx_ir as ir

from ...graph.files import load_model
from ...graph.macs import MAC_OPS
from ...graph.query import quantized_linears
from ...parity.share import SHARE_KEY, FloatLayer, Int8Share
from ...quantize.precision import reads_int8
from ...recipe import Recipe, TargetStage
from ...runners.host import cpu_int8_isa, int8_dot_saturates
from .runner import OpenVinoRunner, save_ir
from .runner import RuntimePrecisions
from ...stages.base import INT8_ONNX, Contribution, RunContext, StageOutput, content_key, model_hash
from .._base import Target
from .._registry import register_target

__all__ = ["OpenVinoTarget", "BUILD_ENGINE", "BuildIrStage", "OPENVINO", "IR_XML", "IR_BIN", "linears_not_int8", "runtime_share",
           "fused_producers"]

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


def _source_node(sources: tuple[str, ...]) -> str:
    """The ONNX node a runtime layer came from: the GEMM/Conv among the fused source names (a Gemm's
    MatMul part is ``<node>/WithoutBiases``)."""
    names = [n.split("/WithoutBiases")[0] for n in sources if n]
    return next((n for n in names if any(k in n.rsplit("/", 1)[-1] for k in ("MatMul", "Gemm", "Conv"))),
                names[0] if names else "?")


def fused_producers(model: ir.Model) -> dict[str, str]:
    """Each node that reads a GEMM/Conv's output → that GEMM/Conv: OpenVINO may name the layer it fuses them
    into after the reader alone (BERT's scores ``attention/self/Mul`` is the Q·Kᵀ MatMul with its scale)."""
    return {n.name: p.name for n in model.graph if n.op_type not in MAC_OPS
            for v in n.inputs[:2] if v is not None and (p := v.producer()) is not None and p.op_type in MAC_OPS}


def runtime_share(precisions: RuntimePrecisions, quantized: set[str], hints: Sequence[str],
                  fused: Mapping[str, str] | None = None) -> Int8Share:
    """The INT8 share OpenVINO's runtime model reports, every GEMM/Conv layer without an integer kernel
    named with why: Q/DQ'd in the file yet run in float (OpenVINO's low-precision transformations
    declined it, or this CPU has no integer kernel for it), or without Q/DQ in the file (the quantizer's
    notes say why). ``fused``: :func:`fused_producers` of the file, to read a layer named after a reader."""
    layers, fused = [], fused or {}
    for sources, layer, prec, macs in precisions.float_layers:
        sources = tuple(fused.get(s.split("/WithoutBiases")[0], s) for s in sources)
        node = _source_node(sources)
        why = (f"Q/DQ'd in {INT8_ONNX}, yet OpenVINO's CPU plugin kept it in {prec}"
               + (f" on this CPU ({cpu_int8_isa()}: it has integer kernels for fewer MatMul forms than a CPU with VNNI "
                  "or AMX, which may run it INT8)" if int8_dot_saturates() else "")
               if quantized & set(s.split("/WithoutBiases")[0] for s in sources) else
               f"no Q/DQ on it in {INT8_ONNX} (quantize_int8's INT8-share note says why the quantizer left it float)")
        layers.append(FloatLayer(node, layer, macs, f"{prec} on the CPU plugin", why))
    total = sum(sum(p.values()) for p in precisions.macs.values())
    return Int8Share(precisions.int8_share, "OpenVINO's runtime model (CPU plugin)", total, layers, hints=list(hints))


#: the stage the openvino target adds, and so declares: the IR, gated on OpenVINO's CPU plugin
BUILD_ENGINE = TargetStage("build_engine")

class BuildIrStage:
    """The Q/DQ model → OpenVINO IR, gated on the CPU plugin with the runtime's precisions reported."""

    name: ClassVar[str] = BUILD_ENGINE.name
    needs_torch: ClassVar[bool] = False

    def enabled(self, recipe: Recipe) -> bool:
        return recipe.stages.quantize_int8.enabled and recipe.stages.build_engine.enabled

    def key(self, ctx: RunContext) -> str:
        return content_key(ctx.key, model_hash(ctx.files[INT8_ONNX]), "openvino-ir")

    def run(self, ctx: RunContext) -> StageOutput:
        xml, bin_ = save_ir(ctx.files[INT8_ONNX], ctx.out_dir / IR_XML)
        qdq = load_model(ctx.files[INT8_ONNX])
        linears = quantized_linears(qdq)
        with OpenVinoRunner(xml) as runner:
            prec = runner.precisions()
        missing = linears_not_int8(prec, linears)
        runtime = {**prec.to_dict(), "quantized_linears": len(linears), "linears_not_int8": missing}
        int8 = {n.name for n in qdq.graph if n.op_type in MAC_OPS and reads_int8(n)}
        share = runtime_share(prec, int8, ctx.target.int8_share_hints, fused_producers(qdq))
        notes = [f"OpenVINO CPU plugin runtime model: {prec.int8_share:.1%} of GEMM/Conv multiply-accumulates in "
                 f"INT8 kernels; {len(linears) - len(missing)} of {len(linears)} quantized Linears run INT8"
                 + (f" (not: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''})" if missing else "")]
        return StageOutput(files={IR_XML: xml, IR_BIN: bin_}, notes=notes,
                           details={"runtime": runtime, SHARE_KEY: share.to_dict()})

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
    #: but Q·Kᵀ with a u8 input and its zero point ran in f32 on the CPU plugin (ViT-Tiny: 11 of 12, 93.4 % INT8);
    #: q and k as int8 with zero point 0 run as an integer MatMul, k and v 7-bit where 8-bit weights saturate (an AVX2
    #: CPU without VNNI: 8-bit k took a trained YOLOS's plugin cosine from the Q/DQ file's 0.9993 to 0.962)
    symmetric_attention = True
    dedicated_pairs = False
    engine = "OpenVINO"
    runs_on = "OpenVINO's CPU plugin (model.xml/.bin; Intel's NPU plugin compiles the same IR)"
    #: OpenVINO's low-precision transformations re-decide what runs INT8: its runtime model's figure is gated
    int8_share_stage = BUILD_ENGINE.name
    target_stages = (BUILD_ENGINE,)
    #: 0.95, the NPU bar: the same IR is what Intel's NPU plugin compiles, bought for INT8 like any NPU
    int8_share_min = 0.95

    def contribution(self) -> Contribution:
        """The ``build_engine`` stage: the IR, gated on the CPU plugin."""
        return OPENVINO
