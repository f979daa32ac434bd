"""``vitexport parity --compare A B``: two models, the same inputs, one verdict.

``A`` is the reference: an ONNX file or a model URI (``timm:``, ``python:``...); ``B`` is the
candidate: an ONNX file, another URI, or a file a target's runtime runs (opened by that target's own
runner, handed in as ``artifacts``: this module names no backend). With ``layers=True`` the report also
names the first block where B leaves the budget.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from ..calibration import load_samples
from ..calibration.feeds import FeedSet
from ..errors import BadInput
from ..runners import OnnxRuntimeRunner
from ..runners.base import BaseRunner
from ..recipe import Tolerance
from .layers import LayerReport, localize_layers, localize_onnx
from .reference import capture_reference
from .report import write_reports
from .stage import ParityRun, check_stage

__all__ = ["compare_models", "COMPARE_STAGE", "DEFAULT_COMPARE_TOLERANCE", "ArtifactOpener"]

#: an inactive runner over a file a target's runtime runs (``Target.open_artifact``)
ArtifactOpener = Callable[[Path], BaseRunner]

COMPARE_STAGE = "compare"
# Two FP32 exports of one model agree to float32 round-off; the CLI passes a recipe stage's
# tolerance instead when B is quantized.
DEFAULT_COMPARE_TOLERANCE = Tolerance(max_abs=1e-4)
_ONNX_SUFFIXES = (".onnx",)


@dataclass
class _Side:
    spec: str
    runner: BaseRunner
    example: dict[str, np.ndarray]
    static_batch: int | None
    kind: str  # "onnx" | "torch" | the runner's engine for a target's artifact
    module: Any = None


def _is_uri(spec: str) -> bool:
    from ..sources import SCHEMES  # vitexport.sources loads torch (~2 s): two ONNX files never need it

    scheme, sep, rest = spec.partition(":")
    return bool(sep and rest) and scheme in SCHEMES


def _file_side(spec: str, runner: BaseRunner, kind: str) -> _Side:
    """A model file behind an active runner; its inputs (and static batch) from the runner."""
    specs = runner.input_specs()
    static = {s.shape[0] for s in specs if s.shape and s.shape[0] > 0}
    example = {s.name: np.zeros(tuple(d if d > 0 else 1 for d in s.shape), dtype=s.dtype) for s in specs}
    return _Side(spec, runner, example, next(iter(static)) if len(static) == 1 else None, kind)


def _open_onnx(spec: str, **_: Any) -> _Side:
    path = Path(spec)
    if not path.is_file():
        raise BadInput(f"ONNX file not found: {path}")
    runner = OnnxRuntimeRunner(path, name=path.name)
    try:
        runner.activate()
    except Exception as exc:  # onnxruntime raises its own types for unreadable models
        raise BadInput(f"{path}: not a loadable ONNX model ({str(exc).splitlines()[0][:160]})") from None
    return _file_side(spec, runner, "onnx")


def _open_artifact(spec: str, opener: ArtifactOpener) -> _Side:
    """A target's artifact behind its own runner (activation says what is missing to run it here)."""
    path = Path(spec)
    if not path.is_file():
        raise BadInput(f"file not found: {path}")
    runner = opener(path)
    runner.activate()
    return _file_side(spec, runner, runner.engine)


def _open_uri(spec: str, *, weights, input_shape, batch_size: int) -> _Side:
    from ..runners import TorchRunner  # torch loads here: comparing two ONNX files never needs it (~2 s)
    from ..sources import load_model

    loaded = load_model(spec, weights=weights, input_shape=input_shape, batch_size=batch_size)
    example = {k: v.detach().cpu().numpy() for k, v in loaded.example_inputs.items()}
    runner = TorchRunner(loaded.module, loaded.example_inputs, name=spec)
    runner.activate()
    return _Side(spec, runner, example, None, "torch", loaded.module)


#: the one runner factory: what a spec names (test, opener), first match wins; a target's artifact
#: (by its suffix) before a URI
_OPENERS: tuple[tuple[Callable[[str], bool], Callable[..., _Side]], ...] = (
    (lambda spec: Path(spec).suffix.lower() in _ONNX_SUFFIXES, _open_onnx),
    (_is_uri, _open_uri),
)


def _open(spec: str, *, weights, input_shape, batch_size: int, artifacts: Mapping[str, ArtifactOpener]) -> _Side:
    """An active runner over ``spec`` (an ONNX file, a target's artifact or a model URI)."""
    opener = artifacts.get(Path(spec).suffix.lower())
    if opener is not None and Path(spec).suffix.lower() not in _ONNX_SUFFIXES:
        return _open_artifact(spec, opener)
    for matches, open_side in _OPENERS:
        if matches(spec):
            return open_side(spec, weights=weights, input_shape=input_shape, batch_size=batch_size)
    files = ", ".join(sorted(artifacts))
    raise BadInput(f"'{spec}': expected an .onnx file, a model URI (timm:, torchvision:, hf:, python:)"
                   + (f" or a file a target runs ({files})" if files else ""))


def compare_models(
    a: str,
    b: str,
    data_path: str | Path,
    *,
    layers: bool = False,
    out_dir: str | Path | None = None,
    tolerance: Tolerance | None = None,
    weights: str | Path | None = None,
    input_shape: str | None = None,
    batch_size: int = 8,
    num_samples: int | None = None,
    stage: str = COMPARE_STAGE,
    artifacts: Mapping[str, ArtifactOpener] | None = None,
) -> ParityRun:
    """Compare model ``b`` with model ``a`` on the samples in ``data_path``.

    Args:
        a: the reference: an ONNX path or a model URI (loaded with ``sources.load_model``).
        b: the candidate: an ONNX path (a URI, or a file ``artifacts`` opens, also work).
        data_path: parity data (``.npz`` with one array per input and optional ``y`` labels, or
            an image folder), read with ``calibration.load_samples``.
        layers: add per-layer localisation (the first block where ``b`` leaves the budget).
        out_dir: write ``parity.json`` / ``.md`` / ``.html`` there (nothing is written when None).
        tolerance: the gate (default: ``max_abs`` 1e-4 relative, two FP32 models).
        weights, input_shape: for a model URI, as in ``sources.load_model``.
        batch_size: batch for models with a dynamic batch (a static batch is used as is).
        num_samples: use at most this many samples (seeded choice).
        stage: the stage name in the report.
        artifacts: file suffix → opener of a target's artifact (``Target.open_artifact``; what
            :func:`vitexport.api.compare` hands in from the registered targets).
    Returns:
        A :class:`ParityRun` with one stage; ``run.passed`` is false when ``b`` differs beyond
        tolerance (the CLI exits 1).
    Raises:
        BadInput: unreadable models, mismatching inputs, bad data.
    """
    tolerance = tolerance or DEFAULT_COMPARE_TOLERANCE
    t0 = time.perf_counter()
    opened = dict(weights=weights, input_shape=input_shape, batch_size=batch_size, artifacts=artifacts or {})
    side_a = _open(a, **opened)
    side_b = _open(b, **opened)
    try:
        if set(side_a.example) != set(side_b.example):
            raise BadInput(f"the models' inputs differ: {a} has {sorted(side_a.example)}, {b} has {sorted(side_b.example)}")
        statics = {s for s in (side_a.static_batch, side_b.static_batch) if s}
        if len(statics) > 1:
            raise BadInput(f"the models have different static batch sizes {sorted(statics)}")
        batch = next(iter(statics)) if statics else batch_size
        loaded = load_samples(data_path, side_a.example, num_samples=num_samples)
        samples = FeedSet(loaded, batch).whole_batches()  # a static batch takes whole batches only
        feeds = list(samples.batches(batch))
        reference = capture_reference(side_a.runner, feeds, samples.labels, source=str(data_path))
        reference.meta["label"] = a
        notes = [f"reference: {a}", f"candidate: {b}", f"{len(samples)} sample(s) from {data_path}, batch {batch}"]
        if len(samples) != len(loaded):
            notes.append(f"{len(loaded)} sample(s) given, {len(samples)} compared: the static batch {batch} takes "
                         "whole batches")
        result = check_stage(stage, side_b.runner, reference, tolerance, notes=notes,
                             artifacts={"reference": a, "candidate": b})
        if layers:
            report = _layers(side_a, side_b, reference.feeds, tolerance)
            if report is not None:
                result.attach_layers(report)
            else:
                result.notes.append("per-layer localisation needs B to be an ONNX file and A an ONNX file or a torch model")
        result.seconds = time.perf_counter() - t0
    finally:
        side_a.runner.deactivate()
        side_b.runner.deactivate()
    run = ParityRun(model=a, target="", data=str(data_path), stages=[result], reference=a,
                    extra={"compare": {"a": a, "b": b}})
    run.passed = result.passed
    if out_dir is not None:
        write_reports(Path(out_dir), run)
    return run


def _layers(side_a: _Side, side_b: _Side, feeds, tolerance: Tolerance) -> LayerReport | None:
    if side_b.kind == "onnx" and side_a.kind == "onnx":
        return localize_onnx(side_a.spec, side_b.spec, feeds, tolerance=tolerance)
    if side_b.kind == "onnx" and side_a.kind == "torch":
        return localize_layers(side_a.module, feeds, side_b.spec, tolerance=tolerance)
    if side_b.kind == "torch" and side_a.kind == "torch":
        return localize_layers(side_a.module, feeds, side_b.module, tolerance=tolerance)
    return None
