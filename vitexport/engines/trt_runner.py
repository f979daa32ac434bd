"""TensorRT runner. ``tensorrt`` is imported only inside this module's functions, never at package
import, so the package works where TensorRT is absent."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from .base import BaseRunner, InputSpec

__all__ = ["TensorRTRunner", "tensorrt_available"]


def tensorrt_available() -> bool:
    """True when the ``tensorrt`` package imports and a CUDA GPU is visible to torch."""
    if importlib.util.find_spec("tensorrt") is None:
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover - depends on the machine
        return False


class TensorRTRunner(BaseRunner):  # pragma: no cover - needs TensorRT and a GPU
    """Runs a serialized TensorRT engine (``.plan``) with torch CUDA tensors as buffers."""

    engine = "tensorrt"

    def __init__(self, engine_path: str | Path, name: str | None = None):
        super().__init__(name)
        self.engine_path = Path(engine_path)

    def activate_impl(self) -> None:
        import tensorrt as trt

        logger = trt.Logger(trt.Logger.WARNING)
        runtime = trt.Runtime(logger)
        self._engine = runtime.deserialize_cuda_engine(self.engine_path.read_bytes())
        self._context = self._engine.create_execution_context()
        self._trt = trt

    def deactivate_impl(self) -> None:
        self._context = None
        self._engine = None

    def _io(self, mode):
        trt = self._trt
        return [
            self._engine.get_tensor_name(i)
            for i in range(self._engine.num_io_tensors)
            if self._engine.get_tensor_mode(self._engine.get_tensor_name(i)) == mode
        ]

    def input_specs_impl(self) -> list[InputSpec]:
        trt = self._trt
        return [
            InputSpec(n, tuple(self._engine.get_tensor_shape(n)), np.dtype(trt.nptype(self._engine.get_tensor_dtype(n))))
            for n in self._io(trt.TensorIOMode.INPUT)
        ]

    def infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        trt = self._trt
        keep = []
        for name, arr in feed.items():
            t = torch.from_numpy(np.ascontiguousarray(arr)).cuda()
            keep.append(t)
            # engines built with a dynamic batch need the actual shape before outputs are sized
            self._context.set_input_shape(name, tuple(arr.shape))
            self._context.set_tensor_address(name, t.data_ptr())
        outs = {}
        for name in self._io(trt.TensorIOMode.OUTPUT):
            shape = tuple(self._context.get_tensor_shape(name))
            dtype = torch.from_numpy(np.zeros(0, dtype=trt.nptype(self._engine.get_tensor_dtype(name)))).dtype
            t = torch.empty(shape, dtype=dtype, device="cuda")
            outs[name] = t
            self._context.set_tensor_address(name, t.data_ptr())
        stream = torch.cuda.current_stream()
        self._context.execute_async_v3(stream.cuda_stream)
        stream.synchronize()
        values = {k: v.float().cpu().numpy() for k, v in outs.items()}
        if len(values) == 1:
            return {"output": next(iter(values.values()))}
        return values
