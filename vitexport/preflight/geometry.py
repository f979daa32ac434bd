"""The memory one forward needs, measured on the model's own geometry without allocating it.

The model runs once on *fake* tensors (``torch._subclasses.FakeTensorMode``: shapes, dtypes and
strides, no data), under a dispatch mode that adds up the bytes of the tensors alive after every
operator. The peak is what this model at this input shape keeps alive at once: hierarchical and
windowed attention, a conv stem, pooling and all, with no guess about which module is attention
or how many tokens it sees. A ViT-Tiny at 224 peaks at 1.9 MB, GCViT-XXTiny at 12 MB, TinyViT-5M at
32 MB (the estimate this replaced assumed global attention over every stem pixel: 17.6-28 GB).

A forward that fake tensors cannot run (data-dependent Python such as ``if mask.all():``) yields
None; the caller then checks only what it can count exactly (the inputs).
"""
from __future__ import annotations

import contextlib
import copy
import functools
import gc
import logging
import warnings
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:  # pragma: no cover - torch is imported by the functions that need it
    import torch
    from torch import nn

__all__ = ["forward_peak_bytes"]

_log = logging.getLogger("vitexport.preflight")

#: torch's loggers that report, with a 30-line traceback at ERROR level, an operator a fake forward
#: could not run (``failed while attempting to run meta for aten.add.Tensor``): here that only means
#: "not measured", and the real forward after it says what went wrong, in one line
_TORCH_LOGGERS = ("torch._subclasses.fake_tensor", "torch.fx.experimental.symbolic_shapes")


@contextlib.contextmanager
def _torch_logs_silenced() -> Iterator[None]:
    """torch's fake-tensor loggers drop everything inside the block; their levels are restored after."""
    loggers = [logging.getLogger(name) for name in _TORCH_LOGGERS]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.CRITICAL + 1)
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _explicit_scores(func, args) -> int:
    """Bytes of the attention scores and probabilities a fused attention kernel never holds but the
    exported graph does: ONNX writes ``scaled_dot_product_attention`` as MatMul/Softmax/MatMul, and
    ONNX Runtime keeps both (B, H, L, S) matrices (timm's ViT-Tiny at 896: 2 x 118 MB)."""
    if "scaled_dot_product" not in str(func) or len(args) < 2:
        return 0
    q, k = args[0], args[1]
    if getattr(q, "ndim", 0) < 2 or getattr(k, "ndim", 0) < 2:
        return 0
    batch = 1
    for d in q.shape[:-2]:
        batch *= int(d)
    return 2 * batch * int(q.shape[-2]) * int(k.shape[-2]) * q.element_size()


def _live_bytes_mode():
    """A dispatch mode that tracks the bytes of live tensor storages and their peak."""
    # torch on first use: preflight loads with calibration, which ONNX-only work imports
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    import torch

    class LiveBytes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live: dict[StorageWeakRef, int] = {}
            self.current = self.peak = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for ref in [r for r in self.live if r.expired()]:  # freed since the last op
                self.current -= self.live.pop(ref)
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    storage = t.untyped_storage()
                    ref = StorageWeakRef(storage)
                    if ref not in self.live:
                        self.live[ref] = storage.nbytes()
                        self.current += storage.nbytes()
            self.peak = max(self.peak, self.current + _explicit_scores(func, args))
            return out

    return LiveBytes()


def forward_peak_bytes(model: "nn.Module", shapes: dict[str, tuple[int, ...]], dtypes: "dict[str, torch.dtype]",
                       keyword: bool) -> int | None:
    """Peak bytes of the tensors one ``model`` forward keeps alive at once (inputs and weights not
    counted), on fake inputs of ``shapes``; None when the forward cannot run on fake tensors.

    Args:
        model: the module as built; it is left untouched (the forward runs on a copy of its tree
            that shares its weights).
        shapes, dtypes: input name → shape / dtype.
        keyword: pass the inputs by name (else by position, in ``shapes``' order).
    """
    import torch  # torch on first use: preflight loads with calibration, which ONNX-only work imports
    from torch._subclasses.fake_tensor import FakeTensorMode

    caches = _lru_caches()
    try:
        model = _shallow_copy(model)
        model.eval()
        with _torch_logs_silenced(), torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True):
            inputs = {k: torch.empty(s, dtype=dtypes[k]) for k, s in shapes.items()}
            mode = _live_bytes_mode()
            with mode:
                model(**inputs) if keyword else model(*inputs.values())
        return mode.peak
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - on fake tensors a failure only means "not measured";
        # the real forward of the pre-flight check runs next and reports what the model does
        _log.debug("forward not measurable on fake tensors (%s: %s)", type(exc).__name__, str(exc)[:200])
        return None
    finally:
        _clear_filled(caches)


def _lru_caches() -> dict[int, tuple[object, int]]:
    """Every ``functools.lru_cache`` alive, with its miss count. ``isinstance`` on every live object reads
    ``__class__`` of module proxies too, and torch's deprecated ``torch.distributed.reduce_op`` warns then: on the
    user's terminal, about nothing they wrote."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return {id(o): (o, o.cache_info().misses) for o in gc.get_objects()
                if isinstance(o, functools._lru_cache_wrapper)}


def _clear_filled(before: dict[int, tuple[object, int]]) -> None:
    """Empty the lru caches the fake forward filled: Hugging Face BEiT caches its relative position
    index per window size across instances, and a fake tensor there breaks every later forward."""
    for key, (cache, misses) in _lru_caches().items():
        if key not in before or cache.cache_info().misses > before[key][1]:
            cache.cache_clear()


def _shallow_copy(model: "nn.Module") -> "nn.Module":
    """The module tree copied, its parameters and buffers shared (no weight is copied): a forward
    on fake tensors fills caches with fake tensors (ConViT's ``rel_indices``, LeViT's attention bias
    cache), which must never reach the model the pipeline runs."""
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo=shared)
