"""A model cut in two where its integer inputs stop: the part that only reads token ids and masks
(embedding lookups, mask casts and expands) and the float part that reads what it produces.

An NPU runs float and quantized tensor work; the integer prefix (a ``Gather`` from token ids, a
``Cast`` of an attention mask to bool, its ``Expand`` to the scores' shape) is what its compiler
leaves to the CPU (rknn-toolkit2 runs each such op as a CPU task between NPU tasks). Cut off, the
prefix runs once on the host before the NPU model, whose inputs are then the prefix's outputs:
:func:`split_integer_prefix` writes both parts, and :class:`IntegerPrefix` turns a feed of the
original inputs into a feed of the NPU part's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np
import onnx
import onnx.utils

from ..runners.sessions import LOW_MEMORY, Session

__all__ = ["IntegerPrefix", "split_integer_prefix"]

_FLOAT = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)


@dataclass
class IntegerPrefix:
    """The host part of a split model.

    Attributes:
        path: the host part (``host.onnx``): the original integer inputs → :attr:`outputs`.
        inputs: the original inputs it reads.
        outputs: the values it hands the NPU part (that part's inputs, with :attr:`passed` ones).
        passed: original inputs the NPU part reads as they are (float inputs).
        ops: the op types it runs, in graph order.
    """

    path: Path
    inputs: list[str]
    outputs: list[str]
    passed: list[str]
    ops: list[str] = field(default_factory=list)
    _session: Session | None = field(default=None, repr=False)

    def feed(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The NPU part's feed for one feed of the original model."""
        if self._session is None:
            self._session = Session(self.path, LOW_MEMORY)
        values = self._session.run(self.outputs, {k: feed[k] for k in self.inputs})
        return {**{k: feed[k] for k in self.passed}, **dict(zip(self.outputs, values))}

    def to_dict(self) -> dict:
        return {"file": self.path.name, "inputs": self.inputs, "outputs": self.outputs, "ops": self.ops}


def _data_inputs(node: onnx.NodeProto, consts: set[str]) -> list[str]:
    return [i for i in node.input if i and i not in consts]


def _prefix(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes whose data inputs are all non-float values of the integer inputs' prefix."""
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    consts = {t.name for t in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    reached = {v.name for v in graph.input if types.get(v.name) not in _FLOAT}
    nodes = []
    for node in graph.node:
        data = _data_inputs(node, consts)
        if data and all(d in reached and types.get(d) not in _FLOAT for d in data):
            nodes.append(node)
            reached.update(node.output)
    return nodes


def split_integer_prefix(model_path: str | Path, npu_path: str | Path, host_path: str | Path) -> IntegerPrefix | None:
    """Cut ``model_path`` where its integer inputs' prefix ends (see the module docstring).

    Args:
        model_path: the whole model.
        npu_path: where the float part goes (the prefix's outputs are its inputs).
        host_path: where the prefix goes.
    Returns:
        The prefix, or None when the model has no integer input (nothing is written then).
    """
    model = onnx.shape_inference.infer_shapes(onnx.load(str(model_path)))
    graph = model.graph
    nodes = _prefix(graph)
    if not nodes:
        return None
    inside = {id(n) for n in nodes}
    readers = {i for n in graph.node if id(n) not in inside for i in n.input} | {o.name for o in graph.output}
    outputs = list(dict.fromkeys(o for n in nodes for o in n.output if o in readers))
    consts = {t.name for t in graph.initializer}
    originals = [v.name for v in graph.input if v.name not in consts]
    prefix_inputs = {i for n in nodes for i in n.input}
    host_inputs = [n for n in originals if n in prefix_inputs]
    passed = [n for n in originals if n not in host_inputs and n in readers]
    extractor = onnx.utils.Extractor(model)
    onnx.save(extractor.extract_model(host_inputs, outputs), str(host_path))
    npu = extractor.extract_model(passed + outputs, [o.name for o in graph.output])
    onnx.save(npu, str(npu_path))
    return IntegerPrefix(Path(host_path), host_inputs, outputs, passed, [n.op_type for n in nodes])
