"""``python:PATH.py:FUNCTION`` — a user's own file; the function builds the model.

The function returns an ``nn.Module`` or ``(module, example_inputs)``, ``example_inputs`` being a
dict name → tensor that fixes the input names, shapes and dtypes.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

from ..errors import BadInput

__all__ = ["load_python"]


def load_python(spec: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor] | None, Path, str]:
    """Import ``PATH.py`` and call ``FUNCTION()``.

    Returns:
        (module, example_inputs or None, path, function name).
    Raises:
        BadInput: malformed spec, missing file, missing function, wrong return type.
    """
    path_text, sep, func = spec.rpartition(":")
    if not sep or not path_text or not func:
        raise BadInput(f"python:{spec}: expected python:PATH.py:FUNCTION")
    path = Path(path_text)
    if not path.is_file():
        raise BadInput(f"python model file not found: {path}")
    mod_name = f"vitexport_user_{abs(hash(str(path.resolve())))}"
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise BadInput(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise BadInput(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from None
    except ImportError as exc:
        raise BadInput(f"{path}: import failed: {exc}") from None
    fn = getattr(module, func, None)
    if not callable(fn):
        raise BadInput(f"{path}: no function '{func}'")
    result = fn()
    example = None
    if isinstance(result, tuple) and len(result) == 2:
        result, example = result
        if not isinstance(example, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in example.items()):
            raise BadInput(f"{path}:{func}: example_inputs must be a dict of name -> tensor")
    if not isinstance(result, torch.nn.Module):
        raise BadInput(f"{path}:{func}: returned {type(result).__name__}, expected an nn.Module or (module, example_inputs)")
    return result, example, path, func
