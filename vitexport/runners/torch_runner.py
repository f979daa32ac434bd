"""Run an ``nn.Module`` on numpy feeds; outputs are flattened the way the exporter sees them."""
from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from .base import BaseRunner, InputSpec, feed_size

__all__ = ["TorchRunner", "primary_output", "tensor_outputs", "SINGLE_OUTPUT"]

#: the name of a model's only output, whatever the model called it: every runner names it so
SINGLE_OUTPUT = "output"


def _kind(v) -> str:
    return "None" if v is None else type(v).__name__


def tensor_outputs(out) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Every tensor a forward returned, by name, in the model's order, and what was left out.

    A tensor is ``output``; a dict or Hugging Face output keeps its keys (in their order); a tuple
    or list is ``output_0``, ``output_1``, ... Entries that are not tensors (None, a tuple of hidden
    states, ``past_key_values``) have no ONNX output to become: they are returned as
    ``'name (type)'`` for the caller to say so.

    Raises:
        TypeError: the output holds no tensor at its top level.
    """
    if isinstance(out, torch.Tensor):
        return {SINGLE_OUTPUT: out}, []
    if isinstance(out, Mapping):  # a Hugging Face ModelOutput is an OrderedDict
        items = [(str(k), v) for k, v in out.items()]
    elif isinstance(out, (tuple, list)):
        items = [(f"output_{i}", v) for i, v in enumerate(out)]
    elif hasattr(out, "to_tuple"):
        items = [(f"output_{i}", v) for i, v in enumerate(out.to_tuple())]
    else:
        raise TypeError(f"model output of type {type(out).__name__} holds no tensor")
    # a 0-d tensor (a loss) has no sample axis for parity to compare by: left out like a non-tensor
    kept = {k: v for k, v in items if isinstance(v, torch.Tensor) and v.dim() > 0}
    if not kept:
        raise TypeError(f"model output of type {type(out).__name__} holds no tensor at its top level")
    return kept, [f"{k} ({'0-d tensor' if isinstance(v, torch.Tensor) else _kind(v)})" for k, v in items if k not in kept]


def primary_output(out) -> torch.Tensor:
    """A model's exported output: ``logits`` of a dict / HF output, else the first tensor."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "logits") and isinstance(getattr(out, "logits"), torch.Tensor):
        return out.logits
    if isinstance(out, dict):
        if isinstance(out.get("logits"), torch.Tensor):
            return out["logits"]
        for v in out.values():
            try:
                return primary_output(v)
            except TypeError:
                continue
    if isinstance(out, (tuple, list)):
        for v in out:
            try:
                return primary_output(v)
            except TypeError:
                continue
    if hasattr(out, "to_tuple"):
        return primary_output(out.to_tuple())
    raise TypeError(f"model output of type {type(out).__name__} holds no tensor")


class TorchRunner(BaseRunner):
    """Eval-mode, no-grad inference of a module whose inputs are ``example_inputs``' names."""

    engine = "torch"

    def __init__(self, module: torch.nn.Module, example_inputs: dict[str, torch.Tensor], name: str | None = None):
        super().__init__(name)
        self.module = module
        self.example_inputs = example_inputs
        self.batch_agnostic = True
        self.group = 64

    def activate_impl(self) -> None:
        self.module.eval()

    def input_specs_impl(self) -> list[InputSpec]:
        return [
            InputSpec(k, tuple(-1 if i == 0 else d for i, d in enumerate(v.shape)), np.dtype(str(v.dtype).replace("torch.", "")))
            for k, v in self.example_inputs.items()
        ]

    def infer_many(self, feeds) -> list[dict[str, np.ndarray]]:
        """Group small batches into chunks of up to ``group`` samples: a fixed-batch ONNX needs
        batch-1 feeds, but eager torch pays its per-call overhead per batch (400 batch-1 calls of a
        tiny ViT cost seconds). A model that rejects the larger batch is run feed by feed."""
        feeds = list(feeds)
        if len(feeds) < 2 or not self.batch_agnostic:
            return super().infer_many(feeds)
        sizes = [feed_size(f) for f in feeds]
        out: list[dict[str, np.ndarray]] = []
        i = 0
        try:
            while i < len(feeds):
                j, n = i, 0
                while j < len(feeds) and (n == 0 or n + sizes[j] <= self.group):
                    n += sizes[j]
                    j += 1
                merged = {k: np.concatenate([f[k] for f in feeds[i:j]]) for k in feeds[i]}
                res = self.infer(merged)
                splits = np.cumsum(sizes[i:j])[:-1]
                parts = {k: np.split(v, splits) for k, v in res.items()}
                out.extend({k: parts[k][m] for k in parts} for m in range(j - i))
                i = j
        except (RuntimeError, ValueError, IndexError):
            self.batch_agnostic = False
            return super().infer_many(feeds)
        return out

    def infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.no_grad():
            tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in feed.items()}
            out = self.module(**tensors)
        names = getattr(self.module, "output_names", None)  # an OutputAdapter's: several outputs as a tuple
        if names and isinstance(out, tuple) and len(names) == len(out):
            named = dict(zip(names, out))
        else:
            named, _ = tensor_outputs(out)
            named = {SINGLE_OUTPUT: next(iter(named.values()))} if len(named) == 1 else named
        return {k: v.detach().float().cpu().numpy() for k, v in named.items()}
