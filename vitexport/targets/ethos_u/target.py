"""Arm Ethos-U85 and Ethos-U55 through Vela, by one of two routes (``target_options.route``):

- ``tflite`` (what ``auto``, the default, takes on ethos-u85 where the lowering has a rule for every op): vitexport's FP32 ONNX lowered to TFLite (:mod:`.tflite_lower`),
  quantized by LiteRT's post-training quantizer on vitexport's calibration samples (int16 activations,
  per-channel int8 weights: TFLite's 16x8 mode), compiled by Vela → ``model.tflite``, the file TFLite Micro
  runs on an Ethos-U MCU; parity on the LiteRT interpreter running Vela's input (``model.int.tflite``).
- ``executorch`` (``auto`` on ethos-u55, and on ethos-u85 for a model the tflite lowering cannot take): vitexport's torch passes, then ExecuTorch's pt2e
  ``EthosUQuantizer`` calibrated on vitexport's calibration samples (int16 activations, per-channel int8
  weights; with int8 activations ExecuTorch's own quantized demo scores worst cosine 0.33),
  ``EthosUPartitioner`` → TOSA → Vela → ``model.pte``; parity on the TOSA reference model. On Ethos-U55 it
  gives attention's matmuls the int8 inputs that NPU multiplies (its 16x8 BATCH_MATMUL is CPU-only, so the
  tflite route leaves them there and misses the NPU-share gate).

Measured on the demo and the trained digits ViT in ``bench/results-npu.md``. The toolchain (executorch
1.5.1, ethos-u-vela 5.2.0, tosa-tools, ai-edge-litert) lives in a venv of its own (``make setup-ethos``:
tosa-tools pins numpy<2.2 and flatbuffers 25.2) and runs in a worker process (:mod:`.client`, :mod:`.worker`).
The target owns
- the accelerator Vela compiles for (``ethos-u85-256``, ``ethos-u55-128``) and its system configuration
  (ExecuTorch's defaults for each: ``Ethos_U85_SYS_DRAM_Mid`` / ``Sram_Only``, ``Ethos_U55_High_End_Embedded`` /
  ``Shared_Sram``; ``target_options`` overrides them and the memory the program may use);
- the NPU-share gate: Ethos-U computes only INT8 (and INT16), so the share of multiply-accumulates Vela
  compiled is the INT8 share; ≥ 95 % and no compute op left on the CPU;
- two stages (:mod:`.stages`): ``build_engine`` → ``model.tflite`` / ``model.pte``, ``simulate`` on the
  reference runtime (LiteRT / the TOSA reference model).
"""
from __future__ import annotations

from typing import ClassVar

from ...stages.base import Contribution
from .._base import Target
from .._registry import register_target
from .client import require_ethos
from .stages import BUILD_ENGINE, ETHOS_U, SIMULATE, EthosUOptions

__all__ = ["EthosU85Target", "EthosU55Target", "EthosUOptions"]


class _EthosU(Target):
    """What both Ethos-U targets share (not registered: each subclass names its accelerator)."""

    force_symmetric = True  # ExecuTorch's Arm quantizer writes symmetric int8 activations
    dedicated_pairs = False
    Options = EthosUOptions
    #: Vela's ``--accelerator-config``
    accelerator: ClassVar[str]
    #: the route ``target_options.route=auto`` takes (measured in bench/results-npu.md)
    auto_route: ClassVar[str] = "executorch"
    #: Vela's system configuration and memory mode when ``target_options`` names none (ExecuTorch 1.5.1's
    #: defaults for the accelerator, so both routes compile for the same system)
    vela_system: ClassVar[tuple[str, str]]
    #: the toolchain the worker's venv holds (``make setup-ethos``)
    toolkit: ClassVar[str] = "executorch==1.5.1 ethos-u-vela==5.2.0 tosa-tools==2026.8.0 ai-edge-litert==2.3.0"
    engine = "Ethos-U"
    #: the partitioner decides what runs on the NPU (in INT8): its partitions are the figure gated
    int8_share_stage = BUILD_ENGINE.name
    target_stages = (BUILD_ENGINE, SIMULATE)
    #: an NPU is bought for INT8 throughput: ≥ 95 % of multiply-accumulates on it (issue 32)
    int8_share_min = 0.95
    #: no compute op on the Cortex-M: each is a round trip NPU → CPU → NPU on a slow core
    cpu_compute_ops_max = 0
    int8_share_hints = ("target_options.route, the other route (on ethos-u55 only executorch gives attention's "
                        "matmuls the int8 inputs that NPU multiplies)",
                        "target_options.calibration_samples (more samples, other ranges), or a model whose ops "
                        "Vela's operator support lists (`vela --supported-ops-report`)")

    @property
    def arithmetic(self) -> str:
        if (self.options.route if self.options.route != "auto" else self.auto_route) == "tflite":
            return ("INT8 parity: vitexport's Q/DQ file in ONNX Runtime (float Q/DQ semantics); build_engine and "
                    "simulate gate the 16x8 TFLite Vela compiled, on the LiteRT interpreter")
        return ("INT8 parity: vitexport's Q/DQ file in ONNX Runtime (float Q/DQ semantics); build_engine gates "
                "ExecuTorch's quantized program, simulate the INT8 program on the TOSA reference model")

    def contribution(self) -> Contribution:
        """The ``build_engine`` (``model.pte``) and ``simulate`` (TOSA reference model) stages."""
        return ETHOS_U

    def require_toolchain(self) -> None:
        """The Ethos-U venv, when this run compiles (``make setup-ethos`` creates it)."""
        stages = self.recipe.stages
        if stages.quantize_int8.enabled and stages.build_engine.enabled:
            require_ethos()


@register_target
class EthosU85Target(_EthosU):
    """Arm Ethos-U85 (256 MACs/cycle): ``model.tflite`` by LiteRT's 16x8 quantizer and Vela (route
    ``tflite``), or ``model.pte`` by ExecuTorch's Arm backend and Vela (route ``executorch``)."""

    name = "ethos-u85"
    description = ("Arm Ethos-U85-256, LiteRT 2.3.0 + Vela 5.2.0: model.tflite, parity on the LiteRT interpreter "
                   "(target_options.route=executorch: model.pte, TOSA reference model)")
    accelerator = "ethos-u85-256"
    auto_route = "tflite"
    vela_system = ("Ethos_U85_SYS_DRAM_Mid", "Sram_Only")
    runs_on = "an Arm Ethos-U85-256 NPU (model.tflite for TFLite Micro, Vela; or model.pte by ExecuTorch)"


@register_target
class EthosU55Target(_EthosU):
    """Arm Ethos-U55 (128 MACs/cycle): as the U85, with the U55's smaller operator set (no permute of more
    than the last dims: a ViT may split into partitions and miss the NPU-share gate)."""

    name = "ethos-u55"
    description = "Arm Ethos-U55-128, ExecuTorch 1.5.1 + Vela 5.2.0: model.pte, parity on the TOSA reference model"
    accelerator = "ethos-u55-128"
    vela_system = ("Ethos_U55_High_End_Embedded", "Shared_Sram")
    runs_on = "an Arm Ethos-U55-128 NPU (model.pte: ExecuTorch's Arm backend, Vela; parity on the TOSA reference model)"
