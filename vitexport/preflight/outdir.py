"""The output folder, checked before any work: a writable directory that is not ``/``, the home
directory or inside the installed package; stale temp files of a killed run are removed from it."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import BadInput
from ..io import remove_stale_temps

__all__ = ["check_output_folder"]

_PACKAGE = Path(__file__).resolve().parents[1]


def _forbidden(resolved: Path) -> str | None:
    if resolved == Path(resolved.anchor):
        return "the filesystem root"
    try:
        home = Path.home().resolve()
    except (RuntimeError, KeyError, OSError):
        home = None
    if home is not None and resolved == home:
        return "your home directory"
    if resolved == _PACKAGE or _PACKAGE in resolved.parents:
        return "inside the installed vitexport package"
    return None


def _nearest_existing(p: Path) -> Path:
    q = p
    while not q.exists() and q != q.parent:
        if q.is_symlink():  # a dangling link: creating the folder would fail
            raise BadInput(f"--out {p}: {q} is a broken symbolic link")
        q = q.parent
    return q


def check_output_folder(out: str | Path) -> Path:
    """Check that ``out`` can hold a run's artifacts; remove stale temp files already in it.

    Nothing is created: a folder that does not exist yet is made by the run itself.
    Returns:
        ``out`` as a Path.
    Raises:
        BadInput: ``out`` is a file, lies under a file, is not writable, is ``/``, the home
            directory or inside the vitexport package.
    """
    p = Path(out).expanduser()
    if not str(out).strip():
        raise BadInput("--out is empty; give a folder for the artifacts")
    why = _forbidden(p.resolve())
    if why:
        raise BadInput(f"--out {p} is {why}; give a dedicated folder, e.g. build/my-model")
    if p.exists() and not p.is_dir():
        raise BadInput(f"--out {p} is a file, not a folder; give a folder for the artifacts")
    base = _nearest_existing(p)
    if not base.is_dir():
        raise BadInput(f"--out {p}: {base} is a file, so no folder can be made under it")
    if not os.access(base, os.W_OK | os.X_OK):
        raise BadInput(f"--out {p}: {base} is not writable; choose a folder you can write to")
    if p.is_dir():
        remove_stale_temps(p)
    return p
