"""Orin artifacts: the ``trtexec`` script the Jetson runs, and an engine build with the TensorRT
Python API where TensorRT and a GPU exist (``tensorrt`` is imported only inside the function)."""
from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

from ..errors import BadInput
from ..io import atomic_path, atomic_write_text

__all__ = ["trtexec_command", "write_engine_script", "build_engine"]


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


def write_engine_script(int8_path: Path, out_script: Path, recipe) -> Path:
    """Write ``build_engine.sh`` (atomic, executable) next to the Q/DQ model.

    Args:
        int8_path: the Q/DQ model; the script refers to it by name, relative to its own folder.
        out_script: where to write the script.
        recipe: the recipe (``quantization.strongly_typed`` picks the TensorRT 10 or 8 form).
    Returns:
        ``out_script``.
    """
    int8_path, out_script = Path(int8_path), Path(out_script)
    strongly = bool(getattr(getattr(recipe, "quantization", None), "strongly_typed", True))
    rel = os.path.relpath(int8_path.resolve(), out_script.resolve().parent)
    plan = rel[: -len(".onnx")] + ".plan" if rel.endswith(".onnx") else rel + ".plan"
    cmd = trtexec_command(rel, plan, strongly)
    args = " ".join(shlex.quote(a) for a in cmd[1:])
    desc = getattr(recipe, "description", "") or getattr(recipe, "name", "")
    trt = "TensorRT 10 (JetPack 6.1+)" if strongly else "TensorRT 8.5 / 8.6 (JetPack 5 / 6.0)"
    text = f"""#!/usr/bin/env bash
# Build the TensorRT engine for {Path(rel).name} on the Jetson; run it there, not on the host.
# Recipe: {getattr(recipe, 'name', '?')} - {desc}
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


def build_engine(int8_path: Path, engine_path: Path, *, strongly_typed: bool = True, workspace_mb: int = 2048) -> Path:  # pragma: no cover - needs TensorRT
    """Build a serialized TensorRT engine from the Q/DQ model with the TensorRT Python API.

    Raises:
        BadInput: TensorRT or a GPU is not available, or TensorRT cannot parse / build the model.
    """
    # imported here: vitexport.engines pulls in torch, which quantization itself never needs
    from ..engines.trt_runner import tensorrt_available

    if not tensorrt_available():
        raise BadInput("building a TensorRT engine needs the 'tensorrt' package and an NVIDIA GPU; "
                       "neither is here - run build_engine.sh on the Jetson instead")
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    major = int(trt.__version__.split(".")[0])
    flags = 0
    if major < 10:
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    if strongly_typed and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        typed = True
    else:
        typed = False
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(int8_path)):
        errs = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BadInput(f"TensorRT cannot parse {int8_path}: {errs}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    if not typed:
        config.set_flag(trt.BuilderFlag.INT8)
        config.set_flag(trt.BuilderFlag.FP16)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BadInput(f"TensorRT failed to build an engine from {int8_path} (see its log above)")
    with atomic_path(engine_path) as tmp:
        Path(tmp).write_bytes(bytes(serialized))
    return Path(engine_path)
