"""``hf:DIR`` — a local Hugging Face model folder (``config.json`` + weights); never the hub."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from safetensors import safe_open

from ..errors import BadInput, one_line
from ..quiet import quiet_transformers
from .base import Preprocess, seeded
from .head import HeadRequest, head_size, last_linear

__all__ = ["load_hf"]


_Positive = Annotated[int, Field(gt=0)]
#: one value, or one per stage: hierarchical models (Segformer, PvtV2, LeViT, CvT) keep a list
_PerStage = Union[_Positive, list[_Positive]]
_Stats = Union[Annotated[float, Field(allow_inf_nan=False)], list[Annotated[float, Field(allow_inf_nan=False)]]]


class _ModelConfigView(BaseModel):
    """The config.json values vitexport reads, with the types transformers takes for them (strict:
    a string "224" is an error, not a number; a list per stage is what hierarchical models keep)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    image_size: Optional[_PerStage] = None
    num_channels: Optional[_Positive] = None
    patch_size: Optional[_PerStage] = None
    hidden_size: Optional[_PerStage] = None
    num_attention_heads: Optional[_PerStage] = None
    num_hidden_layers: Optional[_PerStage] = None
    vocab_size: Optional[_Positive] = None
    max_position_embeddings: Optional[_Positive] = None
    architectures: Optional[list[str]] = None


class _PreprocessorView(BaseModel):
    """The preprocessor_config.json values vitexport reads."""

    model_config = ConfigDict(extra="ignore", strict=True)
    image_mean: Optional[_Stats] = None
    image_std: Optional[_Stats] = None
    size: Optional[Union[_Positive, dict[str, _Positive]]] = None
    crop_size: Optional[Union[_Positive, dict[str, _Positive]]] = None
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


_DEFAULT_SIZE = 224  # an image model whose config says no size (CvT) and no preprocessor does either


def _preprocess(folder: Path, config) -> Preprocess:
    """How the folder's images are prepared: the preprocessor's statistics and size, the config's
    image size (else the preprocessor's crop, else 224)."""
    size = getattr(config, "image_size", None)
    channels = int(getattr(config, "num_channels", 3) or 3)
    mean, std, interp, resize = (0.5,) * channels, (0.5,) * channels, "bilinear", None
    pp = folder / "preprocessor_config.json"
    if pp.is_file():
        try:
            raw = json.loads(pp.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadInput(f"{pp}: not valid JSON ({one_line(str(exc), 120)})") from None
        cfg = _validate(_PreprocessorView, raw, str(pp))
        mean = _stats(cfg.image_mean, channels, mean, "image_mean", str(pp))
        std = _stats(cfg.image_std, channels, std, "image_std", str(pp))
        resize = _edge(cfg.size)
        size = size if size is not None else _edge(cfg.crop_size) or resize
        interp = {0: "nearest", 2: "bilinear", 3: "bicubic"}.get(cfg.resample if cfg.resample is not None else 2, "bilinear")
    size = int((size if isinstance(size, int) else size[0]) if size else _DEFAULT_SIZE)
    origin = str(pp) if pp.is_file() else f"defaults (mean/std 0.5, bilinear): no preprocessor_config.json in {folder}"
    return Preprocess(input_size=(channels, size, size), resize=int(resize or size), crop=size, interpolation=interp,
                      mean=mean, std=std, origin=origin)


def _edge(s) -> int | None:
    if isinstance(s, dict):
        return s.get("shortest_edge") or s.get("height")
    return s


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


def _checkpoint_has_task_head(path: Path, prefix: str) -> bool:
    """Whether the folder's safetensors weights are a task model's: its keys wrap the base model
    under ``prefix`` (``vit.embeddings...`` beside ``classifier.weight``)."""
    for f in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(f), "pt") as st:
                if any(k.startswith(prefix + ".") for k in st.keys()):
                    return True
        except Exception:  # noqa: BLE001 - an unreadable file is transformers' to report when it loads it
            continue
    return False


def _model_class(config, path: Path, folder: str, has_weights: bool) -> tuple[type, str]:
    """The class to build and a note saying which and why: the class ``architectures`` names; without
    one, the base model (a backbone checkpoint has no task head to export), unless the weights are a
    classifier's."""
    import transformers  # transformers loads for hf: URIs only (measured 4 s, 60 MB)
    from transformers import AutoModel, AutoModelForImageClassification

    archs = [a for a in (getattr(config, "architectures", None) or []) if isinstance(a, str)]
    if archs:
        cls = getattr(transformers, archs[0], None)
        if not isinstance(cls, type):
            raise BadInput(f"hf:{folder}: config.json names architecture '{archs[0]}', which transformers "
                           f"{transformers.__version__} does not have")
        return cls, f"hf: built {archs[0]} (config.json 'architectures')"
    try:
        base = AutoModel._model_mapping[type(config)]
    except KeyError:
        raise BadInput(f"hf:{folder}: transformers has no model for config type {type(config).__name__}") from None
    head = AutoModelForImageClassification._model_mapping
    if has_weights and type(config) in head and _checkpoint_has_task_head(path, base.base_model_prefix):
        cls = head[type(config)]
        return cls, f"hf: built {cls.__name__} (config.json names no 'architectures'; the weights hold a task head)"
    return base, (f"hf: built {base.__name__}, the base model: config.json names no 'architectures' (add "
                  f"\"architectures\": [\"...ForImageClassification\"] to export a classifier)")


def _head(cls: type, config, head: HeadRequest | None, folder: str) -> str | None:
    """Set ``config.num_labels`` to the size of the ``--weights`` checkpoint's classifier (or to
    ``head.num_classes``) when it differs from config.json's; returns the note saying so. The
    classifier is the model's last Linear when its size is ``num_labels`` (a base model has none),
    read from a build on the meta device."""
    if head is None:
        return None
    try:
        with torch.device("meta"):
            found = last_linear(cls(config))
    except Exception:  # noqa: BLE001 - a model that computes at build time cannot run on meta
        with seeded():
            found = last_linear(cls(config))
    labels = int(getattr(config, "num_labels", 0) or 0)
    if found is None or found[1] != labels:
        if head.num_classes is not None:
            raise BadInput(f"hf:{folder}: --num-classes {head.num_classes}, but {cls.__name__} has no classification "
                           f"head to size (name a ...ForImageClassification in config.json 'architectures')")
        return None
    n, note = head_size(head, (found[0],), labels, f"hf:{folder}", "num_labels")
    if n is not None:
        config.num_labels = n  # transformers renumbers id2label / label2id to match
    return note


def load_hf(folder: str, head: HeadRequest | None = None) -> tuple[torch.nn.Module, Preprocess | None, str, object, list[str]]:
    """Load a model from a local folder with ``local_files_only=True``.

    The class is the one ``config.json``'s ``architectures`` names, else the base model (see
    :func:`_model_class`); an image model is one whose main input is ``pixel_values`` (a config
    without ``image_size``, such as CvT's, is still an image model). Weights in the folder are loaded
    by transformers (safetensors first); without weights the model is built from its config with
    seeded random weights.

    A ``head`` whose checkpoint (or ``num_classes``) sizes the classifier otherwise than
    config.json sets ``config.num_labels`` first; the folder's own head is then not loaded.

    Returns:
        (module, preprocess or None, kind 'image'|'text', config, notes: the class built, the head).
    Raises:
        BadInput: missing folder / config, config or preprocessor values of the wrong type,
            unknown architecture, a model transformers cannot build from the config, a
            ``num_classes`` for a model without a classification head.
    """
    import transformers  # transformers loads for hf: URIs only (measured 4 s, 60 MB)

    transformers.logging.set_verbosity_error()  # its warnings stay off for the run (tracing logs them too)
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise BadInput(f"hf:{folder}: no config.json in that folder (a local Hugging Face model folder is expected)")
    config = _read_config(path, folder)
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
    cls, note = _model_class(config, path, folder, has_weights)
    head_note = _head(cls, config, head, folder)
    # a resized head cannot take the folder's own: transformers leaves it at random (--weights fills it)
    resized = {"config": config, "ignore_mismatched_sizes": True} if head_note else {}
    with seeded(), quiet_transformers():  # "Loading weights" bars and load warnings are not our output
        try:
            model = cls.from_pretrained(str(path), local_files_only=True, **resized) if has_weights else cls(config)
        except Exception as exc:  # built from the user's config and files: their values are the cause
            raise BadInput(f"hf:{folder}: transformers cannot build the model from this folder "
                           f"({type(exc).__name__}: {one_line(str(exc), 160)})") from None
    kind = "text" if getattr(model, "main_input_name", "pixel_values") == "input_ids" else "image"
    preprocess = _preprocess(path, config) if kind == "image" else None
    return model, preprocess, kind, config, [note, *([head_note] if head_note else [])]
