"""The ONNX reference evaluator (``onnx.reference``): slow, but independent of ONNX Runtime.

Useful for small graphs, to tell an ONNX Runtime bug from an exporter bug.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from .base import BaseRunner, InputSpec

__all__ = ["OnnxReferenceRunner"]


class OnnxReferenceRunner(BaseRunner):
    engine = "onnx-reference"

    def __init__(self, model: str | Path | onnx.ModelProto, name: str | None = None):
        super().__init__(name)
        self.model = model
        self.evaluator: ReferenceEvaluator | None = None
        self.proto: onnx.ModelProto | None = None

    def activate_impl(self) -> None:
        self.proto = self.model if isinstance(self.model, onnx.ModelProto) else onnx.load(str(self.model))
        self.evaluator = ReferenceEvaluator(self.proto)

    def deactivate_impl(self) -> None:
        self.evaluator = None

    def input_specs_impl(self) -> list[InputSpec]:
        assert self.proto is not None
        init = {i.name for i in self.proto.graph.initializer}
        specs = []
        for i in self.proto.graph.input:
            if i.name in init:
                continue
            tt = i.type.tensor_type
            shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
            specs.append(InputSpec(i.name, shape, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))))
        return specs

    def infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self.evaluator is not None and self.proto is not None
        names = [o.name for o in self.proto.graph.output]
        values = self.evaluator.run(None, feed)
        if len(names) == 1:
            return {"output": np.asarray(values[0])}
        return {n: np.asarray(v) for n, v in zip(names, values)}
