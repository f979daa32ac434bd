"""ONNX Runtime (CPU) runner: the runner interface over a :class:`~vitexport.runners.sessions.Session`."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from .base import BaseRunner, InputSpec
from .sessions import ORT_TYPES, QDQ_AS_FLOAT, Session, SessionConfig

__all__ = ["OnnxRuntimeRunner", "ORT_TYPES", "QDQ_AS_FLOAT"]


class OnnxRuntimeRunner(BaseRunner):
    """An ONNX Runtime session on the CPU provider, behind the runner interface.

    Args:
        model: an ONNX file, serialised bytes, a ``ModelProto`` or an ``ir.Model``.
        output_names: outputs to fetch (default: the graph outputs, the only one named ``output``
            when the graph has a single output, so runners compare by name).
        config: how the session runs (default: every optimisation). ``QDQ_AS_FLOAT`` runs a Q/DQ
            graph as float ops (fake quantisation, what TensorRT or an NPU computes) instead of
            ONNX Runtime's fused x86 integer kernels.
        threads: intra-op threads, when no ``config`` is given.
    """

    engine = "onnxruntime"

    def __init__(self, model: str | Path | bytes | onnx.ModelProto | ir.Model, threads: int = 0,
                 output_names: list[str] | None = None, name: str | None = None, config: SessionConfig | None = None):
        super().__init__(name)
        self.config = config or SessionConfig(threads=threads)
        self.model = model
        self.output_names = output_names
        self.session: Session | None = None

    def activate_impl(self) -> None:
        self.session = Session(self.model, self.config, outputs=self.output_names)

    def deactivate_impl(self) -> None:
        self.session = None

    def input_specs_impl(self) -> list[InputSpec]:
        assert self.session is not None
        return [
            InputSpec(i.name, tuple(d if isinstance(d, int) else -1 for d in i.shape), np.dtype(ORT_TYPES.get(i.type, np.float32)))
            for i in self.session.inputs
        ]

    def infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self.session is not None
        names = self.session.output_names
        values = self.session.run(names, feed)
        if self.output_names is None and len(names) == 1:
            return {"output": values[0]}
        return dict(zip(names, values))
