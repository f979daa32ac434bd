"""The client of the rknn-toolkit2 worker: one call compiles an ONNX file for a Rockchip NPU, runs it on
RKNN's x86 simulator and says what the NPU runs.

rknn-toolkit2 lives in ``.venv-rknn`` (``make setup-rknn``): it pins numpy<=1.26.4 / onnx<=1.18 and can
segfault, so it is never imported here. :func:`run_rknn` writes a JSON request and the inputs as
``.npy`` files, launches ``worker.py`` with that venv's interpreter under a timeout, sends the
toolchain's output to a log file (never the terminal), and reads back the reply, the outputs and the
op table of the log. A crash, a timeout or an RKNN error becomes one :class:`BadInput` line (exit 2)
naming the stage, the compiler pass and RKNN's own error line.

Request (JSON, written by :meth:`RknnRequest.to_json`)::

    {"onnx": PATH, "platform": "rk3588" (any rknn-toolkit2 target_platform), "config": {RKNN.config kwargs},
     "quantization": {"mode": "none" | "rknn" | "hybrid", "dataset": [[npy per input], ...],
                      "ranges": {onnx tensor: [lo, hi]}, "layers": {rknn tensor: "float16"}},
     "rknn": PATH | null, "inputs": [[npy per input], ...], "outputs_dir": DIR, "work_dir": DIR,
     "accuracy_analysis": {"inputs": [npy], "output_dir": DIR} | null, "reply": PATH}

Reply: ``{"ok", "stage" (the one running when it stopped), "stages" {name: seconds},
"seconds_per_sample", "outputs" [output_j.npy, samples stacked], "hybrid" {matched, unmatched},
"accuracy_analysis" PATH, "error"}``.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
import onnx
from pydantic import BaseModel, ConfigDict, Field

from ...errors import BadInput, one_line
from .._worker import npy_rows, venv_missing, wait_for_worker
from ...graph.files import load_model
from ...graph.macs import conv_groups
from .graph import rknn_hazards
from .log import OpRow, OpSummary, error_lines, last_pass, op_summary, parse_op_table, with_groups

__all__ = ["RknnRequest", "RknnQuantization", "RknnResult", "run_rknn", "rknn_python", "rknn_available",
           "rknn_missing", "require_rknn", "WORKER", "SETUP_HINT", "RKNN_VENV_ENV"]

WORKER = Path(__file__).with_name("worker.py")
#: where ``make setup-rknn`` puts the venv: the repository root (this package is installed editable)
_DEFAULT_VENV = Path(__file__).resolve().parents[3] / ".venv-rknn"
RKNN_VENV_ENV = "VITEXPORT_RKNN_VENV"
SETUP_HINT = "run `make setup-rknn` (creates .venv-rknn with rknn-toolkit2 2.5.0)"


def rknn_python() -> Path:
    """The interpreter of the rknn venv (``$VITEXPORT_RKNN_VENV`` or ``<repo>/.venv-rknn``)."""
    venv = Path(os.environ.get(RKNN_VENV_ENV) or _DEFAULT_VENV)
    return venv / "bin" / "python"


def rknn_missing() -> str | None:
    """Why the toolchain cannot run here, or None when it can (one import, ~3 s)."""
    return venv_missing(rknn_python(), "rknn.api", "rknn-toolkit2", SETUP_HINT, timeout_s=120)


def rknn_available() -> bool:
    return rknn_missing() is None


def require_rknn() -> Path:
    """The rknn interpreter. Raises BadInput naming ``make setup-rknn`` when it is missing."""
    py = rknn_python()
    if not py.is_file():
        raise BadInput(f"the rk3588 target needs rknn-toolkit2, which is not installed: {SETUP_HINT}")
    return py


class RknnQuantization(BaseModel):
    """How ``build`` quantizes: ``none`` (FP16, or a QDQ file's own INT8), ``rknn`` (RKNN's own
    quantizer on ``dataset``), ``hybrid`` (its two steps, ``ranges`` / ``layers`` written into the
    quantization config between them)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    mode: Literal["none", "rknn", "hybrid"] = "none"
    dataset: list[dict[str, np.ndarray]] | None = Field(default=None, exclude=True)
    ranges: dict[str, tuple[float, float]] = Field(default_factory=dict)
    layers: dict[str, Literal["int8", "int16", "float16"]] = Field(default_factory=dict)


class RknnRequest(BaseModel):
    """One compile-and-simulate request (see the module docstring for the JSON the worker reads)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    onnx: Path
    #: rknn-toolkit2's ``target_platform`` (the target names it)
    platform: str
    config: dict[str, Any] = Field(default_factory=dict)
    quantization: RknnQuantization = Field(default_factory=RknnQuantization)
    rknn: Path | None = None
    inputs: list[dict[str, np.ndarray]] = Field(default_factory=list)
    accuracy_analysis: int = 0  # samples of ``inputs`` to analyse per layer (0: none)


class RknnResult(BaseModel):
    """What the worker did: timings, the simulator's outputs, RKNN's op table and its summary."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    reply: dict[str, Any]
    outputs: list[np.ndarray]
    ops: list[OpRow]
    summary: OpSummary
    log: Path
    wall_s: float

    @property
    def stages(self) -> dict[str, float]:
        return self.reply.get("stages", {})

    @property
    def compile_s(self) -> float:
        """Seconds of load_onnx + build + export_rknn."""
        return sum(self.stages.get(k, 0.0) for k in ("load_onnx", "build", "export_rknn"))

    @property
    def seconds_per_sample(self) -> float | None:
        return self.reply.get("seconds_per_sample")


def _write_request(req: RknnRequest, work: Path) -> Path:
    q = req.quantization
    body = {
        "onnx": str(Path(req.onnx).resolve()), "platform": req.platform, "config": req.config,
        "quantization": {"mode": q.mode, "ranges": {k: list(v) for k, v in q.ranges.items()}, "layers": q.layers,
                         "dataset": npy_rows(q.dataset, work / "dataset", "cal") if q.dataset else None},
        "rknn": str(Path(req.rknn).resolve()) if req.rknn else None,
        "inputs": npy_rows(req.inputs, work / "inputs", "x"), "outputs_dir": str(work / "outputs"),
        "work_dir": str(work / "rknn"), "reply": str(work / "reply.json"), "accuracy_analysis": None,
    }
    if req.accuracy_analysis:
        rows = body["inputs"][: req.accuracy_analysis]
        body["accuracy_analysis"] = {"inputs": [p for row in rows for p in row], "output_dir": str(work / "analysis")}
    path = work / "request.json"
    path.write_text(json.dumps(body, indent=1))
    return path


#: RKNN's ``E`` lines that are not the error: a line every build prints, the version banner, the traceback
_NOT_THE_ERROR = ("RKNN: [", "rknn-toolkit2 version", "build: Traceback", "load_onnx: Traceback", "Traceback")


def _hazards(onnx: Path) -> list[str]:
    try:
        return [str(h) for h in rknn_hazards(load_model(onnx))]
    except Exception:  # the diagnosis is a courtesy: an unreadable file still gets the crash line
        return []


def _named_node(onnx_path: Path, error: str) -> str:
    """The node an RKNN error names through a tensor it derived (``KeyError: 'x_dq_conv'``: the Conv
    that reads ``x_dq``), as ``"; node N (Op) reads 'x_dq'"``, or ``""``."""
    quoted = re.findall(r"'([^']+)'", error)
    if not quoted:
        return ""
    try:
        graph = onnx.load(str(onnx_path), load_external_data=False).graph
    except Exception:  # the diagnosis is a courtesy: an unreadable file still gets RKNN's line
        return ""
    named = {n.name: n for n in graph.node}
    for q in quoted:
        if q in named:
            return f"; node {q} ({named[q].op_type})"
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            if name:  # an optional input left out is named ''
                readers.setdefault(name, []).append(node)
    for q in quoted:
        known = sorted((v for v in readers if q.startswith(v)), key=len, reverse=True)
        if known:
            n = readers[known[0]][-1]
            return f"; node {n.name} ({n.op_type}) reads '{known[0]}'"
    return ""


#: how often RKNN may say one of its optimiser's rules "may fall into an infinite loop" before the build is stopped: the
#: task zoo's UperNet printed it 35 582 times in 26 minutes (about 23 a second) and never finished
LOOP_REPEATS = 500
_LOOP_SAYS = b"may fall into an infinite loop"


class LoopWatch:
    """Counts, as RKNN writes its log, the lines where its graph optimiser warns that a rule may loop forever;
    :meth:`__call__` says whether it has done so :data:`LOOP_REPEATS` times (the build is stuck there)."""

    def __init__(self, log: Path, repeats: int = LOOP_REPEATS):
        self.log, self.repeats, self.count, self._offset, self._tail = log, repeats, 0, 0, b""

    def __call__(self) -> bool:
        try:
            with open(self.log, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return False
        self._offset += len(chunk)
        text = self._tail + chunk
        self.count += text.count(_LOOP_SAYS)
        self._tail = text[-(len(_LOOP_SAYS) - 1):]  # a phrase cut between two reads (too short to hold a whole one)
        return self.count >= self.repeats


def _failure(reply: dict, rc: int | None, log: Path, timeout_s: float, onnx_path: Path, looped: int = 0) -> BadInput:
    """One line: what stopped, where (stage, compiler pass, the node and the rule), RKNN's own words, the log."""
    stage = reply.get("stage") or "startup"
    where = f"in stage {stage}"
    cpass = last_pass(log) if stage == "build" else None
    if cpass:
        where += f" (compiler pass {cpass})"
    hazards = _hazards(onnx_path)  # name the nodes of patterns known to crash, hang or be refused
    where += f"; {hazards[0]}" + (f" (and {len(hazards) - 1} more)" if len(hazards) > 1 else "") if hazards else ""
    errors = [e for e in error_lines(log) if not e.startswith(_NOT_THE_ERROR)]
    said = f": RKNN says {one_line(errors[0], 200)!r}" if errors else ""
    if errors and not hazards:
        said += _named_node(onnx_path, errors[0])
    if looped:
        what = f"rknn-toolkit2's graph optimiser looped and was stopped (its warning that a rule may loop forever, {looped} times)"
    elif rc is None:
        what = f"rknn-toolkit2 did not finish within {timeout_s:.0f} s"
    elif rc < 0:
        what = f"rknn-toolkit2 crashed ({signal.Signals(-rc).name})"
    elif errors:
        what = "rknn-toolkit2 refused the model"
    else:
        what = f"rknn-toolkit2 failed ({one_line(reply.get('error') or f'exit {rc}', 160)})"
    return BadInput(f"{onnx_path.name}: {what} {where}{said} (log: {log})")


def _as_onnx_shapes(outputs: list[np.ndarray], onnx_path: Path) -> list[np.ndarray]:
    """Each output (samples stacked) in the ONNX graph's output shape: ``remove_reshape`` leaves RKNN's
    own layout of it ((1, C, 1, 1) for (1, C); the same values in the same order), which is a view."""
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    shapes = [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in graph.output]
    out = []
    for arr, shape in zip(outputs, shapes):
        per = int(np.prod(shape[1:])) if shape and all(shape[1:]) else 0
        out.append(arr.reshape(-1, *shape[1:]) if per and arr.size % per == 0 else arr)
    return out + outputs[len(out):]


def _rknn_groups(model) -> dict[str, int]:
    """:func:`conv_groups`, and for each ``Add`` of parallel grouped Convs of one group count (FastViT's and
    MobileOne's kxk + 1x1 branches) the name RKNN gives the one Conv it fuses them into
    (``<Add>_fused``, listed with a dense weight): its MACs are those of the grouped branch."""
    groups = conv_groups(model)
    for node in model.graph:
        if node.op_type != "Add":
            continue
        convs = [v.producer() for v in node.inputs if v is not None and v.producer() is not None and v.producer().op_type == "Conv"]
        counts = {groups.get(c.name, 1) for c in convs}
        if len(convs) >= 2 and len(counts) == 1 and counts != {1}:
            groups[f"{node.name}_fused"] = counts.pop()
    return groups


def run_rknn(req: RknnRequest, work_dir: str | Path, *, timeout_s: float = 600.0,
             on_step: Callable[[str], None] = lambda doing: None) -> RknnResult:
    """Compile ``req.onnx`` with rknn-toolkit2 in its worker, simulate, and read back what happened.

    Args:
        req: the request (model, RKNN config, quantization, inputs to simulate).
        work_dir: a folder for the request, the ``.npy`` files, RKNN's files and ``rknn.log``.
        timeout_s: the worker is killed after this many seconds.
        on_step: told each step the worker starts (``"rknn-toolkit2: build"``): a stage's heartbeat.
    Returns:
        :class:`RknnResult` (outputs stacked over the samples, the op table and its summary).
    Raises:
        BadInput: the toolchain is missing (naming ``make setup-rknn``), crashed, timed out or
            refused the model (stage, compiler pass and RKNN's error line named).
    """
    py = require_rknn()
    work = Path(work_dir).resolve()  # the worker runs in it: every path it reads must be absolute (a relative --out)
    work.mkdir(parents=True, exist_ok=True)
    path = _write_request(req, work)
    log = work / "rknn.log"
    reply_path = work / "reply.json"
    reply_path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with open(log, "w") as logf:
        proc = subprocess.Popen([str(py), "-I", str(WORKER), str(path)], stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=work, start_new_session=True)
        looping = LoopWatch(log)
        rc = wait_for_worker(proc, timeout_s, reply_path, on_step, "rknn-toolkit2", stalled=looping)
    wall = time.perf_counter() - t0
    reply = json.loads(reply_path.read_text()) if reply_path.is_file() else {}
    if rc != 0 or not reply.get("ok"):
        raise _failure(reply, rc, log, timeout_s, Path(req.onnx), looping.count if looping.count >= looping.repeats else 0)
    # RKNN lists a grouped conv as the dense one it computes: the source's group counts say which
    ops = with_groups(parse_op_table(log), _rknn_groups(load_model(req.onnx)))
    outputs = _as_onnx_shapes([np.load(p) for p in reply.get("outputs", [])], Path(req.onnx))
    return RknnResult(reply=reply, outputs=outputs, ops=ops, summary=op_summary(ops), log=log, wall_s=wall)
