"""``hf:DIR`` — a local Hugging Face model folder (``config.json`` + weights); never the hub."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import BadInput, one_line
from .base import Preprocess, seeded

__all__ = ["load_hf"]


_Positive = Annotated[int, Field(gt=0)]
_Stats = Union[Annotated[float, Field(allow_inf_nan=False)], list[Annotated[float, Field(allow_inf_nan=False)]]]


class _ModelConfigView(BaseModel):
    """The config.json values vitexport reads, with the types transformers needs (strict: a
    string "224" is an error, not a number)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    image_size: Optional[Union[_Positive, list[_Positive]]] = None
    num_channels: Optional[_Positive] = None
    patch_size: Optional[Union[_Positive, list[_Positive]]] = None
    hidden_size: Optional[_Positive] = None
    num_attention_heads: Optional[_Positive] = None
    num_hidden_layers: Optional[_Positive] = None
    vocab_size: Optional[_Positive] = None
    max_position_embeddings: Optional[_Positive] = None


class _PreprocessorView(BaseModel):
    """The preprocessor_config.json values vitexport reads."""

    model_config = ConfigDict(extra="ignore", strict=True)
    image_mean: Optional[_Stats] = None
    image_std: Optional[_Stats] = None
    size: Optional[Union[_Positive, dict[str, _Positive]]] = None
    resample: Optional[Literal[0, 1, 2, 3, 4, 5]] = None


def _validate(view: type[BaseModel], data: object, where: str) -> BaseModel:
    if not isinstance(data, dict):
        raise BadInput(f"{where}: expected a JSON object, got {type(data).__name__}")
    try:
        return view.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        key = str(first["loc"][0]) if first["loc"] else "<root>"  # later parts name union members
        raise BadInput(f"{where}: '{key}': {first['msg'].lower()} (got {first.get('input')!r})") from None


def _stats(v, channels: int, default: tuple[float, ...], key: str, where: str) -> tuple[float, ...]:
    if v is None:
        return default
    vals = tuple(float(x) for x in (v if isinstance(v, list) else [v] * channels))
    if len(vals) != channels:
        raise BadInput(f"{where}: '{key}' has {len(vals)} values, the model has {channels} channels")
    if key == "image_std" and any(x <= 0 for x in vals):
        raise BadInput(f"{where}: 'image_std' must be positive, got {list(vals)}")
    return vals


def _preprocess(folder: Path, config) -> Preprocess | None:
    size = getattr(config, "image_size", None)
    if size is None:
        return None
    size = int(size if isinstance(size, int) else size[0])
    channels = int(getattr(config, "num_channels", 3))
    mean, std, resize, interp = (0.5,) * channels, (0.5,) * channels, size, "bilinear"
    pp = folder / "preprocessor_config.json"
    if pp.is_file():
        try:
            raw = json.loads(pp.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadInput(f"{pp}: not valid JSON ({one_line(str(exc), 120)})") from None
        cfg = _validate(_PreprocessorView, raw, str(pp))
        mean = _stats(cfg.image_mean, channels, mean, "image_mean", str(pp))
        std = _stats(cfg.image_std, channels, std, "image_std", str(pp))
        s = cfg.size if cfg.size is not None else size
        if isinstance(s, dict):
            s = s.get("shortest_edge") or s.get("height") or size
        resize = int(s)
        interp = {0: "nearest", 2: "bilinear", 3: "bicubic"}.get(cfg.resample if cfg.resample is not None else 2, "bilinear")
    return Preprocess(input_size=(channels, size, size), resize=resize, crop=size, interpolation=interp,
                      mean=mean, std=std)


def _read_config(path: Path, folder: str):
    from transformers import AutoConfig  # transformers loads for hf: URIs only (measured 4 s, 60 MB)

    cfg_file = path / "config.json"
    try:
        raw = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"{cfg_file}: not valid JSON ({one_line(str(exc), 120)})") from None
    _validate(_ModelConfigView, raw, str(cfg_file))
    try:
        return AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # the folder is the user's data: whatever transformers rejects in it is bad input
        raise BadInput(f"hf:{folder}: cannot read config.json ({type(exc).__name__}: {one_line(str(exc), 160)})") from None


def load_hf(folder: str) -> tuple[torch.nn.Module, Preprocess | None, str, object]:
    """Load a model from a local folder with ``local_files_only=True``.

    Image models load through ``AutoModelForImageClassification`` (fallback ``AutoModel``); text
    encoders through ``AutoModel``. Weights in the folder are loaded by transformers (safetensors
    first); without weights the model is built from its config with seeded random weights.

    Returns:
        (module, preprocess or None, kind 'image'|'text', config).
    Raises:
        BadInput: missing folder / config, config or preprocessor values of the wrong type,
            unknown architecture, a model transformers cannot build from the config.
    """
    import transformers  # transformers loads for hf: URIs only (measured 4 s, 60 MB)
    from transformers import AutoModel, AutoModelForImageClassification

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars are not our output
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise BadInput(f"hf:{folder}: no config.json in that folder (a local Hugging Face model folder is expected)")
    config = _read_config(path, folder)
    kind = "image" if hasattr(config, "image_size") else "text"
    preprocess = _preprocess(path, config) if kind == "image" else None
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
    classes = [AutoModelForImageClassification, AutoModel] if kind == "image" else [AutoModel]
    with seeded():
        for i, cls in enumerate(classes):
            try:
                model = cls.from_pretrained(str(path), local_files_only=True) if has_weights else cls.from_config(config)
                break
            except ValueError as exc:  # not an image-classification architecture: try the bare model
                if i + 1 < len(classes):
                    continue
                raise BadInput(f"hf:{folder}: cannot load model ({one_line(str(exc), 160)})") from None
            except Exception as exc:  # built from the user's config and files: their values are the cause
                raise BadInput(f"hf:{folder}: transformers cannot build the model from this folder "
                               f"({type(exc).__name__}: {one_line(str(exc), 160)})") from None
    return model, preprocess, kind, config
