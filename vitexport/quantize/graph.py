"""Read-only indexes over an ONNX graph: producers, consumers, constants, static shapes.

Shape inference runs on a light copy of the model (large initializers replaced by typed graph
inputs), so a 330 MB ViT-B is never serialised twice just to learn its shapes.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["GraphIndex", "infer_shapes_light", "PASS_THROUGH_OPS"]

#: ops that move or reshape values without changing them (a channel stays a channel when the last
#: dimension is unchanged)
PASS_THROUGH_OPS = frozenset({"Reshape", "Flatten", "Identity", "Squeeze", "Unsqueeze"})

_SMALL = 4096  # bytes; initializers below this stay in the shape-inference copy (Reshape shapes etc.)


def infer_shapes_light(model: onnx.ModelProto) -> dict[str, tuple[tuple[int, ...], int]]:
    """Static shapes and element types of every tensor: name → (shape, onnx elem type).

    Unknown dims are -1. Large initializers travel as graph inputs so the copy stays small.
    """
    g = model.graph
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    lg = light.graph
    lg.name = g.name
    lg.node.extend(g.node)
    lg.input.extend(g.input)
    lg.output.extend(g.output)
    known_inputs = {i.name for i in g.input}
    for init in g.initializer:
        nbytes = int(np.prod(init.dims, dtype=np.int64)) * 4 if init.dims else 4
        if nbytes <= _SMALL or init.data_type == onnx.TensorProto.INT64:
            lg.initializer.append(init)
        elif init.name not in known_inputs:
            lg.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
    out: dict[str, tuple[tuple[int, ...], int]] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            out[vi.name] = ((), tt.elem_type)
            continue
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        out[vi.name] = (dims, tt.elem_type)
    for init in g.initializer:
        out[init.name] = (tuple(init.dims), init.data_type)
    return out


@dataclass
class GraphIndex:
    """Who produces and who consumes each tensor, which tensors are constant, and their shapes.

    ``const_value`` reads placeholder initializers from ``arrays``; the arrays are shared, not copied.
    """

    model: onnx.ModelProto
    shapes: dict[str, tuple[tuple[int, ...], int]] = field(default_factory=dict)
    #: values of placeholder initializers (a skeleton from :mod:`vitexport.calibration.session`)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        g = self.model.graph
        self.nodes = list(g.node)
        self.by_name: dict[str, onnx.NodeProto] = {}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
        for i, n in enumerate(self.nodes):
            if not n.name:
                n.name = f"{n.op_type}_{i}"
            self.by_name[n.name] = n
            for o in n.output:
                self.producer[o] = n
            for j, t in enumerate(n.input):
                if t:
                    self.consumers[t].append((n, j))
        self.initializers = {i.name: i for i in g.initializer}
        self.constants = {n.output[0]: n for n in self.nodes if n.op_type == "Constant"}
        self.graph_outputs = {o.name for o in g.output}
        if not self.shapes:
            self.shapes = infer_shapes_light(self.model)

    def is_const(self, name: str) -> bool:
        return name in self.initializers or name in self.constants

    def const_value(self, name: str) -> np.ndarray | None:
        if name in self.arrays and name in self.initializers:
            return self.arrays[name]
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.constants.get(name)
        if node is not None:
            for a in node.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
                if a.name == "value_float":
                    return np.asarray(a.f, np.float32)
                if a.name == "value_floats":
                    return np.asarray(list(a.floats), np.float32)
        return None

    def shape(self, name: str) -> tuple[int, ...] | None:
        s = self.shapes.get(name)
        return s[0] if s else None

    def elem_type(self, name: str) -> int | None:
        s = self.shapes.get(name)
        return s[1] if s else None

    def nbytes(self, name: str) -> int:
        shp = self.shape(name)
        if not shp or any(d < 0 for d in shp):
            return 0
        return int(np.prod(shp, dtype=np.int64)) * 4

    def attr(self, node: onnx.NodeProto, name: str, default=None):
        for a in node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default

    def opset(self) -> int:
        for o in self.model.opset_import:
            if o.domain in ("", "ai.onnx"):
                return int(o.version)
        return 0
