"""The worker-venv plumbing (vitexport/targets/_worker.py): a compiler worker never outlives the run that started it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from vitexport.targets._worker import wait_for_worker


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_an_interrupt_while_waiting_kills_the_workers_process_group(tmp_path):
    proc = subprocess.Popen(["sleep", "120"], start_new_session=True)  # as the clients start a worker
    (tmp_path / "reply.json").write_text(json.dumps({"stage": "build"}))

    def on_step(line: str) -> None:  # the user's Ctrl-C arrives while the worker compiles
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        wait_for_worker(proc, 600, tmp_path / "reply.json", on_step, "compiler")
    assert proc.returncode == -signal.SIGKILL and _gone(proc.pid)


_RUN = textwrap.dedent('''
    import subprocess, sys
    from pathlib import Path
    from vitexport.cli import _terminate_as_interrupt
    from vitexport.targets._worker import wait_for_worker
    proc = subprocess.Popen(["sleep", "120"], start_new_session=True)
    print(proc.pid, flush=True)
    with _terminate_as_interrupt():
        try:
            wait_for_worker(proc, 600, Path(sys.argv[1]), print, "compiler")
        except KeyboardInterrupt:
            sys.exit(130)
''')


def test_sigterm_to_the_cli_kills_its_worker_too(tmp_path):
    # `timeout`, a CI runner or `kill` sends SIGTERM to vitexport alone: its worker, in a session of its own, must
    # not compile on for minutes as an orphan (two RKNN builds did, 10 minutes after their exports were killed)
    run = subprocess.Popen([sys.executable, "-c", _RUN, str(tmp_path / "reply.json")], stdout=subprocess.PIPE, text=True)
    worker = int(run.stdout.readline())
    time.sleep(0.5)
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 130
    assert _gone(worker)
