"""Model sources by URI: ``timm:NAME``, ``torchvision:NAME``, ``hf:DIR``, ``python:PATH.py:FUNCTION``."""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Sequence

import torch

from ..errors import BadInput
from ..preflight.memory import forward_need, require
from ..preflight.model import check_input_shape
from .base import LoadedModel, OutputAdapter, Preprocess, built_input_size, parse_input_shape, slugify
from .head import HeadRequest
from .hf_source import load_hf
from .python_source import load_python
from .task import infer_task, parse_task
from .timm_source import load_timm
from .torchvision_source import load_torchvision
from .weights import load_state, load_weights, read_state_dict

__all__ = [
    "LoadedModel",
    "OutputAdapter",
    "Preprocess",
    "SCHEMES",
    "load_model",
    "load_weights",
    "read_state_dict",
    "parse_input_shape",
    "built_input_size",
    "infer_task",
    "parse_task",
]

SCHEMES = ("timm", "torchvision", "hf", "python")


def _named_params(model: torch.nn.Module) -> tuple[list[str], bool, bool]:
    """forward's named parameters (in order), whether it takes ``*args``, whether ``**kwargs``."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return [], True, True
    named = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return named, any(p.kind is p.VAR_POSITIONAL for p in params), any(p.kind is p.VAR_KEYWORD for p in params)


def _default_input_name(model: torch.nn.Module) -> str:
    """The name forward gives its first input (``pixel_values`` for a Hugging Face model, else
    usually ``x``): a forward taking ``**kwargs`` would otherwise receive ``x=`` and ignore it."""
    named, _, _ = _named_params(model)
    return named[0] if named else "x"


def _bind(model: torch.nn.Module, names: list[str], where: str) -> bool:
    """Whether inputs ``names`` are passed by keyword (they are forward's own parameter names) or
    by position; raises BadInput when forward can take them neither way."""
    named, var_pos, var_kw = _named_params(model)
    keyword = bool(named) and all(n in named for n in names) or (not named and var_kw and not var_pos)
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return keyword
    try:
        sig.bind(**{n: n for n in names}) if keyword else sig.bind(*names)
    except TypeError as exc:
        raise BadInput(f"{where}: forward({', '.join(named)}) cannot take the inputs {names} ({exc}); "
                       "name the example inputs after forward's parameters") from None
    return keyword


def _image_spec(name: str, shape: tuple[int, ...] | None, default_chw, batch: int) -> dict[str, tuple]:
    if shape is None:
        shape = (batch, *default_chw)
    if len(shape) != 4:
        raise BadInput(f"--input-shape {','.join(map(str, shape))}: an image model needs N,C,H,W")
    return {name: (tuple(shape), torch.float32)}


def _require_forward(model: torch.nn.Module, spec: dict[str, tuple], keyword: bool, setting: str) -> None:
    require(forward_need(model, {k: s for k, (s, _) in spec.items()}, {k: d for k, (_, d) in spec.items()}, setting,
                         keyword=keyword))


def _materialise(model: torch.nn.Module, spec: dict[str, tuple], shape_given: bool, keyword: bool,
                 vocab: int = 1000) -> dict[str, torch.Tensor]:
    """Example tensors for the input spec, once the memory they and a forward need is known to fit.
    Fixed seed: the example only fixes shapes, but a deterministic one keeps exports byte-identical."""
    setting = "use a smaller --input-shape" if shape_given else "use a smaller export.batch_size (or --input-shape)"
    _require_forward(model, spec, keyword, setting)
    g = torch.Generator().manual_seed(0)
    out = {}
    for k, (shape, dtype) in spec.items():
        if "mask" in k:
            out[k] = torch.ones(*shape, dtype=dtype)
        elif dtype.is_floating_point:
            out[k] = torch.randn(*shape, generator=g)
        else:
            out[k] = torch.randint(0, vocab, shape, generator=g)
    return out


def _default_seq(config, longest: int = 128) -> int:
    """A text encoder's default sequence length: 128, or what its position table holds. RoBERTa-style
    embeddings number positions from ``pad_token_id + 1`` (a table of 514 holds 512 tokens), so the
    pad id and one more are taken off."""
    table = int(getattr(config, "max_position_embeddings", longest) or longest)
    pad = getattr(config, "pad_token_id", None)
    offset = pad + 1 if isinstance(pad, int) and 0 <= pad < table // 2 else 0
    return max(1, min(longest, table - offset))


def _build(scheme: str, rest: str, shape, batch_size: int, head: HeadRequest | None = None):
    """Build the module and its input spec (name → (shape, dtype)), allocating no input yet; ``head``
    sizes a timm / torchvision / Hugging Face classifier (see :mod:`.head`)."""
    preprocess: Preprocess | None = None
    meta: dict = {}
    vocab = 1000
    if scheme in ("timm", "torchvision"):
        model, chw, preprocess, notes = (load_timm if scheme == "timm" else load_torchvision)(rest, head)
        spec = _image_spec("x", shape, chw, batch_size)
        meta["input_size"], meta["notes"] = tuple(chw), notes
        keyword, name = False, f"{scheme}-{rest}"
    elif scheme == "hf":
        model, preprocess, kind, config, notes = load_hf(rest, head)
        meta["hf_kind"], meta["notes"] = kind, notes
        if kind == "image":
            spec = _image_spec("pixel_values", shape, preprocess.input_size, batch_size)
            meta["input_size"] = tuple(preprocess.input_size)
        else:
            if shape is not None and len(shape) != 2:
                raise BadInput("--input-shape: a text encoder needs N,L (batch, sequence length)")
            n, seq = shape or (batch_size, _default_seq(config))
            vocab = int(getattr(config, "vocab_size", 1000))
            spec = {"input_ids": ((n, seq), torch.int64), "attention_mask": ((n, seq), torch.int64)}
        keyword, name = True, f"hf-{Path(rest).resolve().name}"
    else:
        model, example, path, func = load_python(rest)
        name = func.removeprefix("build_").removeprefix("create_") or path.stem
        if example is not None:
            if shape is not None:
                raise BadInput(f"python:{rest}: the function returns example_inputs; --input-shape cannot override them")
            spec = {k: (tuple(v.shape), v.dtype) for k, v in example.items()}
            meta["example"] = example
        else:
            chw = built_input_size(model)
            if shape is None and chw is None:
                raise BadInput(f"python:{rest}: the model does not say its input size; pass --input-shape N,C,H,W")
            spec = _image_spec(_default_input_name(model), shape, chw, batch_size)
            meta["input_size"] = tuple(chw) if chw is not None else None
        keyword = _bind(model, list(spec), f"python:{rest}")
    return model, spec, keyword, name, preprocess, meta, vocab


def _head_request(scheme: str, state, weights, num_classes: int | None) -> HeadRequest | None:
    if num_classes is not None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise BadInput(f"--num-classes {num_classes}: expected a whole number of classes, at least 1")
        if scheme == "python":
            raise BadInput("--num-classes applies to timm:, torchvision: and hf: models; a python: function builds its own head")
    if scheme == "python" or (state is None and num_classes is None):
        return None
    return HeadRequest(state, weights, num_classes)


def _output_list(outputs: Sequence[str] | str | None) -> list[str] | None:
    """``'logits,pred_boxes'`` (``--outputs``) or a list → the names; None or empty → every output."""
    if outputs is None:
        return None
    names = [n.strip() for n in (outputs.split(",") if isinstance(outputs, str) else outputs) if n and n.strip()]
    return list(dict.fromkeys(names)) or None


def load_model(
    uri: str,
    weights: str | Path | None = None,
    input_shape: str | tuple[int, ...] | None = None,
    batch_size: int = 1,
    trust_pickle: bool = False,
    num_classes: int | None = None,
    outputs: Sequence[str] | str | None = None,
    task: str | None = None,
) -> LoadedModel:
    """Build the model a URI names, load ``weights`` into it, and fix its example inputs.

    Every model is built under a fixed seed, so one without ``weights`` has the same random weights
    on every run; the input size is the built module's own (not its pretrained config's).

    Args:
        uri: ``timm:NAME`` | ``torchvision:NAME`` | ``hf:DIR`` | ``python:PATH.py:FUNCTION``.
        weights: optional safetensors file or torch state dict (told apart by content).
        input_shape: ``'N,C,H,W'`` (or ``'N,L'`` for a text encoder); default from the model.
        batch_size: the batch when the shape comes from the model.
        trust_pickle: allow a checkpoint that needs code execution (never by default).
        num_classes: the classifier's size for a ``timm:`` / ``torchvision:`` / ``hf:`` model
            (``num_labels`` for ``hf:``). None: the size of the ``weights``' own head tensor when
            it differs from the model's (a fine-tuned checkpoint), else the model's own; a note
            says which was built.
        outputs: keep only these of the model's tensor outputs (``'logits,pred_boxes'`` or a list);
            default every one. An unknown name is BadInput at the first forward (preflight).
        task: what the outputs mean (``classify|detect|segment|depth|embed``); None: read from
            what the source built (:func:`~vitexport.sources.task.infer_task`).
    Returns:
        A :class:`LoadedModel` in eval mode.
    Raises:
        BadInput: unknown scheme or model (with the nearest name), missing files, mismatching
            weights, bad shape, an ``input_shape`` the model does not run at (one forward tells),
            a ``num_classes`` below 1, for a ``python:`` model, or contradicting the weights.
        UserCodeError: a ``python:`` file raised while imported or called.
        ResourceLimit: the inputs (and one forward over them) cannot fit in memory.
    """
    scheme, sep, rest = uri.partition(":")
    if not sep or scheme not in SCHEMES or not rest:
        raise BadInput(f"model URI '{uri}': expected one of {', '.join(s + ':...' for s in SCHEMES)}")
    given = parse_task(task) if task is not None else None
    shape = parse_input_shape(input_shape) if isinstance(input_shape, str) or input_shape is None else tuple(input_shape)
    state = read_state_dict(weights, trust_pickle) if weights is not None else None
    model, spec, keyword, name, preprocess, meta, vocab = _build(scheme, rest, shape, batch_size,
                                                                 _head_request(scheme, state, weights, num_classes))
    if state is not None:
        load_state(model, state, weights)
    example = meta.pop("example", None)
    if example is not None:
        _require_forward(model, spec, keyword, "return smaller example_inputs")
        inputs = example
    else:
        inputs = _materialise(model, spec, shape is not None, keyword, vocab)
    model.eval()
    found, why = infer_task(model, scheme)
    adapter = OutputAdapter(model, list(inputs), keyword=keyword, outputs=_output_list(outputs)).eval()
    loaded = LoadedModel(adapter, inputs, slugify(name), scheme, uri, preprocess, meta,
                         task=given or found, task_source="--task" if given else why)
    takes = meta.get("input_size")
    if shape is not None and (takes is None or tuple(shape[1:]) != tuple(takes)):
        # a shape the model was not built for: one real forward now, so that a model refusing it
        # says so here, in one line, rather than as a calibration file "of the wrong shape" later
        check_input_shape(loaded)
    return loaded
