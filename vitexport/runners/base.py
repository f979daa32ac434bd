"""One interface for every runtime (Polygraphy's BaseRunner shape).

``activate() / infer(feed) -> outputs / deactivate()``, usable as a context manager. The base class
checks input names, shapes and dtypes against the runner's declared inputs; subclasses implement only
``activate_impl``, ``infer_impl``, ``deactivate_impl`` and ``input_specs_impl``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..errors import BadInput

__all__ = ["InputSpec", "BaseRunner", "feed_size"]


def feed_size(feed: Mapping[str, Any]) -> int:
    """The number of samples in a feed (input name → array or tensor, samples along axis 0)."""
    return int(next(iter(feed.values())).shape[0])


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


class BaseRunner:
    """Base of all runners. ``name`` says which engine produced an output (parity.json ``engine``)."""

    engine: str = "base"

    def __init__(self, name: str | None = None):
        self.name = name or self.engine
        self.is_active = False

    # --- subclass hooks -------------------------------------------------------------------------
    def activate_impl(self) -> None:
        raise NotImplementedError

    def input_specs_impl(self) -> list[InputSpec]:
        raise NotImplementedError

    def infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def deactivate_impl(self) -> None:
        pass

    # --- public API ------------------------------------------------------------------------------
    def activate(self) -> "BaseRunner":
        if not self.is_active:
            self.activate_impl()
            self.is_active = True
        return self

    def deactivate(self) -> None:
        if self.is_active:
            self.deactivate_impl()
            self.is_active = False

    def __enter__(self) -> "BaseRunner":
        return self.activate()

    def __exit__(self, *exc) -> None:
        self.deactivate()

    def input_specs(self) -> list[InputSpec]:
        return self.input_specs_impl()

    def infer(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch. Raises BadInput when names or (static) shapes do not match the model."""
        if not self.is_active:
            raise RuntimeError(f"runner {self.name} used before activate()")
        specs = {s.name: s for s in self.input_specs()}
        missing = sorted(set(specs) - set(feed))
        extra = sorted(set(feed) - set(specs))
        if missing or extra:
            raise BadInput(
                f"{self.name}: input names do not match the model: missing {missing}, unexpected {extra}"
            )
        checked: dict[str, np.ndarray] = {}
        for name, spec in specs.items():
            arr = np.asarray(feed[name])
            if len(arr.shape) != len(spec.shape) or any(
                want > 0 and want != got for want, got in zip(spec.shape, arr.shape)
            ):
                raise BadInput(
                    f"{self.name}: input '{name}' has shape {tuple(arr.shape)}, the model expects {spec.shape}"
                )
            if spec.dtype is not None and arr.dtype != spec.dtype:
                arr = arr.astype(spec.dtype)
            checked[name] = arr
        return self.infer_impl(checked)

    def infer_many(self, feeds) -> list[dict[str, np.ndarray]]:
        """Run several batches; one output dict per batch. Subclasses may group batches for speed."""
        return [self.infer(feed) for feed in feeds]

    def infer_batches(self, feeds) -> dict[str, np.ndarray]:
        """Run several batches and concatenate each output along axis 0."""
        outs: dict[str, list[np.ndarray]] = {}
        for out in self.infer_many(list(feeds)):
            for k, v in out.items():
                outs.setdefault(k, []).append(v)
        return {k: np.concatenate(v, axis=0) for k, v in outs.items()}
