"""``hf:DIR`` — a local Hugging Face model folder (``config.json`` + weights); never the hub."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import BadInput
from .base import Preprocess

__all__ = ["load_hf"]


def _preprocess(folder: Path, config) -> Preprocess | None:
    size = getattr(config, "image_size", None)
    if size is None:
        return None
    size = int(size if isinstance(size, int) else size[0])
    channels = int(getattr(config, "num_channels", 3))
    mean, std, resize, interp = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), size, "bilinear"
    pp = folder / "preprocessor_config.json"
    if pp.is_file():
        try:
            cfg = json.loads(pp.read_text())
        except json.JSONDecodeError as exc:
            raise BadInput(f"{pp}: not valid JSON ({exc})") from None
        mean = tuple(cfg.get("image_mean", mean))
        std = tuple(cfg.get("image_std", std))
        s = cfg.get("size", size)
        if isinstance(s, dict):
            s = s.get("shortest_edge") or s.get("height") or size
        resize = int(s)
        interp = {0: "nearest", 2: "bilinear", 3: "bicubic"}.get(cfg.get("resample", 2), "bilinear")
    return Preprocess(input_size=(channels, size, size), resize=resize, crop=size, interpolation=interp, mean=mean, std=std)


def load_hf(folder: str) -> tuple[torch.nn.Module, Preprocess | None, str, object]:
    """Load a model from a local folder with ``local_files_only=True``.

    Image models load through ``AutoModelForImageClassification`` (fallback ``AutoModel``); text
    encoders through ``AutoModel``. Weights in the folder are loaded by transformers (safetensors
    first).

    Returns:
        (module, preprocess or None, kind 'image'|'text', config).
    Raises:
        BadInput: missing folder / config, unknown architecture.
    """
    import transformers
    from transformers import AutoConfig, AutoModel, AutoModelForImageClassification

    transformers.logging.set_verbosity_error()
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise BadInput(f"hf:{folder}: no config.json in that folder (a local Hugging Face model folder is expected)")
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise BadInput(f"hf:{folder}: cannot read config.json ({str(exc).splitlines()[0][:160]})") from None
    kind = "image" if hasattr(config, "image_size") else "text"
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
    try:
        if kind == "image":
            try:
                cls = AutoModelForImageClassification
                model = cls.from_pretrained(str(path), local_files_only=True) if has_weights else cls.from_config(config)
            except ValueError:
                model = AutoModel.from_pretrained(str(path), local_files_only=True) if has_weights else AutoModel.from_config(config)
        else:
            model = AutoModel.from_pretrained(str(path), local_files_only=True) if has_weights else AutoModel.from_config(config)
    except (OSError, ValueError) as exc:
        raise BadInput(f"hf:{folder}: cannot load model ({str(exc).splitlines()[0][:160]})") from None
    return model, _preprocess(path, config), kind, config
