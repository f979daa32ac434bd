"""The client of the Ethos-U worker: one call quantizes a torch program for Arm Ethos-U with ExecuTorch's
Arm backend, compiles it with Vela, runs the INT8 program on the TOSA reference model and says what the
NPU runs.

ExecuTorch 1.5.1, ethos-u-vela 5.2.0 and tosa-tools live in ``.venv-ethos`` (``make setup-ethos``; torch is
the project's own pin, linked in by ``scripts/share_torch.py``), so none of them is imported here.
:func:`run_ethos` saves the program (``torch.export``) and the samples as ``.npy`` files, launches
``worker.py`` with that venv's interpreter under a timeout, sends the toolchain's output to a log file,
and reads back the reply. A crash, a timeout or a toolchain error becomes one :class:`BadInput` line
(exit 2) naming the step and the toolchain's own last error line.

Request (JSON)::

    {"route": "executorch" | "tflite", "program": PT2 | program.json, "program_npz": NPZ (tflite),
     "vela_input": PATH (tflite: the integer .tflite Vela read), "input_names": [str], "accelerator": "ethos-u85-256", "system_config": str | null, "memory_mode": str | null,
     "per_channel": bool, "activations": "int8" | "int16", "calibration": [[npy per input], ...], "inputs": [[npy per input], ...],
     "work_dir": DIR, "outputs_dir": DIR, "reply": PATH, "pte": PATH}

Reply: ``{"ok", "stage", "stages" {step: seconds}, "mask_fill" [{node, fill}], "system_config",
"memory_mode", "partitions" [Vela's summary CSV row per partition], "cpu_ops" [{node, op, macs, moves}],
"delegates", "outputs" [output_j.npy, samples stacked: the reference model's], "quantized_outputs" [the
quantized program's in torch, likewise], "seconds_per_sample", "error"}``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ...errors import BadInput, one_line
from .._worker import npy_rows, venv_missing, wait_for_worker

__all__ = ["EthosRequest", "EthosResult", "run_ethos", "ethos_python", "ethos_missing", "require_ethos", "WORKER",
           "SETUP_HINT", "ETHOS_VENV_ENV"]

WORKER = Path(__file__).with_name("worker.py")
#: where ``make setup-ethos`` puts the venv: the repository root (this package is installed editable)
_DEFAULT_VENV = Path(__file__).resolve().parents[3] / ".venv-ethos"
ETHOS_VENV_ENV = "VITEXPORT_ETHOS_VENV"
SETUP_HINT = ("run `make setup-ethos` (creates .venv-ethos with executorch 1.5.1, ethos-u-vela 5.2.0, tosa-tools, "
              "ai-edge-litert)")


def ethos_python() -> Path:
    """The interpreter of the Ethos-U venv (``$VITEXPORT_ETHOS_VENV`` or ``<repo>/.venv-ethos``)."""
    return Path(os.environ.get(ETHOS_VENV_ENV) or _DEFAULT_VENV) / "bin" / "python"


def ethos_missing() -> str | None:
    """Why the toolchain cannot run here, or None when it can (one import of each tool, a few seconds)."""
    return venv_missing(ethos_python(), "ethosu.vela, tosa_reference_model, executorch.exir, ai_edge_litert.interpreter",
                        "the Ethos-U toolchain",
                        SETUP_HINT)


def require_ethos() -> Path:
    """The Ethos-U interpreter. Raises BadInput naming ``make setup-ethos`` when it is missing."""
    py = ethos_python()
    if not py.is_file():
        raise BadInput(f"the ethos-u targets need ExecuTorch's Arm backend and Vela, which are not installed: {SETUP_HINT}")
    return py


class EthosRequest(BaseModel):
    """One quantize-compile-reference request (see the module docstring for the JSON the worker reads)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    #: ``executorch``: a ``torch.export`` program (``.pt2``) of the model as vitexport's passes left it;
    #: ``tflite``: the lowered program's ``program.json`` (:mod:`.tflite_lower`)
    program: Path
    #: ``executorch`` (ExecuTorch's Arm backend → TOSA → Vela) or ``tflite`` (LiteRT's quantizer → Vela)
    route: str = "executorch"
    #: the ``tflite`` route's constants (``program.npz``)
    program_npz: Path | None = None
    #: Vela's ``--accelerator-config`` (``ethos-u85-256``, ``ethos-u55-128``)
    accelerator: str
    system_config: str | None = None
    memory_mode: str | None = None
    per_channel: bool = True
    #: ``int16`` or ``int8`` activations (weights int8 either way; see ``EthosUOptions.activations``)
    activations: str = "int16"
    calibration: list[dict[str, np.ndarray]] = Field(default_factory=list)
    inputs: list[dict[str, np.ndarray]] = Field(default_factory=list)
    #: where the artifact is written (``model.pte``; Vela's optimized ``model.tflite`` on the tflite route)
    pte: Path
    #: the tflite route: where the integer ``.tflite`` Vela read (and LiteRT ran) is written
    vela_input: Path | None = None
    #: the tflite route: the attention masks whose minus infinity the lowering calibrated (for the report)
    mask_fill: list[dict[str, Any]] = Field(default_factory=list)


class EthosResult(BaseModel):
    """What the worker did: timings, the reference outputs, Vela's summaries, the CPU ops."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    reply: dict[str, Any]
    #: the INT8 program on the parity inputs, partitions on the TOSA reference model (samples stacked)
    outputs: list[np.ndarray]
    #: the quantized program in torch (Q/DQ as float ops) on the same inputs
    quantized: list[np.ndarray]
    log: Path
    wall_s: float

    @property
    def stages(self) -> dict[str, float]:
        return self.reply.get("stages", {})

    @property
    def partitions(self) -> list[dict[str, str]]:
        """Vela's summary CSV row of each NPU partition (cycles, inference_time, sram / flash KiB, nn_macs)."""
        return self.reply.get("partitions", [])

    @property
    def cpu_ops(self) -> list[dict[str, Any]]:
        """The ops left outside every NPU partition: ``{node, op, macs, moves}``."""
        return self.reply.get("cpu_ops", [])


def _write_request(req: EthosRequest, work: Path) -> Path:
    body = {"program": str(Path(req.program).resolve()), "accelerator": req.accelerator,
            "input_names": list((req.inputs or req.calibration)[0]), "system_config": req.system_config, "memory_mode": req.memory_mode, "per_channel": req.per_channel,
            "activations": req.activations,
            "calibration": npy_rows(req.calibration, work / "calibration", "cal"),
            "inputs": npy_rows(req.inputs, work / "inputs", "x"), "work_dir": str(work / "arm"),
            "outputs_dir": str(work / "outputs"), "reply": str(work / "reply.json"), "pte": str(Path(req.pte).resolve()),
            "route": req.route, "mask_fill": req.mask_fill}
    if req.route == "tflite":
        body["program_npz"] = str(Path(req.program_npz or "").resolve())
        body["vela_input"] = str(Path(req.vela_input or "").resolve())
    path = work / "request.json"
    path.write_text(json.dumps(body, indent=1))
    return path


def _failure(reply: dict, rc: int | None, log: Path, timeout_s: float) -> BadInput:
    """One line: which step stopped, the toolchain's own words, the log."""
    step = reply.get("stage") or "startup"
    if rc is None:
        what = f"did not finish within {timeout_s:.0f} s"
    elif rc < 0:
        what = f"crashed ({signal.Signals(-rc).name})"
    else:
        what = f"failed: {one_line(reply.get('error') or f'exit {rc}', 240)}"
    return BadInput(f"the Ethos-U toolchain (ExecuTorch Arm backend / Vela) {what} in step {step} (log: {log})")


def run_ethos(req: EthosRequest, work_dir: str | Path, *, timeout_s: float = 3600.0,
              on_step: Callable[[str], None] = lambda doing: None) -> EthosResult:
    """Quantize, compile and run ``req.program`` on the reference model in the Ethos-U worker.

    Args:
        req: the request (program, accelerator, system configuration, samples).
        work_dir: a folder for the request, the ``.npy`` files, the partitions' TOSA, Vela's output, the log.
        timeout_s: the worker is killed after this many seconds.
        on_step: told each step the worker starts (``"ethos-u: lower"``): a stage's heartbeat.
    Returns:
        :class:`EthosResult` (reference outputs stacked over the samples, Vela's summaries, the CPU ops).
    Raises:
        BadInput: the toolchain is missing (naming ``make setup-ethos``), crashed, timed out or failed.
    """
    py = require_ethos()
    work = Path(work_dir).resolve()  # the worker runs in it: every path it reads must be absolute
    work.mkdir(parents=True, exist_ok=True)
    path = _write_request(req, work)
    log, reply_path = work / "ethos.log", work / "reply.json"
    reply_path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with open(log, "w") as logf:
        proc = subprocess.Popen([str(py), "-I", str(WORKER), str(path)], stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=work, start_new_session=True)
        rc = wait_for_worker(proc, timeout_s, reply_path, on_step, "ethos-u")
    wall = time.perf_counter() - t0
    reply = json.loads(reply_path.read_text()) if reply_path.is_file() else {}
    if rc != 0 or not reply.get("ok"):
        raise _failure(reply, rc, log, timeout_s)
    outputs = [np.load(p) for p in reply.get("outputs", [])]
    quantized = [np.load(p) for p in reply.get("quantized_outputs", [])]
    return EthosResult(reply=reply, outputs=outputs, quantized=quantized, log=log, wall_s=wall)
