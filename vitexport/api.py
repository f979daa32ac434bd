"""What Python users call: ``vitexport.api.export(...)``; the CLI is a thin layer over this."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .calibration import SampleSet, load_samples, random_samples
from .calibration.data import NpzSamples
from .errors import BadInput
from .pipeline import Artifacts, run_pipeline
from .recipe import Recipe, StageName, available_recipes, load_recipe
from .sources import LoadedModel, load_model

__all__ = ["export", "prepare", "targets", "render_parity", "compare", "DEFAULT_BUILD_DIR"]

DEFAULT_BUILD_DIR = Path("build")


def targets() -> dict[str, str]:
    """Recipe name → one-line description, for every recipe shipped in ``recipes/``."""
    out = {}
    for name in available_recipes():
        r = load_recipe(name)
        out[name] = f"[{r.target.value}] {r.description}"
    return out


def _fit_batch(samples: SampleSet, batch: int) -> SampleSet:
    """Fixed-shape models take exactly ``batch`` samples per call: trim (or tile) to a multiple."""
    n = len(samples)
    if batch == 1 or n % batch == 0:
        return samples
    arrays: dict[str, list[np.ndarray]] = {}
    for b in samples.batches(n):
        for k, v in b.items():
            arrays.setdefault(k, []).append(v)
    full = {k: np.concatenate(v) for k, v in arrays.items()}
    keep = (n // batch) * batch or batch
    idx = np.arange(keep) % n
    labels = samples.labels[idx] if samples.labels is not None else None
    return NpzSamples({k: v[idx] for k, v in full.items()}, labels, samples.source)


def prepare(
    model_uri: str | None = None,
    target: str = "orin",
    *,
    weights: str | Path | None = None,
    input_shape: str | None = None,
    calib: str | Path | None = None,
    parity_data: str | Path | None = None,
    overrides: Sequence[str] = (),
    trust_pickle: bool = False,
) -> tuple[LoadedModel, Recipe, SampleSet, SampleSet, list[str]]:
    """Resolve everything a run needs and validate it before any artifact is written.

    With no ``model_uri`` the bundled demo (and its weights and data) is used.
    Returns:
        (model, recipe, calibration samples, parity samples, notes for the report).
    Raises:
        BadInput: bad recipe, model, weights, shape or data.
    """
    from .demo import DEMO_CALIB, DEMO_HELDOUT, DEMO_MODEL_URI, DEMO_WEIGHTS

    recipe = load_recipe(target, overrides)
    if model_uri is None:
        model_uri = DEMO_MODEL_URI
        weights = DEMO_WEIGHTS if weights is None else weights
        calib = DEMO_CALIB if calib is None else calib
        parity_data = DEMO_HELDOUT if parity_data is None else parity_data
    model = load_model(model_uri, weights=weights, input_shape=input_shape, batch_size=recipe.export.batch_size, trust_pickle=trust_pickle)
    notes: list[str] = []
    cal_spec = recipe.calibration
    kw = dict(preprocess=model.preprocess, spec=cal_spec.preprocess)
    if calib is not None:
        calib_set = load_samples(calib, model.example_inputs, num_samples=cal_spec.num_samples, seed=cal_spec.seed, **kw)
    elif parity_data is not None:
        calib_set = load_samples(parity_data, model.example_inputs, num_samples=cal_spec.num_samples, seed=cal_spec.seed, **kw)
        notes.append("no --calib given: calibrated on the parity data")
    else:
        calib_set = random_samples(model.example_inputs, min(cal_spec.num_samples, 32), seed=cal_spec.seed)
        notes.append("no --calib given: calibrated on synthetic Gaussian inputs, INT8 quality here says little")
    pd = recipe.parity_data
    if parity_data is not None:
        parity_set = load_samples(parity_data, model.example_inputs, num_samples=pd.num_samples, seed=pd.seed, **kw)
    elif calib is not None:
        parity_set = load_samples(calib, model.example_inputs, num_samples=pd.num_samples, seed=pd.seed, **kw)
        notes.append("no --parity-data given: parity measured on the calibration data")
    else:
        parity_set = random_samples(model.example_inputs, pd.synthetic_samples, seed=pd.seed + 1)
        notes.append("no --parity-data given: parity measured on synthetic inputs")
    batch = next(iter(model.example_inputs.values())).shape[0]
    return model, recipe, calib_set, _fit_batch(parity_set, batch), notes


def export(
    model_uri: str | None = None,
    target: str = "orin",
    *,
    weights: str | Path | None = None,
    input_shape: str | None = None,
    calib: str | Path | None = None,
    parity_data: str | Path | None = None,
    out: str | Path | None = None,
    overrides: Sequence[str] = (),
    layers: bool = False,
    trust_pickle: bool = False,
    resume: bool = True,
    log: Callable[[str], None] = lambda s: None,
) -> Artifacts:
    """Export a model for a target, gating every stage with parity.

    Args:
        model_uri: ``timm:NAME`` | ``torchvision:NAME`` | ``hf:DIR`` | ``python:PATH.py:FUNC``; None → the demo.
        target: recipe name (``vitexport targets``) or a recipe YAML path.
        weights: ``.safetensors`` / ``.pt`` / ``.pth`` state dict.
        input_shape: ``'N,C,H,W'`` overriding the model's own.
        calib: calibration data (image folder or ``.npz``).
        parity_data: parity data (image folder or ``.npz``, optional labels ``y``).
        out: output folder; default ``build/<model>-<target>``.
        overrides: ``key.path=value`` recipe overrides.
        layers: per-layer localisation of the INT8 error.
        trust_pickle: allow a pickle checkpoint that runs code when loaded.
        resume: reuse stages of an earlier, interrupted run in the same folder.
        log: called with one line per finished stage.
    Returns:
        :class:`~vitexport.pipeline.Artifacts`.
    Raises:
        BadInput: bad input of any kind (exit code 2); nothing new is left behind.
        ParityFailure: a stage missed its tolerance (exit code 1); reports are written.
    """
    model, recipe, calib_set, parity_set, notes = prepare(
        model_uri, target, weights=weights, input_shape=input_shape, calib=calib,
        parity_data=parity_data, overrides=overrides, trust_pickle=trust_pickle,
    )
    out_dir = Path(out) if out is not None else DEFAULT_BUILD_DIR / f"{model.name}-{recipe.name}"
    existed = out_dir.exists()
    try:
        return run_pipeline(model, recipe, out_dir, calib=calib_set, parity_data=parity_set,
                            data_note="; ".join(notes), layers=layers, resume=resume, log=log,
                            keep_source=layers)  # the model was loaded for this run: the pipeline may consume it
    except BadInput:
        # A bad input found mid-run (a contract violation, say) leaves no half-made folder behind.
        if not existed:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise


def render_parity(out_dir: str | Path) -> dict[str, Path]:
    """Re-render ``parity.md`` / ``parity.html`` of a finished run from its ``parity.json``."""
    from .parity import render_reports

    return render_reports(Path(out_dir))


def compare(
    a: str,
    b: str,
    parity_data: str | Path,
    *,
    layers: bool = False,
    out: str | Path | None = None,
    target: str = "orin",
    stage: StageName | str = StageName.simplify,
    overrides: Sequence[str] = (),
    weights: str | Path | None = None,
    input_shape: str | None = None,
    num_samples: int | None = None,
):
    """Compare two models (ONNX files, or a model URI and an ONNX file) on the same inputs.

    Args:
        a, b: ONNX paths, or a model URI (``a``) and an ONNX path (``b``).
        parity_data: inputs (image folder or ``.npz``).
        layers: per-layer comparison and ``first_divergence``.
        out: where the report goes (none written when None).
        target, stage: the recipe and stage whose tolerance applies (``quantize_int8`` for an INT8 B).
        overrides: recipe overrides.
        weights, input_shape: for a model URI.
        num_samples: compare on at most this many samples.
    Returns:
        The :class:`~vitexport.parity.ParityRun`; ``run.passed`` is the verdict.
    """
    from .parity import compare_models
    from .recipe import parse_stage

    stage = parse_stage(stage)  # BadInput naming the stages
    recipe = load_recipe(target, overrides)
    return compare_models(
        a, b, parity_data, layers=layers, out_dir=Path(out) if out else None, tolerance=recipe.tolerance(stage),
        stage=stage, weights=weights, input_shape=input_shape, num_samples=num_samples,
    )
