"""``python:PATH.py:FUNCTION`` — a user's own file; the function builds the model.

The function returns an ``nn.Module`` or ``(module, example_inputs)``, ``example_inputs`` being a
dict name → tensor that fixes the input names, shapes and dtypes. Whatever the file raises while
imported or called (``sys.exit`` included) is reported as the user's code failing, with its line.
"""
from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

import torch

from ..errors import USER_MODULE_PREFIX, BadInput, user_code
from .base import seeded

__all__ = ["load_python"]


def _import(path: Path, spec: str):
    # a stable name per file (hash() is salted per process), under the prefix that marks user code
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    mod_name = f"{USER_MODULE_PREFIX}{digest}"
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise BadInput(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module
    try:
        with user_code(f"python:{spec}: importing the file", path):
            loader_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    return module


def _check_example(example, where: str) -> dict[str, torch.Tensor]:
    if not isinstance(example, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in example.items()):
        raise BadInput(f"{where}: example_inputs must be a dict of name -> tensor")
    if not example:
        raise BadInput(f"{where}: example_inputs is empty; return at least one name -> tensor (or only the module)")
    for k, v in example.items():
        if v.ndim == 0 or v.numel() == 0:
            raise BadInput(f"{where}: example input '{k}' has shape {tuple(v.shape)}; it needs a batch axis and data")
        if v.dtype.is_complex:
            raise BadInput(f"{where}: example input '{k}' is complex ({v.dtype}); ONNX export needs real tensors")
    return dict(example)


def load_python(spec: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor] | None, Path, str]:
    """Import ``PATH.py`` and call ``FUNCTION()`` (under a fixed seed: the same weights every run).

    Returns:
        (module, example_inputs or None, path, function name).
    Raises:
        BadInput: malformed spec, missing file, missing function, wrong return type.
        UserCodeError: the file raised (or called ``sys.exit``) while imported or called.
    """
    path_text, sep, func = spec.rpartition(":")
    if not sep or not path_text or not func:
        raise BadInput(f"python:{spec}: expected python:PATH.py:FUNCTION")
    path = Path(path_text)
    if path.is_dir():
        raise BadInput(f"python:{spec}: {path} is a directory; give the .py file that defines {func}()")
    if not path.exists():
        raise BadInput(f"python model file not found: {path}")
    if not path.is_file():
        raise BadInput(f"python:{spec}: {path} is not a regular file")
    module = _import(path, spec)
    fn = getattr(module, func, None)
    if not callable(fn):
        raise BadInput(f"{path}: no function '{func}'")
    with user_code(f"python:{spec}: building the model", path), seeded():
        result = fn()
    example = None
    if isinstance(result, tuple) and len(result) == 2:
        result, example = result
        example = _check_example(example, f"{path}:{func}")
    if not isinstance(result, torch.nn.Module):
        raise BadInput(f"{path}:{func}: returned {type(result).__name__}, expected an nn.Module or (module, example_inputs)")
    return result, example, path, func
