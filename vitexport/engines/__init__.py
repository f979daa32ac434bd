"""Runners behind one interface: torch, ONNX Runtime, the ONNX reference evaluator, TensorRT (lazy)."""
from .base import BaseRunner, InputSpec
from .ort_runner import OnnxRuntimeRunner
from .reference_runner import OnnxReferenceRunner
from .torch_runner import TorchRunner, primary_output
from .trt_runner import TensorRTRunner, tensorrt_available

__all__ = [
    "BaseRunner",
    "InputSpec",
    "TorchRunner",
    "OnnxRuntimeRunner",
    "OnnxReferenceRunner",
    "TensorRTRunner",
    "tensorrt_available",
    "primary_output",
]
