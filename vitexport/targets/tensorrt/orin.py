"""Jetson Orin with TensorRT 10 (JetPack 6.1+): explicit, symmetric, strongly typed Q/DQ.

The worked example of a target module (:class:`~vitexport.targets.Target` lists what one
provides): the class registers itself under ``orin``, ``orin.yaml`` beside this file is its default
recipe, and it owns
- where Q/DQ goes: symmetric int8 everywhere (TensorRT rejects a non-zero zero point), per-channel
  weights on the output-channel axis, a dedicated Q/DQ pair per consumer (TensorRT fuses a pair into
  its one consumer), and attention's batched MatMuls only where TensorRT fuses INT8 attention;
  LayerNorm, Softmax, GELU and residual Adds stay in higher precision (no Q/DQ on their inputs);
- the precision of the float parts: FP16 by default, since a strongly typed build runs what the
  file says and FP16 float parts are what make INT8 pay;
- what its runtime accepts: TensorRT's Q/DQ rules over TensorRT 10.3's ONNX parser
  (:mod:`.rules`, :mod:`.ops`);
- the INT8 gate's arithmetic: float Q/DQ semantics, the FP16 float parts as written;
- extra files and stages: TensorRT's legacy ``calibration.cache`` beside the scale table,
  ``build_engine.sh`` and the ``build_engine`` stage (:mod:`.engine`).
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from ...stages.base import Contribution
from .._base import Target
from .._registry import register_target
from .cache import write_trt_cache
from .engine import BUILD_ENGINE, TENSORRT
from .ops import TENSORRT_10_3, TensorRTParser
from .rules import TensorRTRules
from .runner import TensorRTRunner

__all__ = ["OrinTarget"]


@register_target
class OrinTarget(Target):
    """TensorRT 10 on Jetson Orin: explicit, symmetric, strongly typed Q/DQ."""

    name = "orin"
    description = "Jetson Orin, TensorRT 10 (JetPack 6.1+), explicit QDQ INT8"
    force_symmetric = True  # TensorRT rejects a non-zero zero point
    dedicated_pairs = True  # TensorRT fuses a Q/DQ pair into its one consumer
    #: fused INT8 multi-head attention (TensorRT's MHA fusion) needs these head sizes and ≤ 512 tokens
    FUSED_HEAD_SIZES: ClassVar[tuple[int, ...]] = (16, 32, 64)
    MAX_FUSED_SEQ: ClassVar[int] = 512
    #: the TensorRT release whose ONNX parser reads the graph
    parser: ClassVar[TensorRTParser] = TENSORRT_10_3
    #: build with --stronglyTyped (TensorRT ≥ 9): the file's types decide each layer's precision
    strongly_typed: ClassVar[bool] = True
    engine = "TensorRT"
    runs_on = "TensorRT 10 on a Jetson Orin GPU (the engine is built on the device: build_engine.sh)"
    attention_int8_why = "what TensorRT's fused INT8 attention needs"
    attention_float_cost = "TensorRT runs those attentions unfused or in FP16: the accuracy-for-speed trade measured"
    #: 0.80, below the NPUs' 0.95: TensorRT runs the float parts in FP16 on the same tensor cores at about
    #: half INT8's rate, so 20 % of the MACs in FP16 cost at most ~20 % over an all-INT8 engine; annotate
    #: leaves attention's batched MatMuls in FP16 by design where TensorRT has no fused INT8 attention (head
    #: size, > 512 tokens: timm's test_vit runs 89.6 % INT8). A hybrid whose convs stay float
    #: (MobileNetV4-hybrid: 27 % INT8) fails
    int8_share_min = 0.80
    #: serialized engines (trtexec's and build_engine.sh's ``.plan``), compared by ``vitexport parity --compare``
    artifact_suffixes = (".plan", ".engine", ".trt")
    target_stages = (BUILD_ENGINE,)

    def high_precision(self) -> str:
        # A strongly typed build runs what the file says: FP16 float parts are what make INT8 pay.
        # TensorRT 8 (--int8 --fp16) picks per layer from an FP32 file.
        return self.spec.high_precision or ("fp16" if self.strongly_typed else "fp32")

    def attention_ok(self, head: int, seq: int) -> tuple[bool, str]:
        ok, why = super().attention_ok(head, seq)
        if not ok:
            return ok, why
        if head not in self.FUSED_HEAD_SIZES:
            return False, f"head size {head} is not one TensorRT fuses in INT8 {self.FUSED_HEAD_SIZES}"
        if seq > self.MAX_FUSED_SEQ:
            return False, f"sequence length {seq} > {self.MAX_FUSED_SEQ}: no fused INT8 attention"
        return True, ""

    def rules(self) -> TensorRTRules:
        """TensorRT's Q/DQ rules and its ONNX parser's operators and opsets."""
        return TensorRTRules(self.parser)

    def write_artifacts(self, work_dir: Path, scales: dict[str, float], method: str) -> dict[str, Path]:
        """TensorRT's legacy calibration cache (``calibration.cache``) beside the scale table."""
        header = "TRT-8501-MinMaxCalibration" if method == "minmax" else "TRT-8501-EntropyCalibration2"
        return {"calibration_cache": write_trt_cache(work_dir / "calibration.cache", scales, header)}

    @classmethod
    def open_artifact(cls, path: Path) -> TensorRTRunner:
        """A TensorRT engine behind Polygraphy's runner (activating it needs TensorRT and a GPU)."""
        return TensorRTRunner(path, name=path.name)

    def contribution(self) -> Contribution:
        """``build_engine.sh`` and the TensorRT engine stage."""
        return TENSORRT
