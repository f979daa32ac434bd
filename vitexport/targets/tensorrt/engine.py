"""What the TensorRT targets add to a run: ``build_engine.sh`` (the ``trtexec`` command the Jetson
runs) beside the Q/DQ model, and the ``build_engine`` stage, which builds the engine through
Polygraphy and gates it with TensorRT itself where TensorRT and a GPU exist (``tensorrt`` and
``polygraphy`` are imported only inside the build and the runner).
"""
from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path
from typing import ClassVar, Protocol

from ...errors import BadInput
from ...io import atomic_path, atomic_write_text
from ...recipe import Recipe, TargetStage
from .runner import TensorRTRunner, tensorrt_missing
from .runner import polygraphy_error, require_tensorrt
from ...stages.base import INT8_ONNX, Contribution, RunContext, StageOutput, StageSkipped


class TensorRTTarget(Protocol):
    """What the engine stage reads of a TensorRT target (``OrinTarget`` and ``OrinJP5Target``); a
    protocol rather than the class, so that this module, which ``orin`` imports, never imports ``orin``."""

    @property
    def strongly_typed(self) -> bool: ...

    @property
    def recipe(self) -> Recipe: ...

    @property
    def description(self) -> str: ...


__all__ = ["trtexec_command", "write_engine_script", "build_engine", "BUILD_ENGINE", "BuildEngineStage", "TENSORRT",
           "ENGINE_PLAN", "ENGINE_SCRIPT"]

ENGINE_PLAN, ENGINE_SCRIPT = "model.int8.plan", "build_engine.sh"


def trtexec_command(int8_name: str, plan_name: str, strongly_typed: bool = True) -> list[str]:
    """The trtexec arguments for a Q/DQ model.

    TensorRT 10 builds Q/DQ models *strongly typed*: the graph's own types decide precision, and
    ``--int8`` / ``--fp16`` are not allowed. TensorRT 8.5 / 8.6 (JetPack 5 / 6.0) has no strong
    typing: ``--int8`` enables the explicit Q/DQ path and ``--fp16`` lets the float layers
    (LayerNorm, Softmax, GELU, residual Adds) run in half precision.
    """
    cmd = ["trtexec", f"--onnx={int8_name}", f"--saveEngine={plan_name}"]
    if strongly_typed:
        cmd.insert(2, "--stronglyTyped")
    else:
        cmd[2:2] = ["--int8", "--fp16"]
    cmd += ["--memPoolSize=workspace:2048", "--skipInference"]
    return cmd


def write_engine_script(int8_path: Path, out_script: Path, target: TensorRTTarget) -> Path:
    """Write ``build_engine.sh`` (atomic, executable) next to the Q/DQ model.

    Args:
        int8_path: the Q/DQ model; the script refers to it by name, relative to its own folder.
        out_script: where to write the script.
        target: the run's TensorRT target (``strongly_typed`` picks the TensorRT 10 or 8 form; its
            recipe's name and description head the script).
    Returns:
        ``out_script``.
    """
    int8_path, out_script = Path(int8_path), Path(out_script)
    strongly, recipe = target.strongly_typed, target.recipe
    rel = os.path.relpath(int8_path.resolve(), out_script.resolve().parent)
    plan = rel[: -len(".onnx")] + ".plan" if rel.endswith(".onnx") else rel + ".plan"
    cmd = trtexec_command(rel, plan, strongly)
    args = " ".join(shlex.quote(a) for a in cmd[1:])
    desc = recipe.description or target.description or recipe.name
    trt = "TensorRT 10 (JetPack 6.1+)" if strongly else "TensorRT 8.5 / 8.6 (JetPack 5 / 6.0)"
    text = f"""#!/usr/bin/env bash
# Build the TensorRT engine for {Path(rel).name} on the Jetson; run it there, not on the host.
# Recipe: {recipe.name} - {desc}
# Needs {trt}. The model carries explicit Q/DQ: no calibrator, no calibration cache needed.
# Extra trtexec flags are passed through: ./build_engine.sh --verbose
set -euo pipefail
cd "$(dirname "$0")"
TRTEXEC="${{TRTEXEC:-trtexec}}"
if ! command -v "$TRTEXEC" >/dev/null 2>&1 && [ -x /usr/src/tensorrt/bin/trtexec ]; then
  TRTEXEC=/usr/src/tensorrt/bin/trtexec
fi
exec "$TRTEXEC" {args} "$@"
"""
    atomic_write_text(out_script, text)
    mode = out_script.stat().st_mode
    out_script.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return out_script


def build_engine(int8_path: Path, engine_path: Path, *, strongly_typed: bool = True, workspace_mb: int = 2048) -> Path:
    """Build a serialized TensorRT engine from the Q/DQ model with Polygraphy's loaders.

    ``strongly_typed`` builds as ``trtexec --stronglyTyped`` (TensorRT 10: the file's own types
    decide each layer's precision, no precision flags); otherwise as ``--int8 --fp16`` (TensorRT 8).

    Args:
        int8_path: the Q/DQ model (its ``.data`` file beside it, if any).
        engine_path: where the engine goes (written atomically).
        strongly_typed: the target's (``OrinTarget.strongly_typed``).
        workspace_mb: TensorRT's workspace memory pool.
    Returns:
        ``engine_path``.
    Raises:
        BadInput: TensorRT, Polygraphy or a GPU is missing, or TensorRT cannot parse / build the model.
    """
    require_tensorrt("building a TensorRT engine")
    if not Path(int8_path).is_file():
        raise BadInput(f"{int8_path}: no such ONNX file to build an engine from")
    return _build(Path(int8_path), Path(engine_path), strongly_typed, workspace_mb)  # pragma: no cover - needs TensorRT


def _build(int8_path: Path, engine_path: Path, strongly_typed: bool, workspace_mb: int) -> Path:  # pragma: no cover
    import tensorrt as trt
    from polygraphy.backend.trt import CreateConfig, EngineBytesFromNetwork, NetworkFromOnnxPath
    from polygraphy.exception import PolygraphyException

    if strongly_typed and not hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        raise BadInput(f"TensorRT {trt.__version__} has no strongly typed build (TensorRT >= 9 has): "
                       "build for the orin-jp5 target (TensorRT 8: --int8 --fp16)")
    network = NetworkFromOnnxPath(str(int8_path), strongly_typed=strongly_typed)
    pools = {trt.MemoryPoolType.WORKSPACE: workspace_mb << 20}
    # a strongly typed network takes no precision flags: the Q/DQ and float16 types in the file decide
    config = (CreateConfig(memory_pool_limits=pools) if strongly_typed
              else CreateConfig(int8=True, fp16=True, memory_pool_limits=pools))
    try:
        serialized = EngineBytesFromNetwork(network, config=config)()
    except PolygraphyException as exc:
        raise polygraphy_error(exc, f"TensorRT cannot build an engine from {int8_path}") from None
    with atomic_path(engine_path) as tmp:
        Path(tmp).write_bytes(bytes(serialized))
    return engine_path


def engine_script(int8: Path, target: TensorRTTarget) -> Path:
    """Write ``build_engine.sh`` beside the Q/DQ model (an artifact writer of :data:`TENSORRT`)."""
    return write_engine_script(int8, Path(int8).parent / ENGINE_SCRIPT, target)


#: the stage the TensorRT targets add, and so declare (``stages.build_engine``, ``parity.build_engine``)
BUILD_ENGINE = TargetStage("build_engine")


class BuildEngineStage:
    """The Q/DQ model → a TensorRT engine through Polygraphy (the target's ``strongly_typed`` picks
    TensorRT 10's strongly typed build or TensorRT 8's ``--int8 --fp16``), gated with TensorRT itself.

    Never resumed: an engine belongs to the GPU and TensorRT version that built it.
    """

    name: ClassVar[str] = BUILD_ENGINE.name
    needs_torch: ClassVar[bool] = False

    def enabled(self, recipe: Recipe) -> bool:
        return recipe.stages.quantize_int8.enabled and recipe.stages.build_engine.enabled

    def key(self, ctx: RunContext) -> None:
        return None

    def run(self, ctx: RunContext) -> StageOutput:
        missing = tensorrt_missing()
        if missing:
            raise StageSkipped(f"TensorRT or a GPU is not available here (missing: {', '.join(missing)}); "
                               f"{ENGINE_SCRIPT} holds the trtexec command")
        plan = ctx.out_dir / ENGINE_PLAN  # pragma: no cover - needs TensorRT and a GPU
        build_engine(ctx.files[INT8_ONNX], plan, strongly_typed=ctx.target.strongly_typed)  # pragma: no cover
        return StageOutput(files={ENGINE_PLAN: plan})  # pragma: no cover

    def runner(self, ctx: RunContext, out: StageOutput) -> TensorRTRunner:  # pragma: no cover - needs TensorRT and a GPU
        return TensorRTRunner(out.files[ENGINE_PLAN], name=self.name)


#: what the TensorRT targets add to a run (``OrinTarget.contribution()``)
TENSORRT = Contribution(artifacts=(engine_script,), stages=(BuildEngineStage(),))
