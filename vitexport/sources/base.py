"""What a model source hands to the pipeline: a module with named inputs and how to feed it."""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch
from torch import nn

from ..runners.torch_runner import SINGLE_OUTPUT, tensor_outputs
from ..errors import BadInput, did_you_mean
from ..recipe import Task

__all__ = ["Preprocess", "LoadedModel", "OutputAdapter", "parse_input_shape", "slugify", "seeded", "BUILD_SEED", "built_input_size"]

#: the seed every model is built under: a model without --weights gets the same random weights on
#: every run, so the same command writes the same bytes
BUILD_SEED = 0


@dataclass(frozen=True)
class Preprocess:
    """How the model was trained to see images (timm pretrained cfg, HF preprocessor, torchvision)."""

    input_size: tuple[int, int, int]  # C, H, W
    resize: int
    crop: int
    interpolation: str = "bilinear"
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)
    #: where these numbers came from, as the report says it ("timm pretrained_cfg of vit_...")
    origin: str = ""


class OutputAdapter(nn.Module):
    """Calls the wrapped model with keyword inputs in a fixed order and returns its tensor outputs.

    The exporter passes positional arguments; this fixes their names. A tuple, dict or Hugging Face
    output becomes every tensor it holds, in its order (:func:`tensor_outputs`): one tensor is
    returned as it is, several as a tuple whose names are ``output_names`` (known after the first
    call). ``outputs`` keeps only those named; entries that are not tensors are listed in ``skipped``.
    """

    def __init__(self, model: nn.Module, input_names: list[str], keyword: bool = True,
                 outputs: Sequence[str] | None = None):
        super().__init__()
        self.model = model
        self.input_names = list(input_names)
        self.keyword = keyword
        self.select = list(outputs) if outputs else None
        #: the names of what forward returns (``['output']`` for one tensor); None until the first call
        self.output_names: list[str] | None = None
        #: the model's own names of the outputs kept (``['logits']`` where ``output_names`` is ``['output']``)
        self.model_output_names: list[str] | None = None
        #: the model's outputs left out: not tensors (``'hidden_states (tuple)'``)
        self.skipped: list[str] = []

    def forward(self, *args, **kwargs):
        if args:
            kwargs = {**dict(zip(self.input_names, args)), **kwargs}
        if self.keyword:
            out = self.model(**kwargs)
        else:
            out = self.model(*(kwargs[n] for n in self.input_names))
        try:
            named, skipped = tensor_outputs(out)
        except TypeError:
            raise BadInput(f"the model's forward returned {type(out).__name__}, which holds no tensor; it must return "
                           "a tensor (or a dict, tuple or Hugging Face output holding one)") from None
        if self.select is not None:
            named = _select(named, self.select)
        if self.model_output_names != list(named):  # once: an export traces this call again
            self.model_output_names, self.skipped = list(named), skipped
            self.output_names = [SINGLE_OUTPUT] if len(named) == 1 else list(named)
        values = tuple(named.values())
        return values[0] if len(values) == 1 else values


def _select(named: dict[str, torch.Tensor], wanted: list[str]) -> dict[str, torch.Tensor]:
    """The outputs ``wanted`` (``--outputs``), in the model's order; an unknown name is BadInput."""
    for name in wanted:
        if name not in named:
            raise BadInput(f"--outputs {','.join(wanted)}: the model has no tensor output '{name}'"
                           f"{did_you_mean(name, named)}; its outputs are {', '.join(named)}")
    return {k: v for k, v in named.items() if k in wanted}


@dataclass
class LoadedModel:
    """A model ready for the pipeline.

    Attributes:
        module: an ``OutputAdapter`` in eval mode; ``module(**example_inputs)`` returns its
            tensor output, or a tuple of them named by ``output_names``.
        example_inputs: name → tensor with the static export shapes and dtypes.
        name: a slug used for the default output folder.
        family: ``timm`` | ``torchvision`` | ``hf`` | ``python``.
        preprocess: image preprocessing, when the source knows it.
        task: what the outputs mean (parity's task metrics); ``task_source`` says who decided it,
            ``task_options`` how its outputs read (filled in by ``vitexport.api.prepare``).
    """

    module: OutputAdapter
    example_inputs: dict[str, torch.Tensor]
    name: str
    family: str
    uri: str
    preprocess: Preprocess | None = None
    meta: dict = field(default_factory=dict)
    task: Task = Task.classify
    task_source: str = ""
    #: how the task's outputs read (``{"detect_scores": "sigmoid"}``: a detector without a no-object class)
    task_options: dict = field(default_factory=dict)

    @property
    def input_names(self) -> list[str]:
        return list(self.example_inputs)

    @property
    def output_names(self) -> list[str]:
        """The names of the model's tensor outputs (``['output']`` for one): the adapter's, from its
        first call, else from one forward on the example inputs now."""
        if self.module.output_names is None:
            with torch.no_grad():
                self.module(**self.example_inputs)
        return list(self.module.output_names or [])


def parse_input_shape(text: str | None) -> tuple[int, ...] | None:
    """``'1,3,224,224'`` → (1, 3, 224, 224). Raises BadInput on anything else."""
    if text is None:
        return None
    parts = [p.strip() for p in str(text).replace("x", ",").split(",")]
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise BadInput(f"--input-shape '{text}': expected comma-separated positive integers like 1,3,224,224") from None
    if not dims or any(d <= 0 for d in dims) or len(dims) not in (2, 3, 4):
        raise BadInput(f"--input-shape '{text}': expected N,C,H,W (or N,L for token inputs) with positive sizes")
    return dims


def slugify(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "model"


@contextlib.contextmanager
def seeded(seed: int = BUILD_SEED) -> Iterator[None]:
    """Run a model build under a fixed torch seed, leaving the caller's random state as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _first_int_pair(v) -> tuple[int, int] | None:
    if isinstance(v, int) and v > 0:
        return (v, v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(x, int) and x > 0 for x in v):
        return (int(v[0]), int(v[1]))
    return None


def built_input_size(model: torch.nn.Module) -> tuple[int, int, int] | None:
    """(C, H, W) of the model as built: a timm patch embedding's ``img_size``, a Hugging Face
    ``config.image_size``, else the pretrained config's ``input_size`` (which describes the
    checkpoint, not the module: timm's dinov2 built with ``img_size=224`` says 518 there)."""
    pe = getattr(model, "patch_embed", None)
    hw = _first_int_pair(getattr(pe, "img_size", None))
    proj = getattr(pe, "proj", None)
    if hw is not None:
        c = getattr(proj, "in_channels", None) or getattr(model, "in_chans", None) or 3
        return (int(c), *hw)
    config = getattr(model, "config", None)
    hw = _first_int_pair(getattr(config, "image_size", None))
    if hw is not None:
        return (int(getattr(config, "num_channels", 3) or 3), *hw)
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
    chw = tuple(cfg.get("input_size", ())) if isinstance(cfg, dict) else ()
    if len(chw) == 3 and all(isinstance(x, int) and x > 0 for x in chw):
        return chw  # type: ignore[return-value]
    return None
