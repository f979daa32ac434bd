"""The in-memory ONNX model every ONNX-side step works on: onnx-ir (``onnx_ir``).

- :mod:`.files`: load a file as an ``ir.Model`` (external data memory-mapped, never copied) and save
  one atomically, large weights in a ``.data`` file beside it;
- :mod:`.weights`: the model with its large weights lifted out as graph inputs, for the two C APIs
  that would otherwise serialise them (onnxsim and ONNX Runtime);
- :mod:`.query`: the few graph questions the passes ask (constant values, static shapes, producers
  looked at through reshapes, attributes);
- :mod:`.passes`: the base class of vitexport's onnx-ir passes (a report beside the pass result).
"""
from __future__ import annotations

from .files import EXTERNAL_DATA_MIN_BYTES, artifact_files, load_model, save_model
from .passes import GraphPass, GraphPassReport
from .query import (
    attr,
    const_array,
    is_const,
    opset_version,
    producer_through,
    static_shape,
    uses_through,
)
from .weights import weights_as_inputs

__all__ = [
    "EXTERNAL_DATA_MIN_BYTES",
    "artifact_files",
    "load_model",
    "save_model",
    "weights_as_inputs",
    "attr",
    "const_array",
    "is_const",
    "opset_version",
    "producer_through",
    "static_shape",
    "uses_through",
    "GraphPass",
    "GraphPassReport",
]
