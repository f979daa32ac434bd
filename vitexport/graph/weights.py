"""Lift a model's large weights out as graph inputs, for C APIs that take a serialised model.

onnxsim and ONNX Runtime both take a ``ModelProto``; serialising a ViT-B/16 puts 350 MB of weights
into it (and ONNX Runtime then keeps its own copy). Inside :func:`weights_as_inputs` the model's
large initializers are graph inputs of their exact type and shape instead, so the serialised model
is a few hundred kilobytes: shape inference still sees every weight's type and shape, constant
folding does not touch them, and ONNX Runtime reads them on every run from the very arrays the
``ir.Model`` holds (memory-mapped or in memory: fed without a copy). onnx-ir's own C-API bridge does
the same for ``onnx.shape_inference``.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import numpy as np
import onnx
import onnx_ir as ir

__all__ = ["weights_as_inputs", "LIFT_MIN_BYTES"]

#: initializers from this size on are lifted; smaller ones (shapes, scales, axes) stay constants,
#: since shape inference and constant folding need their values
LIFT_MIN_BYTES = 16 << 10


def _default_lift(value: ir.Value) -> bool:
    t = value.const_value
    return t is not None and t.nbytes >= LIFT_MIN_BYTES and t.dtype == ir.DataType.FLOAT


@contextlib.contextmanager
def weights_as_inputs(
    model: ir.Model, lift: Callable[[ir.Value], bool] | None = None
) -> Iterator[tuple[onnx.ModelProto, dict[str, np.ndarray]]]:
    """Yield ``(proto, weights)``: the model serialised with the lifted weights as graph inputs,
    and those weights as arrays (name → array, no copies). The model is restored on exit.

    Args:
        model: the model (temporarily modified; restored even when the body raises).
        lift: which initializers to lift (default: float32 tensors of 16 KiB or more).
    """
    lift = lift or _default_lift
    graph = model.graph
    order = list(graph.initializers.values())
    n_inputs = len(graph.inputs)
    lifted = [v for v in order if lift(v)]
    weights: dict[str, np.ndarray] = {}
    for v in lifted:
        t = v.const_value
        weights[v.name] = np.asarray(t.numpy())
        v.shape = v.shape or ir.Shape(t.shape)
        v.dtype = v.dtype or t.dtype
        graph.initializers.pop(v.name)
        if v not in graph.inputs:
            graph.inputs.append(v)
    try:
        yield ir.serde.serialize_model(model), weights
    finally:
        del graph.inputs[n_inputs:]
        graph.initializers.clear()
        for v in order:  # insertion order is file order: identical inputs give identical bytes
            graph.initializers.add(v)
