"""Which modules are layers (:func:`block_names`) and the probes that run a model and return per-layer
activations: forward hooks on a torch module, extra graph outputs of an ONNX model.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
import onnx

from ...runners.ort_runner import OnnxRuntimeRunner
from ..onnx_graph import OnnxGraph

__all__ = ['LayerProbe', 'TorchLayerProbe', 'OnnxLayerProbe', 'block_names', 'make_torch_probe']


# --- which modules are layers ----------------------------------------------------------------------
def block_names(module) -> list[str]:
    """Qualified names of the network's repeated blocks, in definition order.

    A block is a child of an ``nn.Sequential`` / ``nn.ModuleList`` holding at least two children of
    the same class that have parameters; only the outermost such blocks are kept (a block's own
    MLP ``Sequential`` is not a list of blocks).
    """
    import torch.nn as nn  # torch loads on first use (~2 s, 0.5 GB): comparing ONNX files never needs it

    names: list[str] = []
    taken: list[str] = []
    for qual, mod in module.named_modules():
        if not isinstance(mod, (nn.Sequential, nn.ModuleList)):
            continue
        if any(qual == t or qual.startswith(t + ".") for t in taken):
            continue
        kids = list(mod.named_children())
        if len(kids) < 2:
            continue
        by_type: dict[type, int] = {}
        for _, k in kids:
            if any(True for _ in k.parameters()) and any(True for _ in k.children()):
                by_type[type(k)] = by_type.get(type(k), 0) + 1
        if not by_type or max(by_type.values()) < 2:
            continue
        kind = max(by_type, key=lambda t: by_type[t])
        for child, k in kids:
            if type(k) is kind:
                full = f"{qual}.{child}" if qual else child
                names.append(full)
                taken.append(full)
    return names


# --- probes: run a model, return per-layer activations ---------------------------------------------
class LayerProbe(Protocol):
    """Runs a model on feeds and returns layer name → activations (concatenated over batches)."""

    engine: str

    def layer_names(self) -> list[str]: ...

    def run(self, feeds: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]: ...


def _first_tensor(obj):
    import torch  # torch loads on first use (~2 s, 0.5 GB): comparing ONNX files never needs it

    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, Mapping):
        obj = list(obj.values())
    if hasattr(obj, "to_tuple"):
        obj = obj.to_tuple()
    if isinstance(obj, (list, tuple)):
        for v in obj:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


class TorchLayerProbe:
    """Forward hooks on named modules of a torch model, run in eval mode without grad (the module's
    training flag is restored afterwards). A module's first tensor output is its activation."""

    engine = "torch"

    def __init__(self, module, layers: Sequence[str] | None = None):
        self.module = module
        self.layers = list(layers) if layers is not None else block_names(module)

    def layer_names(self) -> list[str]:
        return list(self.layers)

    def run(self, feeds: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        import torch  # torch loads on first use (~2 s, 0.5 GB): comparing ONNX files never needs it

        mods = dict(self.module.named_modules())
        acts: dict[str, list[np.ndarray]] = {}
        current: dict[str, np.ndarray] = {}
        handles = []

        def hook(name):
            def fn(_mod, _inp, output):
                t = _first_tensor(output)
                if t is not None:
                    current[name] = t.detach().float().cpu().numpy().copy()
            return fn

        for name in self.layers:
            if name in mods:
                handles.append(mods[name].register_forward_hook(hook(name)))
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad():
                for feed in feeds:
                    current.clear()
                    self.module(**{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in feed.items()})
                    for k, v in current.items():
                        acts.setdefault(k, []).append(v)
        finally:
            for h in handles:
                h.remove()
            self.module.train(was_training)
        return {k: np.concatenate(v, axis=0) for k, v in acts.items()}


class OnnxLayerProbe:
    """Observes chosen tensors of an ONNX model (as extra graph outputs) with ONNX Runtime (CPU)."""

    engine = "onnxruntime"

    def __init__(self, model: str | Path | bytes | onnx.ModelProto, tensors: Mapping[str, str],
                 graph: OnnxGraph | None = None):
        self.graph = graph or OnnxGraph.load(model)
        self.tensors = dict(tensors)

    def layer_names(self) -> list[str]:
        return list(self.tensors)

    def run(self, feeds: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        names = list(dict.fromkeys(self.tensors.values()))
        if not names:
            return {}
        runner = OnnxRuntimeRunner(self.graph.model, output_names=names, name="onnx-layers")
        with runner:
            got = runner.infer_batches(feeds)
        return {layer: got[t] for layer, t in self.tensors.items()}


def make_torch_probe(runner_or_module, layers: Any = True) -> LayerProbe:
    """A probe from ``True`` (the module's blocks), a list of names, or a probe (returned as is)."""
    if hasattr(layers, "run") and hasattr(layers, "layer_names"):
        return layers
    module = getattr(runner_or_module, "module", runner_or_module)
    if not hasattr(module, "named_modules"):
        raise TypeError(f"per-layer capture needs a torch module, got {type(module).__name__}")
    return TorchLayerProbe(module, None if layers is True else list(layers))
