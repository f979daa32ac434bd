"""Errors that the CLI turns into one-line messages and exit codes.

Exit codes: 0 success; 1 a parity gate failed (:class:`ParityFailure`, nothing else); 2 bad input
(:class:`BadInput` and its kinds: a bad file, key or shape, an exception raised by the user's own
model code, a run that cannot fit in memory); 3 an internal error (a bug in vitexport).

:func:`classify` is the one place that decides which of these an arbitrary exception is: an
exception raised in a frame of the user's ``python:`` file is theirs (exit 2), an allocation that
failed is a resource limit (exit 2), anything else is ours (exit 3).
"""
from __future__ import annotations

import contextlib
import difflib
import os
import re
import traceback
from pathlib import Path
from types import TracebackType
from typing import Iterable, Iterator

__all__ = [
    "VitexportError",
    "BadInput",
    "ContractViolation",
    "UserCodeError",
    "ResourceLimit",
    "ParityFailure",
    "ArtifactWriteError",
    "InternalError",
    "VitexportWarning",
    "USER_MODULE_PREFIX",
    "classify",
    "user_code",
    "user_line",
    "one_line",
    "closest",
    "did_you_mean",
]

#: module-name prefix under which ``python:`` model files are imported; frames of such modules
#: (and of files beside them) are the user's code
USER_MODULE_PREFIX = "vitexport_user_"

_MEMORY_HINT = "use a smaller --input-shape, export.batch_size or calibration.batch_size, or fewer samples"


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line (whitespace collapsed), cut to ``limit`` characters."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _family(name: str) -> str:
    """A name's family: what comes before its first ``_`` or digit (``deit3_base`` → ``deit``)."""
    return re.split(r"[_\d]", name.lower(), maxsplit=1)[0]


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice nearest ``word`` by :func:`difflib.get_close_matches` (case ignored), looked for
    in ``word``'s family first (``deit_tinyy_patch16_224`` → ``deit_tiny_patch16_224``, not a
    ``deit3_*`` or ``vit_tiny_*`` that is as close letter for letter), then among all; None when
    nothing is close."""
    by_lower: dict[str, str] = {}
    for c in choices:
        by_lower.setdefault(str(c).lower(), str(c))
    key = word.lower()
    family = [c for c in by_lower if _family(c) == _family(key)]
    for pool in (family, list(by_lower)):
        hit = difflib.get_close_matches(key, pool, n=1, cutoff=0.6)
        if hit:
            return by_lower[hit[0]]
    return None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'Y'?"`` for the choice nearest ``word`` (:func:`closest`), else ``""``."""
    hit = closest(word, choices)
    return f"; did you mean '{hit}'?" if hit is not None and hit != word else ""


class VitexportError(Exception):
    """Base class: ``exit_code`` is what the CLI returns, ``str(err)`` is the one-line message."""

    exit_code = 2

    def __str__(self) -> str:  # one line, always
        return one_line(super().__str__(), 1000)


class BadInput(VitexportError):
    """Bad user input: usage, recipe, data, weights or model (exit code 2)."""

    exit_code = 2


class ContractViolation(BadInput):
    """The exported graph breaks the target's contract (op, opset, dtype, dynamic dim)."""


class UserCodeError(BadInput):
    """The user's own model code (a ``python:`` file) raised while imported, built or run (exit 2).

    The message names the exception, its message and the innermost line of the user's file.
    """


class ResourceLimit(BadInput):
    """The run needs more memory than the machine has: the message gives the estimate and the
    setting to change (exit code 2)."""


class ParityFailure(VitexportError):
    """A stage's outputs left the recipe's tolerance (exit code 1)."""

    exit_code = 1

    def __init__(self, stage: str, metric: str, value: float, limit: float, op: str, advice: str = ""):
        self.stage, self.metric, self.value, self.limit, self.op = stage, metric, value, limit, op
        self.advice = advice  # what to try (vitexport.parity.advice), after the numbers
        #: the artifacts the pipeline moved into OUT/rejected/, and the run's last line saying they must not ship
        self.rejected: list[Path] = []
        self.verdict = ""
        super().__init__(
            f"parity gate failed at stage '{stage}': {metric}={value:.6g} (must be {op} {limit:.6g})"
            + (f"; {advice}" if advice else "")
        )

    def with_advice(self, advice: str) -> "ParityFailure":
        """The same failure, its message ending with ``advice``."""
        err = ParityFailure(self.stage, self.metric, self.value, self.limit, self.op, advice)
        err.rejected, err.verdict = self.rejected, self.verdict
        return err


class ArtifactWriteError(VitexportError):
    """An artifact could not be written (disk full, file too large, permissions); the previous
    version of the file, if any, is left intact (exit code 2)."""

    exit_code = 2


class InternalError(VitexportError):
    """A bug in vitexport (exit code 3). ``log_path`` is where the traceback was written, if anywhere."""

    exit_code = 3
    log_path: Path | None = None


class VitexportWarning(UserWarning):
    """Base of the warnings vitexport itself issues (the CLI prints each as one line)."""


# --- classification -------------------------------------------------------------------------------
def _frames(tb: TracebackType | None) -> list[traceback.FrameSummary]:
    return list(traceback.extract_tb(tb)) if tb is not None else []


def _user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of ``exc`` (or of its causes) that runs the user's model code."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        user_dirs: set[str] = set()
        walk = tb
        while walk is not None:
            name = walk.tb_frame.f_globals.get("__name__", "")
            if isinstance(name, str) and name.startswith(USER_MODULE_PREFIX):
                user_dirs.add(os.path.dirname(walk.tb_frame.f_code.co_filename))
            walk = walk.tb_next
        if user_dirs:
            # files beside the user's model file (their own helper modules) are theirs too
            hits = [f for f in _frames(tb) if os.path.dirname(f.filename) in user_dirs]
            if hits:
                return hits[-1]
        exc = exc.__cause__  # type: ignore[assignment]  # explicit chaining only: a bug raised while handling is ours
    return None


def user_line(exc: BaseException) -> str | None:
    """``'net.py:12'``: the innermost line of the user's ``python:`` model code ``exc`` was raised
    in (through its explicit causes), or None when it was not raised there."""
    frame = _user_frame(exc)
    return f"{_shown(frame.filename)}:{frame.lineno}" if frame is not None else None


def _shown(filename: str) -> str:
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def _is_memory_error(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    # torch's CPU allocator raises RuntimeError, not MemoryError
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in str(exc) or "not enough memory" in str(exc))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r})"
    msg = one_line(str(exc), 200)
    return f"raised {type(exc).__name__}" + (f": {msg}" if msg else "")


def classify(exc: BaseException) -> VitexportError | None:
    """The :class:`VitexportError` an exception amounts to (``exc`` itself when it is one).

    Returns:
        :class:`UserCodeError` when it arose in the user's ``python:`` code, :class:`ResourceLimit`
        for a failed allocation, :class:`InternalError` for anything else; None for
        ``KeyboardInterrupt`` (the caller handles an interrupt).
    """
    if isinstance(exc, VitexportError):
        return exc
    if isinstance(exc, (KeyboardInterrupt, GeneratorExit)):
        return None
    if _is_memory_error(exc):
        return ResourceLimit(f"ran out of memory ({one_line(str(exc), 160) or type(exc).__name__}); {_MEMORY_HINT}")
    frame = _user_frame(exc)
    if frame is not None:
        return UserCodeError(f"your model code {_describe(exc)} ({_shown(frame.filename)}:{frame.lineno})")
    if isinstance(exc, SystemExit):
        return InternalError(f"internal error: something {_describe(exc)} (a bug in vitexport)")
    return InternalError(f"internal error: {type(exc).__name__}: {one_line(str(exc), 200)} (a bug in vitexport)")


@contextlib.contextmanager
def user_code(what: str, path: str | Path | None = None) -> Iterator[None]:
    """Run the user's own code: any exception (or ``sys.exit``) it raises becomes a
    :class:`UserCodeError` naming ``what`` and the user's innermost line.

    Args:
        what: what was being done, e.g. ``"python:net.py:build: building the model"``.
        path: the user's file, named when no frame of it is in the traceback.
    Raises:
        UserCodeError, ResourceLimit; a :class:`VitexportError` passes through unchanged.
    """
    try:
        yield
    except (VitexportError, KeyboardInterrupt):
        raise
    except (Exception, SystemExit) as exc:
        if _is_memory_error(exc):
            raise ResourceLimit(f"{what}: ran out of memory ({one_line(str(exc), 160)}); {_MEMORY_HINT}") from exc
        frame = _user_frame(exc)
        if isinstance(exc, SyntaxError) and exc.filename:
            where = f"{_shown(exc.filename)}:{exc.lineno}"
            raise UserCodeError(f"{what}: syntax error in your model code: {exc.msg} ({where})") from None
        where = f"{_shown(frame.filename)}:{frame.lineno}" if frame else (_shown(str(path)) if path else "")
        raise UserCodeError(f"{what}: your model code {_describe(exc)}" + (f" ({where})" if where else "")) from exc
