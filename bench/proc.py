"""Run one measurement in a child process, with a memory cap and a peak-memory record.

The parent never imports torch or onnxruntime: it stays small, so nothing it holds is mistaken for a
child's memory. The child reports its own peak (``VmHWM`` of ``/proc/self/status``, the kernel's
high-water mark of resident memory, exact and per process). A watchdog thread samples the child's
resident memory every ``poll_s`` and kills it above ``cap_bytes``; a killed child's peak is the
watchdog's largest sample, and the measurement reads "exceeded N GB".

``resource.setrlimit(RLIMIT_AS)`` would be simpler but wrong here: torch and ONNX Runtime reserve far
more address space than they ever touch, so an address-space cap fails runs that fit in memory.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

__all__ = ["ChildResult", "run_child", "GB"]

GB = 1024**3
REPO = Path(__file__).resolve().parents[1]


@dataclass
class ChildResult:
    """What one child measurement produced.

    Attributes:
        ok: the child finished and reported a result.
        data: the JSON object the child wrote (empty when it did not get that far).
        wall_s: wall time of the child process, start to exit (imports included).
        peak_bytes: peak resident memory of the child (its own record, else the watchdog's).
        error: one line saying what went wrong, or None.
        exceeded_cap: the watchdog killed the child above the memory cap.
        cap_bytes: the cap the child ran under.
    """

    ok: bool
    data: dict = field(default_factory=dict)
    wall_s: float = 0.0
    peak_bytes: int = 0
    error: str | None = None
    exceeded_cap: bool = False
    cap_bytes: int = 0

    def to_dict(self) -> dict:
        return {
            "ok": self.ok, "data": self.data, "wall_s": self.wall_s, "peak_bytes": self.peak_bytes,
            "error": self.error, "exceeded_cap": self.exceeded_cap, "cap_bytes": self.cap_bytes,
        }


def _rss(proc: psutil.Process) -> int:
    """Resident memory of the child (workers use threads, never helper processes)."""
    try:
        return proc.memory_info().rss
    except psutil.Error:
        return 0


def _last_line(text: str) -> str:
    """The most telling line of a child's stderr: the last non-empty one (a traceback's error)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def run_child(
    task: str,
    args: dict,
    *,
    cap_bytes: int,
    timeout_s: float = 3600.0,
    poll_s: float = 0.1,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    python: str | None = None,
    module: str = "bench.worker",
) -> ChildResult:
    """Run ``python -m bench.worker TASK`` with ``args`` (JSON) and collect its result.

    Args:
        task: the worker task name (``bench.worker.TASKS``).
        args: JSON-serialisable arguments for the task.
        cap_bytes: the child is killed when its resident memory goes above this.
        timeout_s: the child is killed after this many seconds.
        poll_s: the watchdog's sampling period.
        log_path: where the child's stdout/stderr go (kept for post-mortems); a temp file if None.
        env: extra environment variables.
        python: the interpreter (default this one; the peers run in their own venv's).
        module: the worker module (``bench.worker``, or ``bench.peers`` for the peers).
    Returns:
        A :class:`ChildResult`; never raises for a failing child.
    """
    with tempfile.TemporaryDirectory(prefix="vxbench-") as tmp:
        out_json = Path(tmp) / "result.json"
        args_json = Path(tmp) / "args.json"
        args_json.write_text(json.dumps(args))
        log = Path(log_path) if log_path else Path(tmp) / "child.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [python or sys.executable, "-m", module, task, str(args_json), str(out_json)]
        child_env = {**os.environ, **(env or {})}
        t0 = time.perf_counter()
        with open(log, "w") as logf:
            # A new session: the watchdog kills the whole process group at once.
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=logf, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
            ps = psutil.Process(proc.pid)
            peak = 0
            killed_for: str | None = None
            stop = threading.Event()

            def watch() -> None:
                nonlocal peak, killed_for
                while not stop.is_set():
                    rss = _rss(ps)
                    peak = max(peak, rss)
                    if rss > cap_bytes:
                        killed_for = "memory"
                    elif time.perf_counter() - t0 > timeout_s:
                        killed_for = "timeout"
                    if killed_for:
                        try:
                            os.killpg(proc.pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                        return
                    stop.wait(poll_s)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            try:
                rc = proc.wait()
            except BaseException:
                # Ctrl-C or SIGTERM of the bench: the child is in its own session and would outlive it.
                os.killpg(proc.pid, signal.SIGKILL)
                raise
            finally:
                stop.set()
                watcher.join()
        wall = time.perf_counter() - t0
        text = log.read_text(errors="replace") if log.is_file() else ""
        res = ChildResult(ok=False, wall_s=wall, peak_bytes=peak, cap_bytes=cap_bytes)
        if killed_for == "memory":
            res.exceeded_cap = True
            res.error = f"exceeded {cap_bytes / GB:.1f} GB"
            return res
        if killed_for == "timeout":
            res.error = f"timed out after {timeout_s:.0f} s"
            return res
        if out_json.is_file():
            res.data = json.loads(out_json.read_text())
            res.peak_bytes = int(res.data.get("peak_bytes") or peak)
            res.error = res.data.get("error")
            res.ok = res.error is None
        else:
            res.error = f"worker exited {rc}: {_last_line(text) or 'no output'}"
        return res
