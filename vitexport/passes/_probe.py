"""Running a model once on the example inputs to see what its modules receive.

The passes decide from one probe run which attention modules get a mask and what a LayerNorm's output
feeds. Masks that are model inputs are made non-trivial for the probe: Hugging Face skips building a
mask for an all-ones ``attention_mask`` outside of tracing, and the example inputs are often all ones.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["probe_inputs", "record_calls", "run_model"]


def probe_inputs(example_inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The example inputs with every 2-D integer/boolean ``*mask*`` input's last column flipped.

    The flip gives at least one masked (or unmasked) key per row whatever the mask's convention, so
    the mask path of the model runs during the probe.
    """
    out = {}
    for name, value in example_inputs.items():
        if (
            "mask" in name.lower()
            and isinstance(value, torch.Tensor)
            and value.dim() == 2
            and value.shape[-1] > 1
            and not value.is_floating_point()
        ):
            value = value.clone()
            value[:, -1] = ~value[:, -1] if value.dtype == torch.bool else 1 - value[:, -1]
        out[name] = value
    return out


def run_model(model: nn.Module, inputs: dict[str, torch.Tensor]) -> Any:
    """``model(**inputs)`` without gradients."""
    with torch.no_grad():
        return model(**inputs)


def record_calls(
    model: nn.Module, inputs: dict[str, torch.Tensor], modules: dict[str, nn.Module], max_calls: int = 2
) -> tuple[dict[str, list[tuple[tuple, dict[str, Any]]]], Any]:
    """Run ``model`` once and record the first ``max_calls`` calls ``(args, kwargs)`` of each module.

    Returns:
        (module name -> recorded calls, the model's output).
    """
    calls: dict[str, list[tuple[tuple, dict[str, Any]]]] = {}
    handles = []

    def make_hook(name: str):
        def hook(module, args, kwargs):
            seen = calls.setdefault(name, [])
            if len(seen) < max_calls:
                seen.append((tuple(args), dict(kwargs)))

        return hook

    try:
        for name, module in modules.items():
            handles.append(module.register_forward_pre_hook(make_hook(name), with_kwargs=True))
        output = run_model(model, inputs)
    finally:
        for h in handles:
            h.remove()
    return calls, output
