"""Lift a model's large weights out as graph inputs, for C APIs that take a serialised model.

onnxsim and ONNX Runtime both take a ``ModelProto``; serialising a ViT-B/16 puts 350 MB of weights
into it (and ONNX Runtime then keeps its own copy). Inside :func:`weights_as_inputs` the model's
large initializers are graph inputs of their exact type and shape instead, so the serialised model
is a few hundred kilobytes: shape inference still sees every weight's type and shape, constant
folding does not touch them, and ONNX Runtime reads them on every run from the very arrays the
``ir.Model`` holds (fed without a copy when they are memory-mapped external data or numpy-backed; a
tensor still inside a loaded protobuf is read out once per session). onnx-ir's own C-API bridge does
the same for ``onnx.shape_inference``.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import onnx
import onnx_ir as ir

__all__ = ["weights_as_inputs", "through_proto", "reattach", "LIFT_MIN_BYTES"]

#: initializers from this size on are lifted; smaller ones (shapes, scales, axes) stay constants,
#: since shape inference and constant folding need their values
LIFT_MIN_BYTES = 16 << 10


def _default_lift(value: ir.Value) -> bool:
    t = value.const_value
    return t is not None and t.nbytes >= LIFT_MIN_BYTES and t.dtype == ir.DataType.FLOAT


@contextlib.contextmanager
def weights_as_inputs(
    model: ir.Model, lift: Callable[[ir.Value], bool] | None = None
) -> Iterator[tuple[onnx.ModelProto, dict[str, ir.TensorProtocol]]]:
    """Yield ``(proto, weights)``: the model serialised with the lifted weights as graph inputs,
    and those weights' tensors (name → tensor; ``.numpy()`` gives the data). The model is restored
    on exit.

    Args:
        model: the model (temporarily modified; restored even when the body raises).
        lift: which initializers to lift (default: float32 tensors of 16 KiB or more).
    """
    lift = lift or _default_lift
    graph = model.graph
    order = list(graph.initializers.values())
    n_inputs = len(graph.inputs)
    lifted = [v for v in order if lift(v)]
    # a tensor left in the graph must be serialised with its data: a C API reading the proto has
    # no folder to resolve an external-data reference against
    inlined = [(v, v.const_value) for v in order if v not in lifted and isinstance(v.const_value, ir.ExternalTensor)]
    for v, t in inlined:
        v.const_value = ir.Tensor(t.numpy(), dtype=t.dtype, name=t.name)
    weights: dict[str, ir.TensorProtocol] = {}
    for v in lifted:
        t = v.const_value
        weights[v.name] = t
        v.shape = v.shape or ir.Shape(t.shape)
        v.dtype = v.dtype or t.dtype
        graph.initializers.pop(v.name)
        if v not in graph.inputs:
            graph.inputs.append(v)
    try:
        yield ir.serde.serialize_model(model), weights
    finally:
        for v, t in inlined:
            v.const_value = t
        del graph.inputs[n_inputs:]
        graph.initializers.clear()
        for v in order:  # insertion order is file order: identical inputs give identical bytes
            graph.initializers.add(v)


def reattach(proto: onnx.ModelProto, held: dict[str, ir.Value]) -> ir.Model:
    """``proto`` (a lifted model after a C API changed it) as an ``ir.Model`` with the held weights
    back as initializers: the same tensors, no copy. A weight whose readers are gone is dropped."""
    out = ir.from_proto(proto)
    graph = out.graph
    for v in list(graph.inputs):
        if v.name in held:
            graph.inputs.remove(v)
            if v.uses():
                v.const_value = held[v.name].const_value
                graph.register_initializer(v)
    return out


def through_proto(model: ir.Model, fn: Callable[[onnx.ModelProto], onnx.ModelProto],
                  lift: Callable[[ir.Value], bool] | None = None) -> ir.Model:
    """A new model: ``fn`` (a C API such as onnxsim or the version converter) applied to ``model``
    with its large weights lifted out (:func:`weights_as_inputs`), then the weights put back."""
    initializers = dict(model.graph.initializers)
    with weights_as_inputs(model, lift) as (proto, weights):
        held = {name: initializers[name] for name in weights}
        return reattach(fn(proto), held)
