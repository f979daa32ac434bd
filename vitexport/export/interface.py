"""The exported file's interface: its graph inputs are the model's example inputs, in their order.

The TorchScript exporter drops an input the forward never reads (dynamo keeps it); the file then
took fewer inputs than the model, and every runner fed the model's inputs failed on it. vitexport's
rule is that the inputs users feed stay the same from the torch model to the FP32 and INT8 files
(and TensorRT's engine, which keeps an unused input too): such an input is put back, unread, and
the export says so, since a model that ignores its ``attention_mask`` usually means a bug in the
model, not in the export.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import onnx_ir as ir
import torch

from ..graph.clean import unused_inputs
from ..graph.files import load_model, save_model
from .float64 import float64_as_float32

__all__ = ["restore_inputs", "finish_export"]


def restore_inputs(model: ir.Model, example_inputs: Mapping[str, torch.Tensor]) -> list[str]:
    """Make the graph's inputs ``example_inputs`` (in order), adding any the exporter dropped.

    Args:
        model: the exported model, changed in place.
        example_inputs: the model's inputs, name → tensor (their dtype and shape type the inputs).
    Returns:
        A note per input the model never reads (empty when it reads them all).
    """
    graph = model.graph
    have = {v.name: v for v in graph.inputs}
    ordered = [have.pop(name, None) or ir.Value(name=name, shape=ir.Shape(list(t.shape)),
                                                type=ir.TensorType(ir.tensor_adapters.TorchTensor(t).dtype))
               for name, t in example_inputs.items()]
    # anything else the exporter made an input (an initializer kept as input) stays, after them
    ordered += [v for v in graph.inputs if v.name in have]
    graph.inputs.clear()
    graph.inputs.extend(ordered)
    return [f"input '{name}' is never read by the model: kept as a graph input, so the FP32 and INT8 files "
            "take the inputs the model takes (check that the model is meant to ignore it)"
            for name in unused_inputs(model) if name in example_inputs]


def finish_export(path: Path, example_inputs: Mapping[str, torch.Tensor]) -> list[str]:
    """Rewrite the exporter's file at ``path`` with the model's interface, clean (:func:`save_model`), its
    float64 arithmetic in float32 (:func:`float64_as_float32`).

    Returns:
        The notes of :func:`restore_inputs`, and one where float64 was written in float32.
    """
    model = load_model(path)
    notes = restore_inputs(model, example_inputs)
    if demoted := float64_as_float32(model):
        notes.append(f"float64 arithmetic the model traced written in float32 ({demoted} cast(s), constant(s) and "
                     "initializer(s)): no target computes in float64")
    save_model(model, path)
    return notes
