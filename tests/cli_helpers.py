"""Running the ``vitexport`` command the way a user does (a subprocess), for the CLI tests."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ["ROOT", "run_cli"]

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 600,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m vitexport ARGS`` (in ``env``, else this process's environment); returns the
    completed process (stdout/stderr as text)."""
    return subprocess.run(
        [sys.executable, "-m", "vitexport", *args],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
