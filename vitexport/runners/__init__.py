"""Runners behind one interface: torch, ONNX Runtime, the ONNX reference evaluator, OpenVINO's CPU
plugin, TensorRT (through Polygraphy, imported lazily), and outputs recorded by an engine that runs in
another process (RKNN's simulator).

``TorchRunner`` (and ``primary_output``) load on first use, so ONNX-only work — quantizing, comparing
two ONNX files — never pays for importing torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import BaseRunner, InputSpec, feed_size
from .ort_runner import QDQ_AS_FLOAT, OnnxRuntimeRunner
from .openvino_runner import OpenVinoRunner, RuntimePrecisions, runtime_precisions, save_ir
from .recorded_runner import RecordedRunner, feed_digest, record_outputs
from .reference_runner import OnnxReferenceRunner
from .trt_runner import TensorRTRunner, require_tensorrt, tensorrt_available, tensorrt_missing

if TYPE_CHECKING:
    from .torch_runner import TorchRunner, primary_output

__all__ = [
    "BaseRunner",
    "InputSpec",
    "feed_size",
    "TorchRunner",
    "OnnxRuntimeRunner",
    "QDQ_AS_FLOAT",
    "OnnxReferenceRunner",
    "RecordedRunner",
    "record_outputs",
    "feed_digest",
    "OpenVinoRunner",
    "RuntimePrecisions",
    "runtime_precisions",
    "save_ir",
    "TensorRTRunner",
    "tensorrt_available",
    "tensorrt_missing",
    "require_tensorrt",
    "primary_output",
]

_LAZY = {"TorchRunner", "primary_output"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import torch_runner

        return getattr(torch_runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
