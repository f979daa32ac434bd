"""What third-party libraries print while they work goes to the log, not to the user's terminal.

torch's TorchScript exporter prints the whole "Torch IR graph at exception" (280-400 lines on a
Hugging Face ViT) from C++ when it fails, even when the other exporter then succeeds; onnxsim prints
one ``WARNING: failed to run "ScatterND" op`` per node it cannot fold (396 lines on torchvision's
``swin_s``). Neither is an error of the run, and both bypass Python's ``sys.stdout``: they write to
file descriptors 1 and 2. :func:`captured_output` points both descriptors (and ``sys.stdout`` /
``sys.stderr``) at a temporary file while a library call runs, then logs what it caught at DEBUG
level under ``vitexport.thirdparty`` (``vitexport -v`` shows it) and says how much there was.

transformers draws a "Loading weights" tqdm bar on stderr for every ``from_pretrained`` (and
huggingface_hub its own bars) unless told otherwise: :func:`quiet_transformers` turns both libraries'
bars and transformers' warnings off while a Hugging Face model loads, captures whatever they still
print, and gives the process its settings back afterwards (an API user's own bars are theirs).
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Iterator

__all__ = ["Captured", "captured_output", "quiet_transformers"]

_log = logging.getLogger("vitexport.thirdparty")


@dataclass
class Captured:
    """What a library printed inside :func:`captured_output` (filled when the block ends)."""

    what: str
    lines: list[str] = field(default_factory=list)

    def note(self) -> str | None:
        """One line for a report, or None when nothing was printed."""
        if not self.lines:
            return None
        first = " ".join(self.lines[0].split())[:120]
        return f"{self.what} printed {len(self.lines)} line(s), kept out of the terminal (vitexport -v shows them): {first}"


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()


@contextlib.contextmanager
def _fds_to(fileno: int) -> Iterator[None]:
    """File descriptors 1 and 2 write to ``fileno`` inside the block (C/C++ output included)."""
    saved: list[tuple[int, int]] = []
    try:
        for fd in (1, 2):
            with contextlib.suppress(OSError):  # a closed descriptor has nothing to protect
                saved.append((fd, os.dup(fd)))
                os.dup2(fileno, fd)
        yield
    finally:
        _flush()
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)


@contextlib.contextmanager
def captured_output(what: str) -> Iterator[Captured]:
    """Capture everything printed inside the block (Python and native code, stdout and stderr).

    Args:
        what: who prints, for the log and the note (``"torch.onnx.export"``, ``"onnxsim"``).
    Yields:
        A :class:`Captured` whose ``lines`` hold the output once the block has ended (also when it
        raised). The text is logged at DEBUG level under ``vitexport.thirdparty``.
    """
    result = Captured(what)
    _flush()
    # append mode (O_APPEND): native and Python writes land one after the other, never over each other
    with tempfile.TemporaryFile(mode="a+", encoding="utf-8", errors="replace") as tmp:
        try:
            with _fds_to(tmp.fileno()), contextlib.redirect_stdout(tmp), contextlib.redirect_stderr(tmp):
                yield result
        finally:
            tmp.flush()
            tmp.seek(0)
            result.lines = [line.rstrip("\n") for line in tmp if line.strip()]
            for line in result.lines:
                _log.debug("%s: %s", what, line)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[Captured]:
    """transformers and huggingface_hub silent inside the block: progress bars off, transformers'
    logging at errors only, anything still printed captured (:func:`captured_output`); the previous
    settings come back when the block ends. Imports transformers: call it for ``hf:`` models only."""
    import transformers  # the caller loads a Hugging Face model: transformers is imported already
    from huggingface_hub import utils as hub

    tlog = transformers.utils.logging
    bars, verbosity, hub_off = tlog.is_progress_bar_enabled(), tlog.get_verbosity(), hub.are_progress_bars_disabled()
    tlog.disable_progress_bar()
    tlog.set_verbosity_error()
    hub.disable_progress_bars()
    try:
        with captured_output("transformers") as printed:
            yield printed
    finally:
        tlog.set_verbosity(verbosity)
        if bars:
            tlog.enable_progress_bar()
        if not hub_off:
            hub.enable_progress_bars()
