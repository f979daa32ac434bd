"""The model itself, checked before any work: it runs on a few parity samples, twice, and gives
the same outputs both times; its outputs fit the labels; the whole run's memory fits.

A model that disagrees with itself (dropout or random masking left active in eval mode) would make
every stage fail parity for a reason no stage caused, so it is refused here with that reason.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator

import numpy as np

from ..errors import BadInput, ResourceLimit, VitexportError, classify, user_code, user_line
from ..runners.base import feed_size
from .memory import Need, format_bytes, histogram_need, require

if TYPE_CHECKING:  # pragma: no cover
    from ..calibration import SampleSet
    from ..recipe import Recipe
    from ..sources.base import LoadedModel

__all__ = ["check_model", "check_input_shape", "run_needs"]

def _first_conv_hint(model: LoadedModel) -> str:
    """Why a forward failed when the input's channels are not what the first convolution takes."""
    import torch  # torch on first use: preflight loads with calibration, which ONNX-only work imports

    conv = next(((n, m) for n, m in model.module.named_modules() if isinstance(m, torch.nn.Conv2d)), None)
    image = next((v for v in model.example_inputs.values() if v.ndim == 4), None)
    if conv is None or image is None or conv[1].in_channels == image.shape[1]:
        return ""
    name = conv[0].removeprefix("model.")
    return (f"; the model's first convolution '{name}' takes {conv[1].in_channels} channels, the input has "
            f"{image.shape[1]}: check --input-shape")


@contextlib.contextmanager
def _model_call(model: LoadedModel, what: str) -> Iterator[None]:
    """The user's ``python:`` code raising is theirs; any other model raising on our inputs means
    the inputs do not suit it (shape, channels, dtype)."""
    shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in model.example_inputs.items())
    if model.family == "python":
        try:
            with user_code(f"{model.uri}: {what} on inputs {shapes}"):
                yield
        except BadInput as err:
            hint = _first_conv_hint(model)
            if hint and not str(err).endswith(hint):
                raise type(err)(f"{err}{hint}") from err.__cause__
            raise
        return
    try:
        yield
    except (BadInput, KeyboardInterrupt):
        raise
    except Exception as exc:
        err = classify(exc)
        if isinstance(err, ResourceLimit):
            raise err from exc
        msg = " ".join(str(exc).split())[:200]
        raise BadInput(f"{model.uri}: the model raised {type(exc).__name__} {what} on inputs {shapes}: {msg}"
                       f"{_first_conv_hint(model)}") from exc


def _last_line(exc: BaseException) -> str:
    """The last non-empty line of an exception's message (torch puts the reason there)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return " ".join(lines[-1].split())[:200] if lines else ""


def _dims(shape) -> str:
    return "×".join(str(int(d)) for d in shape)


def check_input_shape(model: LoadedModel) -> None:
    """Run the model once on its example inputs: a shape the user asked for (``--input-shape``)
    that the model cannot run at is refused here with the reason, and the shape it was built for.

    Raises:
        BadInput: the forward raised; the message names the input's shape, the error's last line
            (and the user's line, for a ``python:`` model) and ``model.meta["input_size"]`` if known.
        ResourceLimit: the forward ran out of memory.
    """
    import torch  # torch on first use: preflight loads with calibration, which ONNX-only work imports

    try:
        with torch.no_grad():
            model.module(**model.example_inputs)
    except (VitexportError, KeyboardInterrupt):
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any failure here is the shape's (or the model's) to explain
        err = classify(exc)
        if isinstance(err, ResourceLimit):
            raise err from exc
        inputs = " and ".join(f"'{k}' of shape {_dims(v.shape)}" for k, v in model.example_inputs.items())
        where = user_line(exc)
        reason = f"{type(exc).__name__}: {_last_line(exc)}" + (f", in {where}" if where else "")
        takes = model.meta.get("input_size")
        built = (f"; it was built for {_dims(takes)} (C×H×W): give --input-shape N,{','.join(map(str, takes))} "
                 "or leave --input-shape out") if takes else ""
        raise BadInput(f"{model.uri}: the model does not accept input {inputs} ({reason}){_first_conv_hint(model)}"
                       f"{built}") from None


def _forward(model: LoadedModel, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """Each of the model's tensor outputs over ``feeds`` (one array per output, samples stacked)."""
    import torch  # torch on first use: preflight loads with calibration, which ONNX-only work imports

    outs: list[list[np.ndarray]] = []
    with torch.no_grad():
        for feed in feeds:
            tensors = {k: torch.from_numpy(np.ascontiguousarray(v)).to(model.example_inputs[k].dtype) for k, v in feed.items()}
            out = model.module(**tensors)
            outs.append([t.detach().float().cpu().numpy() for t in (out if isinstance(out, tuple) else (out,))])
    return [np.concatenate(per, axis=0) for per in zip(*outs)]


def _primary(model: LoadedModel, outs: list[np.ndarray]) -> np.ndarray:
    """The classification output labels index: ``logits`` among several, else the first."""
    names = getattr(model.module, "model_output_names", None) or []
    return outs[names.index("logits")] if "logits" in names and len(names) == len(outs) else outs[0]


def check_model(model: LoadedModel, samples: SampleSet) -> None:
    """Run the model twice on the first export batch of ``samples`` (one batch shows a model
    that disagrees with itself; the pipeline checks the whole reference for constant outputs).

    Raises:
        UserCodeError: the user's ``python:`` forward raised.
        BadInput: another model raised on these inputs; the two runs disagree (the model is not
            deterministic in eval mode); labels outside the model's classes.
    """
    batch = feed_size(model.example_inputs)
    feeds = [next(iter(samples.batches(batch)))]
    with _model_call(model, "in forward"):
        firsts = _forward(model, feeds)
        seconds = _forward(model, feeds)
    first = np.concatenate([o.reshape(-1) for o in firsts])
    second = np.concatenate([o.reshape(-1) for o in seconds])
    if first.shape != second.shape or not np.allclose(first, second, rtol=1e-5, atol=1e-6 * max(float(np.nanmax(np.abs(first), initial=0)), 1.0), equal_nan=True):
        diff = float(np.nanmax(np.abs(first - second))) if first.shape == second.shape else float("nan")
        raise BadInput(
            f"{model.uri}: the model gives different outputs for the same input (max difference {diff:.3g} between "
            "two runs in eval mode); parity needs a deterministic model: disable dropout, random masking or "
            "sampling in eval mode (does forward honour model.eval()?)"
        )
    first = _primary(model, firsts)
    if samples.labels is not None and first.ndim == 2 and len(samples.labels):
        top = int(np.max(samples.labels))
        if top >= first.shape[1]:
            raise BadInput(f"{samples.source}: labels go up to {top}, but the model has {first.shape[1]} outputs; "
                           "labels must be class indices of this model")


def run_needs(model: LoadedModel, recipe: Recipe, parity_samples: int) -> None:
    """Refuse a run whose histograms and golden reference cannot fit in memory (the inputs and one
    forward were checked when the model was loaded).

    Raises:
        ResourceLimit: the estimate, and the setting to change.
    """
    per_sample = sum(int(v[0].numel()) * v.element_size() for v in model.example_inputs.values())
    needs = [Need(f"the golden reference's {parity_samples} parity input(s) ({format_bytes(per_sample)} each)",
                  per_sample * parity_samples, "lower parity_data.num_samples")]
    cal = recipe.calibration
    if recipe.stages.quantize_int8.enabled:
        needs += histogram_need(model.module, cal.num_bins, cal.method.value)
    require(needs)
