"""Shared machinery of the targets whose compiler lives in a venv of its own and runs in a worker process
(``rknn/``, ``ethos_u/``): whether the venv can run, the request's sample files, and waiting on the worker
while its reply names the step it is in."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from ..errors import one_line

__all__ = ["npy_rows", "wait_for_worker", "venv_missing"]


def npy_rows(feeds: Sequence[Mapping[str, np.ndarray]], folder: Path, tag: str) -> list[list[str]]:
    """One ``.npy`` per input and sample (the order of each feed: the model's input order), in the input's own
    dtype (token ids stay int64)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, feed in enumerate(feeds):
        row = []
        for j, arr in enumerate(feed.values()):
            path = folder / f"{tag}{i}_{j}.npy"
            np.save(path, np.ascontiguousarray(arr))
            row.append(str(path))
        rows.append(row)
    return rows


def wait_for_worker(proc: subprocess.Popen, timeout_s: float, reply_path: Path, on_step: Callable[[str], None],
                    label: str, stalled: Callable[[], bool] | None = None) -> int | None:
    """The worker's exit code (None: its process group killed after ``timeout_s``, or as soon as ``stalled``, asked
    each second, says it is stuck); each step it starts (its reply names the step before running it) is told to
    ``on_step`` as ``"<label>: <step>"`` within a second."""
    deadline, said = time.monotonic() + timeout_s, None
    try:
        while True:
            try:
                return proc.wait(timeout=min(1.0, max(deadline - time.monotonic(), 0.01)))
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline or (stalled is not None and stalled()):
                    _kill_group(proc)
                    return None
            try:
                step = json.loads(reply_path.read_text()).get("stage")  # replaced whole by the worker (os.replace)
            except (OSError, ValueError):
                continue  # not written yet
            if step and step != said:
                on_step(f"{label}: {step}")
                said = step
    except BaseException:
        # Ctrl-C, a SIGTERM (the CLI raises it as an interrupt) or an error here: the worker runs in a session of
        # its own, so no signal of the user's reaches it; left alone it would compile on for minutes, orphaned
        _kill_group(proc)
        raise


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def venv_missing(py: Path, imports: str, tool: str, hint: str, timeout_s: float = 300.0) -> str | None:
    """Why a worker venv's toolchain cannot run here (its interpreter ``py`` absent, or ``import <imports>``
    failing in it), naming ``tool`` and ending with ``hint``; None when it can."""
    if not py.is_file():
        return f"{tool} is not installed ({py.parent.parent} does not exist): {hint}"
    res = subprocess.run([str(py), "-I", "-c", f"import {imports}"], capture_output=True, text=True, timeout=timeout_s)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["?"])[-1]
        return f"{tool} does not import in {py.parent.parent} ({one_line(last, 160)}): {hint}"
    return None
