"""ONNX Runtime (CPU) runner."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from .base import BaseRunner, InputSpec

__all__ = ["OnnxRuntimeRunner", "ORT_TYPES", "QDQ_AS_FLOAT"]

#: session config that runs QuantizeLinear/DequantizeLinear as float ops instead of fusing them into
#: ONNX Runtime's x86 integer kernels: the fake-quantized arithmetic TensorRT or an NPU performs.
QDQ_AS_FLOAT: dict[str, str] = {"session.disable_quant_qdq": "1"}

ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
    "tensor(uint8)": np.uint8,
    "tensor(int8)": np.int8,
}


class OnnxRuntimeRunner(BaseRunner):
    """An ``onnxruntime.InferenceSession`` on the CPU provider.

    Args:
        model: path to an ONNX file, or its serialized bytes.
        threads: intra-op threads (0 lets ONNX Runtime decide).
        output_names: outputs to fetch (default: the graph outputs, first one named ``output``
            when the graph has a single output, so runners compare by name).
        config: session config entries (``SessionOptions.add_session_config_entry``), e.g.
            ``{"session.disable_quant_qdq": "1"}`` to run a Q/DQ graph as float ops (fake quantization,
            what TensorRT or an NPU computes) instead of ONNX Runtime's fused x86 integer kernels.
    """

    engine = "onnxruntime"

    def __init__(self, model: str | Path | bytes, threads: int = 0, output_names: list[str] | None = None,
                 optimization: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                 name: str | None = None, config: dict[str, str] | None = None):
        super().__init__(name)
        self.config = dict(config or {})
        self.model = str(model) if isinstance(model, Path) else model
        self.threads = threads
        self.output_names = output_names
        self.optimization = optimization
        self.session: ort.InferenceSession | None = None

    def activate_impl(self) -> None:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = self.optimization
        opts.log_severity_level = 3
        for key, value in self.config.items():
            opts.add_session_config_entry(key, str(value))
        self.session = ort.InferenceSession(self.model, opts, providers=["CPUExecutionProvider"])

    def deactivate_impl(self) -> None:
        self.session = None

    def input_specs_impl(self) -> list[InputSpec]:
        assert self.session is not None
        return [
            InputSpec(i.name, tuple(d if isinstance(d, int) else -1 for d in i.shape), np.dtype(ORT_TYPES.get(i.type, np.float32)))
            for i in self.session.get_inputs()
        ]

    def infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self.session is not None
        graph_outputs = [o.name for o in self.session.get_outputs()]
        names = self.output_names or graph_outputs
        values = self.session.run(names, feed)
        if self.output_names is None and len(names) == 1:
            return {"output": values[0]}
        return dict(zip(names, values))
