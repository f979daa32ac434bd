"""Signs of life during a long wait: a stage, a toolchain's worker, a parity check.

A run can sit in one call for minutes (rk3588: rknn-toolkit2 compiles and simulates in a worker
process that prints nothing to the terminal). :class:`Heartbeat` wraps any such wait: on a terminal
a transient rich spinner with the elapsed time, elsewhere (a log file, CI, a pipe) one line every
``every_s`` seconds (``"build_engine: still running, 20 s"``), so that a reader of the log can tell
a slow stage from a hung one. Nothing is printed for a wait shorter than ``every_s``.
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

__all__ = ["Heartbeat", "DEFAULT_EVERY_S"]

#: at most this long without a line during a wait (issue 31: "a line at least every 10 s")
DEFAULT_EVERY_S = 10.0


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
    def track(self, label: str, say: Callable[[str], None]) -> Iterator[None]:
        """Show that ``label`` is still running while the ``with`` block runs.

        Args:
            label: what is waited on, first on each line (a stage name).
            say: where the lines go (the run's log); called from a background thread.
        """
        if self.live:
            with _spinner(label):
                yield
            return
        stop = threading.Event()
        t0 = time.monotonic()

        def beat() -> None:
            while not stop.wait(self.every_s):
                say(f"{label}: still running, {time.monotonic() - t0:.0f} s")

        thread = threading.Thread(target=beat, name=f"heartbeat-{label}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


@contextlib.contextmanager
def _spinner(label: str) -> Iterator[None]:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # only on a terminal

    # transient: the spinner goes when the wait ends; the loop's own line for the stage stays
    with Progress(SpinnerColumn(), TextColumn(f"{label}: running"), TimeElapsedColumn(), transient=True) as bar:
        bar.add_task(label, total=None)
        yield
