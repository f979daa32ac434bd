"""Backend-neutral runners behind one interface: torch, ONNX Runtime, the ONNX reference evaluator, and
outputs recorded by an engine that runs in another process (a vendor's simulator). A vendor's own runner
lives in its folder under :mod:`vitexport.targets` and reaches the rest of the package through its target.

``TorchRunner`` (and ``primary_output``) load on first use, so ONNX-only work — quantizing, comparing
two ONNX files — never pays for importing torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import BaseRunner, InputSpec, feed_size
from .ort_runner import QDQ_AS_FLOAT, OnnxRuntimeRunner
from .recorded_runner import RecordedRunner, feed_digest, record_outputs
from .reference_runner import OnnxReferenceRunner

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
    "primary_output",
]

_LAZY = {"TorchRunner", "primary_output"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import torch_runner

        return getattr(torch_runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
