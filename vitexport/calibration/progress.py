"""A progress bar on stderr (rich) that stays silent when stderr is not a terminal."""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

__all__ = ["progress"]


class _Silent:
    def advance(self, n: int = 1) -> None:
        pass


class _Bar:
    def __init__(self, prog, task):
        self._prog, self._task = prog, task

    def advance(self, n: int = 1) -> None:
        self._prog.advance(self._task, n)


@contextlib.contextmanager
def progress(description: str, total: int | None, enabled: bool | None = None) -> Iterator[_Silent | _Bar]:
    """``with progress('calibrating', n) as bar: bar.advance(k)``; no output unless stderr is a TTY."""
    if enabled is None:
        enabled = bool(getattr(sys.stderr, "isatty", lambda: False)())
    if not enabled:
        yield _Silent()
        return
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        console=Console(stderr=True), transient=True,
    ) as prog:
        yield _Bar(prog, prog.add_task(description, total=total))
