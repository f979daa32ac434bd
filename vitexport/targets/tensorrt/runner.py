"""TensorRT through Polygraphy, NVIDIA's own loaders and runner (the ``tensorrt`` extra:
``pip install 'vitexport[tensorrt]'``).

Neither ``tensorrt`` nor ``polygraphy`` is imported at package import: only inside these functions,
once :func:`require_tensorrt` has found both and a GPU, so the package works where they are absent
and says so in one line where they are needed.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from ...errors import BadInput
from ...runners.base import BaseRunner, InputSpec

__all__ = ["TensorRTRunner", "tensorrt_available", "tensorrt_missing", "require_tensorrt", "polygraphy_error"]


def tensorrt_missing() -> list[str]:
    """What the TensorRT path lacks here: any of ``tensorrt``, ``polygraphy``, ``a CUDA GPU``."""
    # a spec without an origin is a namespace package: a bare folder of that name on sys.path (pytest puts
    # tests/targets/ there, which holds tests/targets/tensorrt/), not the installed package
    missing = [m for m in ("tensorrt", "polygraphy") if getattr(importlib.util.find_spec(m), "origin", None) is None]
    try:
        import torch  # torch only to ask for a CUDA device

        gpu = bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover - a broken CUDA install reads as no GPU
        gpu = False
    return missing + ([] if gpu else ["a CUDA GPU"])


def tensorrt_available() -> bool:
    """True when ``tensorrt`` and ``polygraphy`` import and a CUDA GPU is visible."""
    return not tensorrt_missing()


def require_tensorrt(what: str) -> None:
    """Raise :class:`BadInput` naming what ``what`` (e.g. "building a TensorRT engine") lacks here.

    Raises:
        BadInput: the ``tensorrt`` package, ``polygraphy`` or a GPU is missing.
    """
    missing = tensorrt_missing()
    if missing:
        raise BadInput(f"{what} needs the 'tensorrt' extra (tensorrt, polygraphy: pip install 'vitexport[tensorrt]') "
                       f"and an NVIDIA GPU; missing here: {', '.join(missing)}. On a Jetson, run build_engine.sh")


def polygraphy_error(exc: Exception, what: str) -> BadInput:
    """A Polygraphy / TensorRT failure as one line (its log, above, has the detail)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return BadInput(f"{what}: {lines[0] if lines else type(exc).__name__} (TensorRT's log above has the detail)")


def _active_trt_runner(path: Path, name: str):  # pragma: no cover - needs TensorRT
    from polygraphy.backend.trt import EngineFromPath, TrtRunner
    from polygraphy.exception import PolygraphyException

    runner = TrtRunner(EngineFromPath(str(path)), name=name)
    try:
        runner.activate()
    except PolygraphyException as exc:
        raise polygraphy_error(exc, f"{path}: cannot load the engine") from None
    return runner


class TensorRTRunner(BaseRunner):
    """A serialized TensorRT engine (``.plan``) run by Polygraphy's ``TrtRunner``.

    Args:
        engine_path: the engine file (built by :func:`.engine.build_engine` or trtexec).
        name: the runner's name in reports.
    """

    engine = "tensorrt"

    def __init__(self, engine_path: str | Path, name: str | None = None):
        super().__init__(name)
        self.engine_path = Path(engine_path)
        self._runner = None

    def activate_impl(self) -> None:
        require_tensorrt(f"running the TensorRT engine {self.engine_path.name}")
        if not self.engine_path.is_file():
            raise BadInput(f"{self.engine_path}: no such TensorRT engine file")
        self._runner = _active_trt_runner(self.engine_path, self.name)

    def deactivate_impl(self) -> None:
        if self._runner is not None:  # pragma: no cover - needs TensorRT
            self._runner.deactivate()
        self._runner = None

    def input_specs_impl(self) -> list[InputSpec]:  # pragma: no cover - needs TensorRT
        from polygraphy.datatype import DataType

        meta = self._runner.get_input_metadata(use_numpy_dtypes=False)
        return [InputSpec(name, tuple(d if isinstance(d, int) and d >= 0 else -1 for d in m.shape),
                          np.dtype(DataType.to_dtype(m.dtype, "numpy")))
                for name, m in meta.items()]

    def infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # pragma: no cover - needs TensorRT
        # the base class checked names and shapes; Polygraphy reuses its output buffers, so copy them
        outs = self._runner.infer({k: np.ascontiguousarray(v) for k, v in feed.items()}, check_inputs=False)
        values = {k: np.array(v, dtype=np.float32 if v.dtype == np.float16 else v.dtype, copy=True)
                  for k, v in outs.items()}
        if len(values) == 1:  # one output is named "output", as every runner names it
            return {"output": next(iter(values.values()))}
        return values
