"""Loading weights, the format told by content, not by name: safetensors first; a torch
checkpoint only through ``torch.load(weights_only=True)``; a pickle with code in it is refused
unless trusted explicitly. Names, shapes and dtypes are checked against the model's own."""
from __future__ import annotations

import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from ..errors import BadInput, one_line

__all__ = ["read_state_dict", "load_weights", "load_state", "sniff_format"]

_NESTED_KEYS = ("state_dict", "model", "model_state_dict", "module", "ema")


def sniff_format(path: Path) -> str:
    """What a weights file holds, by its first bytes (never by its name).

    Returns:
        ``'safetensors'`` (an 8-byte header length, then JSON), ``'zip'`` (a torch checkpoint, or
        an ``.npz``), ``'pickle'`` (a legacy torch checkpoint) or ``'unknown'``.
    """
    with open(path, "rb") as fh:
        head = fh.read(9)
    size = path.stat().st_size
    if len(head) == 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= size - 8:
        return "safetensors"
    if head[:4] == b"PK\x03\x04":
        return "zip"
    if head[:1] == b"\x80" or head[:1] in (b"(", b"}", b"]"):  # pickle protocol 2+ / protocol 0-1
        return "pickle"
    return "unknown"


def _check_file(p: Path) -> None:
    if p.is_dir():
        inside = sorted(q.name for q in p.iterdir() if q.suffix in {".safetensors", ".pt", ".pth", ".bin"})[:3]
        hint = f" (it holds {', '.join(inside)})" if inside else ""
        raise BadInput(f"--weights {p} is a directory; give the weights file itself{hint}")
    if not p.exists():
        raise BadInput(f"weights file not found: {p}")
    if not p.is_file():
        raise BadInput(f"--weights {p} is not a regular file (a pipe or device?); give a .safetensors or .pt file")
    if p.stat().st_size == 0:
        raise BadInput(f"weights file is empty: {p}")


def _read_safetensors(p: Path) -> dict[str, torch.Tensor]:
    try:
        return dict(load_file(str(p)))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise BadInput(f"{p}: not a readable safetensors file ({one_line(str(exc), 120)})") from None


def _read_checkpoint(p: Path, trust_pickle: bool) -> object:
    try:
        # a file object, not the path: torch.load picks a loader by the file's name otherwise
        with open(p, "rb") as fh:
            return torch.load(fh, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError as exc:
        if "weights_only" in str(exc) or "Unsupported global" in str(exc) or "GLOBAL" in str(exc):
            raise BadInput(
                f"{p}: checkpoint is a pickle that needs code execution; refused (convert it to "
                f".safetensors, or pass --trust-pickle if you trust its source)"
            ) from None
        raise BadInput(f"{p}: corrupt or truncated checkpoint ({one_line(str(exc), 120)})") from None
    except (RuntimeError, EOFError, OSError, ValueError, AttributeError, ModuleNotFoundError) as exc:
        raise BadInput(f"{p}: corrupt or truncated checkpoint ({one_line(str(exc), 120)})") from None


def read_state_dict(path: str | Path, trust_pickle: bool = False) -> dict[str, torch.Tensor]:
    """Read a state dict from a safetensors file or a torch checkpoint, told apart by content.

    Raises:
        BadInput: missing, empty, truncated or corrupt file; a directory or a pipe; a file that is
            neither format; a pickle that needs code execution (unless ``trust_pickle``); a
            checkpoint that holds no tensors.
    """
    p = Path(path)
    _check_file(p)
    kind = sniff_format(p)
    if kind == "safetensors":
        return _read_safetensors(p)
    if kind == "unknown":
        if p.suffix == ".safetensors":
            raise BadInput(f"{p}: not a readable safetensors file (no safetensors header)")
        raise BadInput(f"{p}: neither a safetensors file nor a torch checkpoint (use .safetensors, or a state_dict saved with torch.save)")
    if kind == "zip" and p.suffix == ".npz":
        raise BadInput(f"{p}: an .npz data file, not weights (use .safetensors, or a state_dict saved with torch.save)")
    obj = _read_checkpoint(p, trust_pickle)
    for key in _NESTED_KEYS:
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if isinstance(obj, nn.Module):
        obj = obj.state_dict()
    if not isinstance(obj, dict) or not any(isinstance(v, torch.Tensor) for v in obj.values()):
        raise BadInput(f"{p}: holds no state_dict of tensors")
    return {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}


def _dtype_kind(t: torch.Tensor) -> str:
    if t.dtype.is_floating_point:
        return "float"
    if t.dtype.is_complex:
        return "complex"
    return "integer"


def load_weights(model: nn.Module, path: str | Path, trust_pickle: bool = False) -> None:
    """Load a state dict into ``model`` strictly (a ``module.`` prefix from DataParallel is stripped).

    Raises:
        BadInput: unreadable file, or keys/shapes that do not match the model (the first few named).
    """
    load_state(model, read_state_dict(path, trust_pickle), path)


def load_state(model: nn.Module, sd: dict[str, torch.Tensor], path: str | Path) -> None:
    """Load a state dict already read from ``path`` (named in errors) into ``model``, as :func:`load_weights`.

    Raises:
        BadInput: keys, shapes or dtypes that do not match the model (the first few named).
    """
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
    # loading copies into the model's own dtype: int64 into a float parameter would be truncated
    # silently and fail much later (in quantization); a float into an integer buffer likewise
    wrong = [k for k in sd if _dtype_kind(sd[k]) != _dtype_kind(own[k])]
    if wrong:
        k = wrong[0]
        more = f" (+{len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise BadInput(f"{path}: tensor '{k}' holds {str(sd[k].dtype).replace('torch.', '')} values, the model's "
                       f"is {str(own[k].dtype).replace('torch.', '')}{more}; were these weights saved from this model?")
    model.load_state_dict(sd, strict=True)
