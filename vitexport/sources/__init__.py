"""Model sources by URI: ``timm:NAME``, ``torchvision:NAME``, ``hf:DIR``, ``python:PATH.py:FUNCTION``."""
from __future__ import annotations

import inspect
from pathlib import Path

import torch

from ..errors import BadInput
from .base import LoadedModel, OutputAdapter, Preprocess, parse_input_shape, slugify
from .hf_source import load_hf
from .python_source import load_python
from .timm_source import load_timm
from .torchvision_source import load_torchvision
from .weights import load_weights, read_state_dict

__all__ = [
    "LoadedModel",
    "OutputAdapter",
    "Preprocess",
    "SCHEMES",
    "load_model",
    "load_weights",
    "read_state_dict",
    "parse_input_shape",
]

SCHEMES = ("timm", "torchvision", "hf", "python")


def _image_inputs(name: str, shape: tuple[int, ...] | None, default_chw: tuple[int, int, int], batch: int) -> dict[str, torch.Tensor]:
    if shape is None:
        shape = (batch, *default_chw)
    if len(shape) != 4:
        raise BadInput(f"--input-shape {','.join(map(str, shape))}: an image model needs N,C,H,W")
    # Fixed seed: the example only fixes shapes, but a deterministic one keeps exports byte-identical.
    g = torch.Generator().manual_seed(0)
    return {name: torch.randn(*shape, generator=g)}


def _accepts_keywords(model: torch.nn.Module, names: list[str]) -> bool:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    return all(n in params for n in names)


def load_model(
    uri: str,
    weights: str | Path | None = None,
    input_shape: str | tuple[int, ...] | None = None,
    batch_size: int = 1,
    trust_pickle: bool = False,
) -> LoadedModel:
    """Build the model a URI names, load ``weights`` into it, and fix its example inputs.

    Args:
        uri: ``timm:NAME`` | ``torchvision:NAME`` | ``hf:DIR`` | ``python:PATH.py:FUNCTION``.
        weights: optional ``.safetensors`` / ``.pt`` / ``.pth`` state dict.
        input_shape: ``'N,C,H,W'`` (or ``'N,L'`` for a text encoder); default from the model.
        batch_size: the batch when the shape comes from the model.
        trust_pickle: allow a checkpoint that needs code execution (never by default).
    Returns:
        A :class:`LoadedModel` in eval mode.
    Raises:
        BadInput: unknown scheme or model, missing files, mismatching weights, bad shape.
    """
    scheme, sep, rest = uri.partition(":")
    if not sep or scheme not in SCHEMES or not rest:
        raise BadInput(f"model URI '{uri}': expected one of {', '.join(s + ':...' for s in SCHEMES)}")
    shape = parse_input_shape(input_shape) if isinstance(input_shape, str) or input_shape is None else tuple(input_shape)
    preprocess: Preprocess | None = None
    meta: dict = {}
    if scheme == "timm":
        model, chw, preprocess = load_timm(rest)
        inputs = _image_inputs("x", shape, chw, batch_size)
        keyword, name = False, f"timm-{rest}"
    elif scheme == "torchvision":
        model, chw, preprocess = load_torchvision(rest)
        inputs = _image_inputs("x", shape, chw, batch_size)
        keyword, name = False, f"torchvision-{rest}"
    elif scheme == "hf":
        model, preprocess, kind, config = load_hf(rest)
        meta["hf_kind"] = kind
        if kind == "image":
            chw = preprocess.input_size if preprocess else (3, 224, 224)
            inputs = _image_inputs("pixel_values", shape, chw, batch_size)
        else:
            if shape is not None and len(shape) != 2:
                raise BadInput(f"--input-shape: a text encoder needs N,L (batch, sequence length)")
            n, seq = shape or (batch_size, min(int(getattr(config, "max_position_embeddings", 128)), 128))
            vocab = int(getattr(config, "vocab_size", 1000))
            g = torch.Generator().manual_seed(0)
            inputs = {
                "input_ids": torch.randint(0, vocab, (n, seq), generator=g),
                "attention_mask": torch.ones(n, seq, dtype=torch.long),
            }
        keyword, name = True, f"hf-{Path(rest).resolve().name}"
    else:
        model, example, path, func = load_python(rest)
        name = func.removeprefix("build_").removeprefix("create_") or path.stem
        if example is not None:
            if shape is not None:
                raise BadInput(f"python:{rest}: the function returns example_inputs; --input-shape cannot override them")
            inputs = dict(example)
        else:
            cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
            chw = tuple(cfg.get("input_size", ())) if isinstance(cfg, dict) else ()
            if shape is None and len(chw) != 3:
                raise BadInput(f"python:{rest}: the model does not say its input size; pass --input-shape N,C,H,W")
            inputs = _image_inputs("x", shape, chw, batch_size)  # type: ignore[arg-type]
        keyword = _accepts_keywords(model, list(inputs))
    if weights is not None:
        load_weights(model, weights, trust_pickle=trust_pickle)
    model.eval()
    adapter = OutputAdapter(model, list(inputs), keyword=keyword).eval()
    return LoadedModel(adapter, inputs, slugify(name), scheme, uri, preprocess, meta)
