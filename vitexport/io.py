"""Atomic artifact writes: write beside the target, fsync, then rename.

A run killed mid-write, or a full disk, leaves either the previous file or none, never half of one.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import traceback
from pathlib import Path
from typing import Any, Iterator

from .errors import ArtifactWriteError

__all__ = [
    "atomic_path", "atomic_write_bytes", "atomic_write_text", "atomic_write_json", "sha256_file", "display_path",
    "remove_stale_temps", "write_error_log", "ERROR_LOG",
]

ERROR_LOG = "error.log"
_TEMP_TAG = ".vxtmp"  # temp names: .<target name>.vxtmp<pid>-<random><suffix>[.<onnx external data>]
_TEMP_RE = re.compile(r"^\..+" + re.escape(_TEMP_TAG) + r"(\d+)-[A-Za-z0-9_]+")


def _temp_prefix(target: Path) -> str:
    # the writer's pid in the name tells a later run whether the file is stale (its writer is gone)
    return f".{target.name}{_TEMP_TAG}{os.getpid()}-"


@contextlib.contextmanager
def atomic_path(target: str | Path, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; on success rename it onto ``target``.

    On any exception the temporary file is removed and ``target`` is left as it was.
    """
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(target), suffix=suffix or target.suffix or ".tmp", dir=target.parent)
    except OSError as exc:
        raise ArtifactWriteError(f"cannot write {target}: {exc.strerror or exc}") from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp creates 0600; an artifact gets the usual permissions (0666 minus the umask)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, target)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        # onnx may write external data beside the temp file; leave nothing behind
        for extra in tmp_path.parent.glob(tmp_path.name + ".*"):
            with contextlib.suppress(OSError):
                extra.unlink()
        if isinstance(exc, OSError):
            # disk full (ENOSPC), file too large (EFBIG), read-only: the old artifact stays intact
            raise ArtifactWriteError(f"cannot write {target}: {exc.strerror or exc}") from None
        raise


def atomic_write_bytes(target: str | Path, data: bytes) -> Path:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
    return Path(target)


def atomic_write_text(target: str | Path, text: str) -> Path:
    return atomic_write_bytes(target, text.encode("utf-8"))


def atomic_write_json(target: str | Path, obj: Any) -> Path:
    return atomic_write_text(target, json.dumps(obj, indent=2, sort_keys=False, allow_nan=True) + "\n")


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def display_path(text: str) -> str:
    """A path (or a ``scheme:PATH[:NAME]`` model URI) as reports show it: relative to the working
    directory when inside it, so a committed report does not carry one machine's absolute paths."""
    if not text:
        return text
    scheme, sep, rest = text.partition(":")
    if sep and scheme.isalpha() and len(scheme) > 1:  # python:/a/b.py:build, hf:/a/dir
        path, sep2, name = rest.partition(":") if scheme == "python" else (rest, "", "")
        return f"{scheme}:{display_path(path)}{sep2}{name}"
    p = Path(text)
    if not p.is_absolute():
        return text
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return text


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def remove_stale_temps(folder: str | Path) -> list[Path]:
    """Remove the temp files of :func:`atomic_path` that a killed run left in ``folder``.

    Only regular files named with our own temp pattern whose writing process is gone are removed
    (a run writing into the same folder right now keeps its files).

    Returns:
        The removed paths.
    """
    folder = Path(folder)
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    for p in folder.iterdir():
        m = _TEMP_RE.match(p.name)
        if m is None or not p.is_file() or p.is_symlink() or _alive(int(m.group(1))):
            continue
        with contextlib.suppress(OSError):
            p.unlink()
            removed.append(p)
    return removed


def write_error_log(folder: str | Path, exc: BaseException) -> Path | None:
    """Write ``exc``'s traceback to ``folder/error.log`` (the folder is created); None if that fails."""
    path = Path(folder) / ERROR_LOG
    text = "".join(traceback.format_exception(exc))
    try:
        atomic_write_text(path, text)
    except (ArtifactWriteError, OSError):
        return None
    return path
