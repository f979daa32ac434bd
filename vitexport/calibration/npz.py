"""Rows of an uncompressed ``.npz`` member, read from disk on demand.

``np.load`` reads a whole member into memory; a calibration set of 256 ViT-B images is 154 MB that
would stay resident for the whole run. ``np.savez`` stores members uncompressed, so each is a plain
``.npy`` at a known offset in the zip: :class:`NpzMember` reads only the rows asked for.
Compressed (``np.savez_compressed``) and Fortran-ordered members cannot be read by row;
:func:`open_members` returns those as ordinary arrays, after checking that what their headers
declare matches what the zip holds and fits in memory (a forged header, a decompression bomb).
"""
from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import numpy as np

from ..preflight.memory import Need, format_bytes, require

__all__ = ["NpzMember", "open_members"]

_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zip local file header (30 bytes)


class NpzMember:
    """One stored ``.npy`` member: ``shape``, ``dtype``, ``ndim``, ``len()``, ``rows(indices)``."""

    def __init__(self, path: Path, offset: int, shape: tuple[int, ...], dtype: np.dtype):
        self.path, self.offset, self.shape, self.dtype = path, offset, tuple(shape), np.dtype(dtype)
        self.row_items = int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1
        self.row_bytes = self.row_items * self.dtype.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def rows(self, indices: np.ndarray | slice) -> np.ndarray:
        """The rows at ``indices`` (ascending runs are read in one go), as a new array."""
        idx = np.arange(len(self))[indices] if isinstance(indices, slice) else np.asarray(indices, np.int64)
        out = np.empty((len(idx), *self.shape[1:]), self.dtype)
        if len(idx) == 0:
            return out
        flat = out.reshape(len(idx), -1) if self.row_items else out
        with open(self.path, "rb") as f:
            start = 0
            while start < len(idx):
                end = start + 1
                while end < len(idx) and idx[end] == idx[end - 1] + 1:
                    end += 1
                f.seek(self.offset + int(idx[start]) * self.row_bytes)
                n = end - start
                buf = f.read(n * self.row_bytes)
                if len(buf) != n * self.row_bytes:
                    raise EOFError(f"{self.path}: truncated array data")
                flat[start:end] = np.frombuffer(buf, self.dtype).reshape(n, -1)
                start = end
        return out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:  # np.asarray(member): every row
        a = self.rows(slice(None))
        return a if dtype is None else a.astype(dtype)


def open_members(path: Path) -> dict[str, NpzMember | np.ndarray]:
    """Every array of an ``.npz``: stored C-order members as :class:`NpzMember`, others loaded.

    Raises:
        OSError, ValueError, EOFError, zipfile.BadZipFile: unreadable file (callers turn these
        into one-line errors).
    """
    out: dict[str, NpzMember | np.ndarray] = {}
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            if not info.filename.endswith(".npy"):
                continue
            name = info.filename[:-4]
            if info.compress_type == zipfile.ZIP_STORED:
                member = _stored(path, info)
                if member is not None:
                    out[name] = member
                    continue
            _check_declared(path, z, info)
            with z.open(info) as f:
                out[name] = np.lib.format.read_array(f, allow_pickle=False)
    return out


def _declared(f, name: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data bytes) an ``.npy`` header declares; the stream is left after the header."""
    version = np.lib.format.read_magic(f)
    read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read_header is None:
        raise ValueError(f"'{name}': unsupported .npy version {version}")
    shape, _, dtype = read_header(f)
    return shape, dtype, int(np.prod(shape, dtype=np.float64)) * dtype.itemsize


def _check_declared(path: Path, z: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
    """Refuse a member whose header claims more data than the zip entry holds (numpy allocates the
    declared size before reading), or whose decompressed size does not fit in memory."""
    name = info.filename[:-4]
    with z.open(info) as f:
        shape, dtype, need = _declared(f, name)
    if need > info.file_size:
        raise ValueError(f"array '{name}' declares shape {shape} ({format_bytes(need)}) but holds "
                         f"{format_bytes(info.file_size)}: truncated file or forged header")
    ratio = info.file_size / max(info.compress_size, 1)
    require([Need(f"{path}: compressed array '{name}' ({format_bytes(info.compress_size)} on disk, {ratio:.0f}x inflation)",
                  info.file_size, "save the data with np.savez (uncompressed), which vitexport reads row by row")])


def _stored(path: Path, info: zipfile.ZipInfo) -> NpzMember | None:
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        head = f.read(_LOCAL_HEADER.size)
        if len(head) != _LOCAL_HEADER.size or head[:4] != b"PK\x03\x04":
            raise zipfile.BadZipFile(f"bad local header for {info.filename}")
        name_len, extra_len = struct.unpack("<2H", head[26:30])
        f.seek(info.header_offset + _LOCAL_HEADER.size + name_len + extra_len)
        start = f.tell()
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            return None
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        if fortran or dtype.hasobject or len(shape) == 0:
            return None
        offset = f.tell()
        need = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
        if offset - start + need > info.file_size:
            raise EOFError(f"array '{info.filename[:-4]}' declares shape {shape} ({format_bytes(need)}) but holds "
                           f"{format_bytes(info.file_size - (offset - start))}: truncated file or forged header")
        return NpzMember(path, offset, shape, dtype)
