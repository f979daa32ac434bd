"""What a stage is: the :class:`Stage` protocol, the run's shared :class:`RunContext`, a stage's
:class:`StageOutput`, and the :class:`Contribution` a target adds to the pipeline.

A stage does its work and names a runner for its artifact; the pipeline loop
(:func:`vitexport.pipeline.run_pipeline`) alone times it, measures its peak memory, checks parity
against the golden reference, gates, records and resumes it. A stage's *content key* hashes
everything it consumes (the previous stage's key, its input file, its recipe sections), so a stage
whose key and artifacts are unchanged is not run again.
"""
from __future__ import annotations

import gc
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

import numpy as np

from ..graph.files import artifact_files
from ..io import sha256_file
from ..memory import release_memory
from ..recipe import Recipe, StageName, Tolerance

if TYPE_CHECKING:
    import torch

    from ..calibration import SampleSet
    from ..parity import GoldenReference, LayerReport
    from ..runners import BaseRunner
    from ..sources import LoadedModel

__all__ = [
    "model_files",
    "model_hash",
    "Stage",
    "StageOutput",
    "StageSkipped",
    "RunContext",
    "Contribution",
    "ArtifactWriter",
    "content_key",
    "module_hash",
    "trim_memory",
    "RAW_ONNX",
    "FP32_ONNX",
    "INT8_ONNX",
]

RAW_ONNX, FP32_ONNX, INT8_ONNX = "model.raw.onnx", "model.fp32.onnx", "model.int8.onnx"


class StageSkipped(Exception):
    """Raised by :meth:`Stage.run` when the stage cannot run here (no TensorRT, say); the message
    becomes a run note and the pipeline goes on."""


@dataclass
class StageOutput:
    """What a stage's work produced, before its parity check.

    Attributes:
        files: artifacts written, name → path (recorded with their hashes for resume).
        notes: said in the stage's report.
        details: stage-specific, JSON-serialisable data for ``parity.json`` (a pass report...).
        changed: sites a pass rewrote (None for other stages).
        layers: a per-layer localisation of the stage's error (``--layers``), attached to its result.
        later_work_s: seconds of this run spent on later stages' work, by stage name (rk3588: RKNN's
            simulator runs in the build's worker call): the loop moves them from this stage's time
            to theirs, so that each stage's printed time is the time of its own work.
    """

    files: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    changed: int | None = None
    layers: LayerReport | None = None
    later_work_s: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Stage(Protocol):
    """One pipeline stage.

    Attributes:
        name: the stage's name (a :class:`StageName`, or a stage its target declares); its
            tolerance is ``recipe.tolerance(name)``.
        needs_torch: the stage reads the torch module (``ctx.module``); once no enabled stage
            left does, the loop frees the torch weights before the ONNX work.
    """

    name: StageName | str
    needs_torch: bool

    def enabled(self, recipe: Recipe) -> bool:
        """Whether the recipe runs this stage (a disabled one is listed as skipped)."""

    def key(self, ctx: RunContext) -> str | None:
        """Content key of everything the stage consumes (use :func:`content_key` over ``ctx.key``),
        or None for a stage that always runs (it is then never resumed)."""

    def run(self, ctx: RunContext) -> StageOutput:
        """Do the work: write artifacts under ``ctx.out_dir``. Raises :class:`StageSkipped` when
        the stage cannot run here, BadInput / ContractViolation on bad input."""

    def runner(self, ctx: RunContext, out: StageOutput) -> BaseRunner:
        """A runner over the stage's artifact, for its parity check (the loop activates it)."""


class RunTarget(Protocol):
    """The run's target as this module sees it: a :class:`vitexport.targets.Target`, whose module
    imports this one for :class:`Contribution`; stages read the rest of it (``annotate``,
    ``validate``, gates) through :attr:`RunContext.target`. A protocol, not the class, so that this
    module never imports ``vitexport.targets``."""

    @property
    def name(self) -> str: ...

    @property
    def recipe(self) -> Recipe: ...

    def contribution(self) -> Contribution:
        """Files written beside the Q/DQ model and stages run after ``quantize_int8``."""
        ...


#: writes a file beside the Q/DQ model: ``(int8_path, target) -> written path``
ArtifactWriter = Callable[[Path, RunTarget], Path]


@dataclass(frozen=True)
class Contribution:
    """What a target adds to the pipeline (``Target.contribution()``).

    Attributes:
        artifacts: files written beside the Q/DQ model by the ``quantize_int8`` stage, recorded
            (and resumed) with it: orin's ``build_engine.sh``.
        stages: stages run after ``quantize_int8``: orin's TensorRT engine build.
    """

    artifacts: tuple[ArtifactWriter, ...] = ()
    stages: tuple[Stage, ...] = ()


@dataclass
class RunContext:
    """The state one run's stages share. Stages read it and update ``module`` / ``owned``; the
    loop updates ``key`` and ``files`` after each stage.

    Attributes:
        model: the loaded model; ``model.module`` is the untouched source (None once consumed).
        target: the run's target, built once (its ``recipe`` is the run's: :attr:`recipe`).
        out_dir, calib: the run's output folder and calibration samples.
        reference: the golden reference, captured first from the untouched model.
        unmasked: output positions of real tokens (a text encoder's mask), else None.
        key: the content key of everything consumed so far (the last resumable stage's).
        layers: per-layer localisation was asked for.
        keep_source: False: the source module may be rewritten in place and freed.
        module: the model as the passes left it (None once the torch work is over).
        owned: passes may rewrite ``module`` in place (it is a copy, or the source is consumable).
        files: artifacts so far, name → path (the run's ``Artifacts.files``).
        work_done_s: seconds earlier stages spent on a later stage's work (``StageOutput.later_work_s``),
            added to that stage's time by the loop.
        say: tells the running stage's heartbeat what it is doing now (``"rknn-toolkit2: build"``),
            shown on its next "still running" line; set by the loop for each stage.
        carried: the ``max_abs`` error (as its check gated it: ``(value, relative)``) the last stage with a
            ``max_abs`` gate measured against the reference: what a later stage's ``max_abs`` limit sits on
            (:meth:`tolerance`). None before any.
    """

    model: LoadedModel
    target: RunTarget
    out_dir: Path
    calib: SampleSet
    reference: GoldenReference
    unmasked: np.ndarray | dict[str, np.ndarray] | None
    key: str
    layers: bool = False
    keep_source: bool = True
    module: torch.nn.Module | None = None
    owned: bool = False
    files: dict[str, Path] = field(default_factory=dict)
    work_done_s: dict[str, float] = field(default_factory=dict)
    say: Callable[[str], None] = lambda doing: None
    carried: tuple[float, bool] | None = None

    @property
    def recipe(self) -> Recipe:
        """The run's recipe (the target's)."""
        return self.target.recipe

    def tolerance(self, stage: str) -> Tolerance:
        """The stage's recipe tolerance, its ``max_abs`` limit on top of the error the stages before it
        carried in (:attr:`carried`). Every stage is compared with the untouched model, so a stage's error
        holds what the earlier ones left: a fold that changes nothing after a reparameterisation that
        re-rounded every weight (timm's LeViT: 2e-5 of its largest output, within that stage's 1e-4) would
        fail its own 1e-5 limit. By the triangle inequality, a stage that moves the output by at most its
        own limit stays within ``carried + limit``."""
        tol = self.recipe.tolerance(stage)
        if tol.max_abs is None or self.carried is None or self.carried[1] != tol.relative or self.carried[0] <= 0:
            return tol
        return tol.model_copy(update={"max_abs": tol.max_abs + self.carried[0]})

    def carry(self, checks) -> None:
        """Remember the ``max_abs`` error a stage's checks measured (the largest over its outputs), if any."""
        got = [(c.value, c.metric.startswith("max_abs/ref_scale")) for c in checks
               if c.metric.startswith("max_abs") and not c.metric.startswith("max_abs_unmasked")]
        if got:
            self.carried = (max(v for v, _ in got), got[0][1])

    def release_torch(self) -> None:
        """Free the rewritten torch model (and the source when it may be consumed): the ONNX
        stages run without a torch copy of the weights (ViT-B/16: 2 x 344 MB less)."""
        if self.module is None and (self.keep_source or self.model.module is None):
            return
        self.module = None
        if not self.keep_source:
            self.model.module = None  # type: ignore[assignment]  # rewritten and exported: nothing reads it again
        trim_memory()


def content_key(*parts: Any) -> str:
    """A short hash of ``parts`` (bytes as they are, anything else as sorted JSON)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def module_hash(module: torch.nn.Module, example_inputs: dict[str, torch.Tensor]) -> str:
    """Content hash of a module: its state, its structure and its input shapes."""
    h = hashlib.sha256()
    for k, v in module.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    h.update(repr(module).encode())
    h.update(json.dumps({k: [list(v.shape), str(v.dtype)] for k, v in example_inputs.items()}).encode())
    return h.hexdigest()[:24]


def model_files(path: Path) -> dict[str, Path]:
    """A saved ONNX model's files by name: the ``.onnx`` and, for a large model, its ``.data``."""
    return {p.name: p for p in artifact_files(path)}


def model_hash(path: Path) -> str:
    """Content hash of a saved ONNX model (every file it occupies)."""
    return content_key(*[sha256_file(p) for p in model_files(path).values()])


def trim_memory() -> None:
    """Collect cycles (torch modules hold some) and hand the freed heap back to the OS."""
    gc.collect()
    release_memory()
