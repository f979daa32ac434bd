"""Float64 arithmetic inside an exported graph, written in float32 (an onnx-ir pass on the exporter's file).

A model whose inputs and outputs are float32 can still trace float64 in between: the TorchScript exporter writes
``torch.linspace`` over traced sizes with ``Cast(to=DOUBLE)`` (Mask2Former's and Deformable DETR's reference
points), and a ``.double()`` for a numerically careful sum does the same. No deployment target computes in float64
(TensorRT, NPUs), and ONNX Runtime's CPU provider lacks float64 kernels for ops such as GridSample, so such a file
cannot even be checked. Where no graph input or output is float64, every float64 cast, constant and initializer
becomes float32 and the ops between them follow; the export stage's parity gate measures what that changed (the
values involved are coordinates and ratios, float32 round-off).
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

__all__ = ["float64_as_float32"]

_DOUBLE, _FLOAT = ir.DataType.DOUBLE, ir.DataType.FLOAT


def _float32_tensor(tensor: ir.TensorProtocol) -> ir.Tensor:
    return ir.tensor(tensor.numpy().astype(np.float32), name=tensor.name)


def _node(node: ir.Node) -> bool:
    changed = False
    for name, a in list(node.attributes.items()):
        if a.type == ir.AttributeType.INT and name in ("to", "dtype") and a.value == _DOUBLE.value:
            node.attributes[name] = ir.AttrInt64(name, _FLOAT.value)
            changed = True
        elif a.type == ir.AttributeType.TENSOR and a.value.dtype == _DOUBLE:
            node.attributes[name] = ir.AttrTensor(name, _float32_tensor(a.value))
            changed = True
    return changed


def float64_as_float32(model: ir.Model) -> int:
    """Rewrite, in place, the model's float64 computation in float32 (module docstring).

    Returns:
        How many casts, constants and initializers changed (0 when a graph input or output is float64: that
        interface is the model's own, and it is left as it is).
    """
    graph = model.graph
    if any(v.dtype == _DOUBLE for v in (*graph.inputs, *graph.outputs)):
        return 0
    changed = 0
    for value in graph.initializers.values():
        if value.dtype == _DOUBLE and value.const_value is not None:
            value.const_value = _float32_tensor(value.const_value)
            value.dtype = _FLOAT
            changed += 1
    for node in ir.traversal.RecursiveGraphIterator(graph):
        changed += _node(node)
    if changed:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            for out in node.outputs:
                if out.dtype == _DOUBLE:
                    out.dtype = _FLOAT
    return changed
