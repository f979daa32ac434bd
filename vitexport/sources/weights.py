"""Loading weights: safetensors first; a ``.pt/.pth`` state_dict only through
``torch.load(weights_only=True)``; a pickle with code in it is refused unless trusted explicitly."""
from __future__ import annotations

import pickle
from pathlib import Path

import torch
from torch import nn

from ..errors import BadInput

__all__ = ["read_state_dict", "load_weights"]

_NESTED_KEYS = ("state_dict", "model", "model_state_dict", "module", "ema")


def read_state_dict(path: str | Path, trust_pickle: bool = False) -> dict[str, torch.Tensor]:
    """Read a state dict from ``.safetensors`` or a torch checkpoint.

    Raises:
        BadInput: missing, empty, truncated or corrupt file; a pickle that needs code execution
            (unless ``trust_pickle``); a checkpoint that holds no tensors.
    """
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"weights file not found: {p}")
    if p.stat().st_size == 0:
        raise BadInput(f"weights file is empty: {p}")
    if p.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return dict(load_file(str(p)))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise BadInput(f"{p}: not a readable safetensors file ({str(exc).splitlines()[0][:120]})") from None
    if p.suffix not in {".pt", ".pth", ".bin", ".ckpt"}:
        raise BadInput(f"{p}: unsupported weights format '{p.suffix}' (use .safetensors, .pt or .pth)")
    try:
        obj = torch.load(str(p), map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError as exc:
        if "weights_only" in str(exc) or "Unsupported global" in str(exc) or "GLOBAL" in str(exc):
            raise BadInput(
                f"{p}: checkpoint is a pickle that needs code execution; refused (convert it to "
                f".safetensors, or pass --trust-pickle if you trust its source)"
            ) from None
        raise BadInput(f"{p}: corrupt or truncated checkpoint ({str(exc).splitlines()[0][:120]})") from None
    except (RuntimeError, EOFError, OSError, ValueError, AttributeError, ModuleNotFoundError) as exc:
        raise BadInput(f"{p}: corrupt or truncated checkpoint ({str(exc).splitlines()[0][:120]})") from None
    for key in _NESTED_KEYS:
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if isinstance(obj, nn.Module):
        obj = obj.state_dict()
    if not isinstance(obj, dict) or not any(isinstance(v, torch.Tensor) for v in obj.values()):
        raise BadInput(f"{p}: holds no state_dict of tensors")
    return {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}


def load_weights(model: nn.Module, path: str | Path, trust_pickle: bool = False) -> None:
    """Load a state dict into ``model`` strictly (a ``module.`` prefix from DataParallel is stripped).

    Raises:
        BadInput: unreadable file, or keys/shapes that do not match the model (the first few named).
    """
    sd = read_state_dict(path, trust_pickle)
    own = model.state_dict()
    if not set(sd) & set(own):
        for prefix in ("module.", "model."):
            stripped = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in sd.items()}
            if set(stripped) & set(own):
                sd = stripped
                break
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    if missing or unexpected:
        raise BadInput(
            f"{path}: weights do not match the model: {len(missing)} missing (e.g. {missing[:3]}), "
            f"{len(unexpected)} unexpected (e.g. {unexpected[:3]})"
        )
    bad = [k for k in sd if tuple(sd[k].shape) != tuple(own[k].shape)]
    if bad:
        k = bad[0]
        raise BadInput(f"{path}: tensor '{k}' has shape {tuple(sd[k].shape)}, the model wants {tuple(own[k].shape)}")
    model.load_state_dict(sd, strict=True)
