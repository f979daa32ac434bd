"""Signs of life during a long wait: a stage, a toolchain's worker, a parity check.

A run can sit in one call for minutes (rk3588: rknn-toolkit2 compiles and simulates in a worker
process that prints nothing to the terminal). :class:`Heartbeat` wraps any such wait: on a terminal
a transient rich spinner with the elapsed time, elsewhere (a log file, CI, a pipe) one line every
``every_s`` seconds (``"build_engine: still running, 20 s (rknn-toolkit2: build)"``), so that a
reader of the log can tell a slow stage from a hung one. Nothing is printed for a wait shorter
than ``every_s``. What the wait is doing now (the part in brackets) is whatever the code inside
last passed to :meth:`Beat.say`.
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

__all__ = ["Heartbeat", "Beat", "DEFAULT_EVERY_S"]

#: at most this long without a line during a wait (issue 31: "a line at least every 10 s")
DEFAULT_EVERY_S = 10.0


class Beat:
    """One tracked wait: :meth:`say` tells it what the work is doing now (shown on the next line)."""

    def __init__(self, on_change: Callable[[str], None] = lambda s: None):
        self.doing = ""
        self._on_change = on_change

    def say(self, doing: str) -> None:
        """What the work is doing now (``"rknn-toolkit2: build"``); called from any thread."""
        self.doing = doing
        self._on_change(doing)


@dataclass(frozen=True)
class Heartbeat:
    """How a long wait shows it is alive.

    Attributes:
        every_s: seconds between two "still running" lines (the first after ``every_s``).
        live: draw a transient rich spinner on the terminal instead of lines (the CLI sets it when
            stdout is a terminal); it disappears when the wait ends, leaving the stage's own line.
    """

    every_s: float = DEFAULT_EVERY_S
    live: bool = False

    @contextlib.contextmanager
    def track(self, label: str, say: Callable[[str], None]) -> Iterator[Beat]:
        """Show that ``label`` is still running while the ``with`` block runs.

        Args:
            label: what is waited on, first on each line (a stage name).
            say: where the lines go (the run's log); called from a background thread.
        Returns:
            (as the ``with`` target) the :class:`Beat`, to say what the work is doing now.
        """
        if self.live:
            with _spinner(label) as beat:
                yield beat
            return
        stop, beat = threading.Event(), Beat()
        t0 = time.monotonic()

        def beating() -> None:
            while not stop.wait(self.every_s):
                say(f"{label}: still running, {time.monotonic() - t0:.0f} s" + (f" ({beat.doing})" if beat.doing else ""))

        thread = threading.Thread(target=beating, name=f"heartbeat-{label}", daemon=True)
        thread.start()
        try:
            yield beat
        finally:
            stop.set()
            thread.join()


@contextlib.contextmanager
def _spinner(label: str) -> Iterator[Beat]:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # only on a terminal

    # transient: the spinner goes when the wait ends; the loop's own line for the stage stays
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task(f"{label}: running", total=None)
        yield Beat(lambda doing: bar.update(task, description=f"{label}: running ({doing})"))
