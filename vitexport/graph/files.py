"""ONNX files in and out of onnx-ir.

Loading keeps external data memory-mapped (onnx-ir maps ``.data`` files lazily and never copies
them). Saving is atomic for the pair of files: a model whose weights reach
:data:`EXTERNAL_DATA_MIN_BYTES` keeps them in ``<name>.data`` beside ``<name>`` (ONNX's external
data, which TensorRT, ONNX Runtime, Polygraphy and ``onnx.load`` read when both files sit in one
folder), because serialising 350 MB of weights into one protobuf message costs ViT-B/16 about two
seconds and a gigabyte of transient memory where streaming them to a data file costs a third of a
second. Smaller models stay one self-contained file. Every file is written clean: the final pass
(:mod:`.clean`) removes what no output needs, names and sorts the nodes and infers shapes first.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

import onnx
import onnx_ir as ir

from ..errors import ArtifactWriteError, BadInput
from .clean import clean_model

__all__ = ["EXTERNAL_DATA_MIN_BYTES", "load_model", "save_model", "as_model", "artifact_files", "data_file"]

log = logging.getLogger(__name__)

#: total initializer bytes from which a saved model keeps its weights in ``<name>.data``
EXTERNAL_DATA_MIN_BYTES = 64 << 20
#: tensors below this stay inside the protobuf even when the model has a data file
_INLINE_MAX_BYTES = 1024


def data_file(path: str | Path) -> Path:
    """Where the external data of the model file ``path`` lives (whether or not it exists)."""
    path = Path(path)
    return path.with_name(path.name + ".data")


def artifact_files(path: str | Path) -> list[Path]:
    """The files that make up a saved model: the ``.onnx`` file, and its ``.data`` file if any."""
    path = Path(path)
    data = data_file(path)
    return [path, data] if data.is_file() else [path]


def load_model(path: str | Path) -> ir.Model:
    """The model in ``path`` as an ``ir.Model``; its external data stays on disk, mapped on use.

    Raises:
        BadInput: the file is missing or is not an ONNX model.
    """
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such ONNX file")
    try:
        model = ir.load(str(path))
    except Exception as exc:  # protobuf DecodeError, OSError, ValueError from onnx
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise BadInput(f"{path}: not a readable ONNX model ({first})") from None
    if not model.ir_version or not model.graph.outputs:  # protobuf parses empty or stray bytes as a blank message
        raise BadInput(f"{path}: not an ONNX model (no IR version or no graph outputs)")
    return model


def as_model(model: str | Path | bytes | onnx.ModelProto | ir.Model) -> ir.Model:
    """An ``ir.Model`` from a file, serialised bytes, a ``ModelProto`` or an ``ir.Model`` (returned as is)."""
    if isinstance(model, ir.Model):
        return model
    if isinstance(model, onnx.ModelProto):
        return ir.from_proto(model)
    if isinstance(model, (bytes, bytearray)):
        try:
            return ir.from_proto(onnx.load_from_string(bytes(model)))
        except Exception as exc:  # protobuf DecodeError
            raise BadInput(f"not a readable ONNX model ({type(exc).__name__})") from None
    return load_model(model)


def _weight_bytes(model: ir.Model) -> int:
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


def save_model(model: ir.Model, path: str | Path, *, external_min_bytes: int | None = None,
               clean: bool = True) -> list[Path]:
    """Clean ``model`` and write it to ``path`` (and ``<path>.data`` for a large one), atomically.

    Both files are written in a temporary folder beside ``path`` and moved into place (the data file
    first), so a run killed mid-write leaves the previous files, never half of one. A ``.data`` file
    left from an earlier, larger version of the model is removed.

    Args:
        model: the model; cleaned in place (:class:`~vitexport.graph.clean.CleanPass`), so that what
            the caller holds is what the file holds.
        path: the ``.onnx`` file to write.
        external_min_bytes: initializer bytes from which weights go to ``<path>.data`` (None:
            :data:`EXTERNAL_DATA_MIN_BYTES`, read when called).
        clean: False writes the model as it is (a test planting a fault; never an artifact).
    Returns:
        The files written (see :func:`artifact_files`).
    Raises:
        ArtifactWriteError: the folder is not writable or the disk is full.
    """
    path = Path(path)
    if clean:
        report = clean_model(model)
        log.debug("%s: %s", path.name, "; ".join(report.notes) or "already clean")
    data = data_file(path)
    limit = EXTERNAL_DATA_MIN_BYTES if external_min_bytes is None else external_min_bytes
    external = _weight_bytes(model) >= limit
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as exc:
        raise ArtifactWriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        staged = tmp_dir / path.name
        if external:
            ir.save(model, str(staged), external_data=data.name, size_threshold_bytes=_INLINE_MAX_BYTES)
        else:
            # a tensor still memory-mapped from another file is written inline, not referenced
            ir.save(_inlined(model), str(staged))
        for f in tmp_dir.iterdir():
            _fsync(f)
        if external:
            os.replace(tmp_dir / data.name, data)
        elif data.exists():
            data.unlink()
        os.replace(staged, path)
    except OSError as exc:
        raise ArtifactWriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return artifact_files(path)


def _inlined(model: ir.Model) -> ir.Model:
    """``model`` itself when none of its weights is external, else with those read into memory."""
    if not any(isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values()):
        return model
    return ir.external_data.load_to_model(model.clone())


def _fsync(path: Path) -> None:
    with contextlib.suppress(OSError), open(path, "rb+") as fh:
        os.fsync(fh.fileno())
