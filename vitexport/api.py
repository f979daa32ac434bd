"""What Python users call: ``vitexport.api.export(...)``; the CLI is a thin layer over this."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, Sequence

from .calibration import SampleSet, load_samples, random_samples
from .calibration.feeds import FeedSet
from .check import check_file
from .demo import DEMO_CALIB, DEMO_HELDOUT, DEMO_MODEL_URI, DEMO_WEIGHTS
from .errors import BadInput, InternalError, ParityFailure, VitexportError, classify, did_you_mean
from .io import write_error_log
from .parity import compare_models, render_reports
from .parity.tasks import task_outputs
from .pipeline import Artifacts, run_pipeline
from .runners import feed_size
from .preflight import check_model, check_output_folder, run_needs
from .progress import Heartbeat
from .recipe import Recipe, StageName, Task, parse_stage
from .sources import LoadedModel, load_model
from .targets import Target, load_recipe, load_target, registered_targets

__all__ = ["export", "prepare", "targets", "check", "render_parity", "compare", "DEFAULT_BUILD_DIR"]

DEFAULT_BUILD_DIR = Path("build")


def targets() -> dict[str, str]:
    """Target name → one-line description, for every registered target (vitexport's and plug-ins')."""
    return {name: cls.description for name, cls in registered_targets().items()}


def check(model: str | Path, target: str | None = None, *, overrides: Sequence[str] = ()):
    """Check an ONNX file (vitexport's or anyone's) against a target: the ONNX checker, the recipe's
    contract (ops, opset, static shapes, dtypes) and the target's runtime rules (TensorRT's Q/DQ
    rules and ONNX parser for a Jetson, per-tensor scales and no float16 for an NPU...).

    Args:
        model: the ONNX file (its ``.data`` file beside it, if any).
        target: target name (``vitexport targets``) or a recipe YAML path; None: the default target.
        overrides: ``key.path=value`` recipe overrides.
    Returns:
        A :class:`~vitexport.check.CheckResult`: true when nothing is broken, ``lines()`` one line
        per violation naming node and rule.
    Raises:
        BadInput: the file is missing or is not ONNX; the target is unknown or the recipe invalid.
    """
    run_target = load_target(target, overrides)
    # a user's recipe file is named as given
    given = target if target is not None and Path(target).suffix in {".yaml", ".yml"} else None
    return check_file(model, run_target, recipe_path=given)


def prepare(
    model_uri: str | None = None,
    target: str | None = None,
    *,
    weights: str | Path | None = None,
    input_shape: str | None = None,
    calib: str | Path | None = None,
    parity_data: str | Path | None = None,
    overrides: Sequence[str] = (),
    trust_pickle: bool = False,
    num_classes: int | None = None,
    outputs: str | Sequence[str] | None = None,
    task: str | None = None,
) -> tuple[LoadedModel, Target, SampleSet, SampleSet, list[str]]:
    """Resolve everything a run needs and validate it before any artifact is written.

    Pre-flight: the memory the inputs, one forward, the histograms and the golden reference need
    is checked against what the machine has, and the model is run twice on a few parity samples
    (it must run, and agree with itself).

    With no ``model_uri`` the bundled demo (and its weights and data) is used; with no ``target``
    the default one (:data:`vitexport.targets.DEFAULT_TARGET`). ``task`` (``classify|detect|segment|
    depth|embed``) says what the outputs mean; None: what the source built says
    (:func:`vitexport.sources.infer_task`).
    Returns:
        (model, the run's target (its ``recipe`` validated), calibration samples, parity samples,
        notes for the report).
    Raises:
        BadInput: bad recipe, model, weights, shape or data; a model that is not deterministic; a
            ``task`` whose outputs the model lacks; a per-output gate naming no output.
        UserCodeError: the user's ``python:`` code raised (importing, building or in forward).
        ResourceLimit: the run cannot fit in memory (the estimate and the setting are named).
    """
    run_target = load_target(target, overrides)
    run_target.require_toolchain()  # before the model loads: a missing compiler fails in a second, not after minutes
    recipe = run_target.recipe
    if model_uri is None:
        model_uri = DEMO_MODEL_URI
        weights = DEMO_WEIGHTS if weights is None else weights
        calib = DEMO_CALIB if calib is None else calib
        parity_data = DEMO_HELDOUT if parity_data is None else parity_data
    model = load_model(model_uri, weights=weights, input_shape=input_shape, batch_size=recipe.export.batch_size,
                       trust_pickle=trust_pickle, num_classes=num_classes, outputs=outputs, task=task)
    notes: list[str] = list(model.meta.get("notes", ()))  # what the source decided (the Hugging Face class built)
    cal_spec = recipe.calibration
    kw = dict(preprocess=model.preprocess, spec=cal_spec.preprocess)
    if calib is not None:
        calib_set = load_samples(calib, model.example_inputs, num_samples=cal_spec.num_samples, seed=cal_spec.seed, **kw)
    elif parity_data is not None:
        calib_set = load_samples(parity_data, model.example_inputs, num_samples=cal_spec.num_samples, seed=cal_spec.seed, **kw)
        notes.append("no --calib given: calibrated on the parity data")
    else:
        calib_set = random_samples(model.example_inputs, min(cal_spec.num_samples, 32), seed=cal_spec.seed,
                                   setting="lower calibration.num_samples")
        notes.append("no --calib given: calibrated on synthetic Gaussian inputs, INT8 quality here says little")
    pd = recipe.parity_data
    if parity_data is not None:
        parity_set = load_samples(parity_data, model.example_inputs, num_samples=pd.num_samples, seed=pd.seed, **kw)
    elif calib is not None:
        parity_set = load_samples(calib, model.example_inputs, num_samples=pd.num_samples, seed=pd.seed, **kw)
        notes.append("no --parity-data given: parity measured on the calibration data")
    else:
        parity_set = random_samples(model.example_inputs, pd.synthetic_samples, seed=pd.seed + 1,
                                    setting="lower parity_data.synthetic_samples")
        notes.append("no --parity-data given: parity measured on synthetic inputs")
    batch = feed_size(model.example_inputs)
    run_needs(model, recipe, len(parity_set))
    parity_set = FeedSet(parity_set, batch).whole_batches()  # each parity sample counted once
    check_model(model, parity_set)
    _check_task_outputs(model, recipe)
    return model, run_target, calib_set, parity_set, notes


def _check_task_outputs(model: LoadedModel, recipe: Recipe) -> None:
    """Before any work: ``--task`` must find the outputs its metrics read, and a per-output gate
    (``parity.<stage>.outputs.<name>``) must name an output the model has. A task the source
    inferred whose outputs ``--outputs`` left out is measured nowhere, which each stage's notes say."""
    gated = {(stage, name) for stage in recipe.stage_names() for name in (recipe.tolerance(stage).outputs or {})}
    if model.task is Task.classify and not gated:
        return
    import torch  # loaded already by the model's source

    with torch.no_grad():
        out = model.module(**model.example_inputs)
    shapes = dict(zip(model.output_names, (tuple(o.shape) for o in (out if isinstance(out, tuple) else (out,)))))
    listed = ", ".join(f"{k} {list(v)}" for k, v in shapes.items())
    for stage, name in sorted(gated):
        if name not in shapes:
            raise BadInput(f"parity.{stage}.outputs.{name}: the model has no output '{name}'"
                           f"{did_you_mean(name, shapes)}; its outputs are {listed}")
    try:
        names = task_outputs(model.task, shapes)
    except ValueError as exc:
        if model.task_source == "--task":
            raise BadInput(f"--task {model.task}: {exc}; the model's outputs are {listed}") from None
        return
    labels = getattr(getattr(model.module.model, "config", None), "num_labels", None)
    if model.task is Task.detect and labels is not None and shapes[names[0]][-1] == labels:
        # no "no object" class (Deformable / Conditional DETR, RT-DETR): each class is scored by a sigmoid
        model.task_options["detect_scores"] = "sigmoid"


def export(
    model_uri: str | None = None,
    target: str | None = None,
    *,
    weights: str | Path | None = None,
    input_shape: str | None = None,
    calib: str | Path | None = None,
    parity_data: str | Path | None = None,
    out: str | Path | None = None,
    overrides: Sequence[str] = (),
    layers: bool = False,
    trust_pickle: bool = False,
    num_classes: int | None = None,
    resume: bool = True,
    log: Callable[[str], None] = lambda s: None,
    heartbeat: Heartbeat | None = None,
    outputs: str | Sequence[str] | None = None,
    task: str | None = None,
) -> Artifacts:
    """Export a model for a target, gating every stage with parity.

    Args:
        model_uri: ``timm:NAME`` | ``torchvision:NAME`` | ``hf:DIR`` | ``python:PATH.py:FUNC``; None → the demo.
        target: target name (``vitexport targets``) or a recipe YAML path; None: the default target.
        weights: ``.safetensors`` / ``.pt`` / ``.pth`` state dict.
        input_shape: ``'N,C,H,W'`` overriding the model's own.
        calib: calibration data (image folder or ``.npz``).
        parity_data: parity data (image folder or ``.npz``, optional labels ``y``).
        out: output folder; default ``build/<model>-<target>``.
        overrides: ``key.path=value`` recipe overrides.
        layers: per-layer localisation of the INT8 error.
        trust_pickle: allow a pickle checkpoint that runs code when loaded.
        num_classes: the classifier's size for a ``timm:`` / ``torchvision:`` / ``hf:`` model; None:
            read from the ``weights``' head tensor (a fine-tuned checkpoint), else the model's own.
        resume: reuse stages of an earlier, interrupted run in the same folder.
        log: called with one line per finished stage (and "still running" lines during a long one).
        heartbeat: how a long stage shows it is alive (:class:`~vitexport.progress.Heartbeat`);
            default a line through ``log`` every 10 s.
        outputs: keep only these of the model's tensor outputs (``'logits,pred_boxes'`` or a list);
            default every one, each a named ONNX output gated on its own (one output is ``output``).
        task: what the outputs mean, ``classify|detect|segment|depth|embed`` (its metrics and gates:
            :mod:`vitexport.parity.tasks`); None: read from the source (a ``...ForObjectDetection`` detects).
    Returns:
        :class:`~vitexport.pipeline.Artifacts`.
    Raises:
        BadInput: bad input of any kind (exit code 2), including :class:`~vitexport.errors.UserCodeError`
            (the user's model code raised) and :class:`~vitexport.errors.ResourceLimit` (it cannot fit in
            memory); nothing new is left behind.
        ParityFailure: a stage missed its tolerance (exit code 1); reports are written, the failed
            artifacts are moved into ``OUT/rejected/`` (``err.rejected``; ``err.verdict`` says so in a line).
        InternalError: a bug in vitexport (exit code 3); the traceback is in ``OUT/error.log``.
    """
    where: dict = {"out": None, "existed": True}
    try:
        if out is not None:  # checked first: a bad folder fails before a model is loaded
            where["out"] = check_output_folder(out)
            where["existed"] = where["out"].exists()
        model, run_target, calib_set, parity_set, notes = prepare(
            model_uri, target, weights=weights, input_shape=input_shape, calib=calib,
            parity_data=parity_data, overrides=overrides, trust_pickle=trust_pickle, num_classes=num_classes,
            outputs=outputs, task=task,
        )
        if where["out"] is None:
            where["out"] = check_output_folder(DEFAULT_BUILD_DIR / f"{model.name}-{run_target.recipe.name}")
            where["existed"] = where["out"].exists()
        out_dir: Path = where["out"]
        return run_pipeline(model, run_target, out_dir, calib=calib_set, parity_data=parity_set,
                            data_note="; ".join(notes), layers=layers, resume=resume, log=log, heartbeat=heartbeat,
                            keep_source=layers)  # the model was loaded for this run: the pipeline may consume it
    except ParityFailure:
        raise  # reports are written: the folder stays
    except BaseException as exc:  # sys.exit in the user's model code too
        err = _failed(exc, where["out"], where["existed"])
        if err is None or err is exc:
            raise
        raise err from exc


def _failed(exc: BaseException, out_dir: Path | None, existed: bool) -> VitexportError | None:
    """What a failed run raises (see :func:`vitexport.errors.classify`); a folder the run made is
    removed (nothing half-made is left), except for ``error.log`` holding an internal error's traceback."""
    err = classify(exc)
    if err is None:  # interrupted: resume picks up the finished stages
        return None
    if out_dir is not None and not existed:
        shutil.rmtree(out_dir, ignore_errors=True)
    if isinstance(err, InternalError) and out_dir is not None:
        err.log_path = write_error_log(out_dir, exc)
    return err


def render_parity(out_dir: str | Path) -> dict[str, Path]:
    """Re-render ``parity.md`` / ``parity.html`` of a finished run from its ``parity.json``."""
    return render_reports(Path(out_dir))


def compare(
    a: str,
    b: str,
    parity_data: str | Path,
    *,
    layers: bool = False,
    out: str | Path | None = None,
    target: str | None = None,
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
        target, stage: the target (or recipe path) and stage whose tolerance applies (``quantize_int8``
            for an INT8 B); None: the default target.
        overrides: recipe overrides.
        weights, input_shape: for a model URI.
        num_samples: compare on at most this many samples.
    Returns:
        The :class:`~vitexport.parity.ParityRun`; ``run.passed`` is the verdict.
    """
    recipe = load_recipe(target, overrides)
    stage = parse_stage(stage, recipe)  # BadInput naming the stages (the pipeline's and the target's)
    return compare_models(
        a, b, parity_data, layers=layers, out_dir=Path(out) if out else None, tolerance=recipe.tolerance(stage),
        stage=stage, weights=weights, input_shape=input_shape, num_samples=num_samples,
        artifacts={suffix: cls.open_artifact for cls in registered_targets().values() for suffix in cls.artifact_suffixes},
    )
