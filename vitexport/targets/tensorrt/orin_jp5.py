"""Jetson Orin with TensorRT 8.5 / 8.6 (JetPack 5 / 6.0).

As :mod:`.orin`, except what TensorRT 8 changes: no strongly typed build (``trtexec --int8 --fp16``:
TensorRT picks each float layer's precision, so the file's float parts stay FP32), and TensorRT
8.6's ONNX parser (opsets up to 17, no ``LayerNormalization`` importer below opset 17 in 8.5, no
Gelu / CastLike). Its recipe, ``orin-jp5.yaml``, decomposes LayerNorm FP16-safely at opset 16.
"""
from __future__ import annotations

from .orin import OrinTarget
from .._registry import register_target
from .ops import TENSORRT_8_6

__all__ = ["OrinJP5Target"]


@register_target
class OrinJP5Target(OrinTarget):
    """TensorRT 8.5 / 8.6 on Jetson Orin: explicit Q/DQ, built with ``--int8 --fp16``."""

    name = "orin-jp5"
    description = "Jetson Orin, TensorRT 8.5/8.6 (JetPack 5 / 6.0), no LayerNormalization op"
    parser = TENSORRT_8_6
    strongly_typed = False  # TensorRT 8.x has no --stronglyTyped
    runs_on = "TensorRT 8.5/8.6 on a Jetson Orin GPU (the engine is built on the device: build_engine.sh)"
