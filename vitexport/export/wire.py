"""Take large initializers out of a serialized ONNX model and put them back, at the byte level.

Why: simplifying ViT-B/16 (346 MB) spends about 0.6 s in onnxsim's own work and several seconds
parsing, copying and re-serializing weights it never changes. A weight that only feeds MatMul, Gemm
or Conv is opaque to simplification, so :func:`split_initializers` cuts such tensors out of the
file's bytes (reading only their headers: on a memory-mapped file their data is never paged in),
the small remaining model is simplified, and :func:`write_joined` copies the original bytes back
file-to-file (``copy_file_range``, in the kernel). The result is exactly what ``onnx.save`` writes
for the same model: the same fields in the same canonical order.

Only the protobuf wire format is used: a field is a varint key ``(number << 3) | wire_type`` followed
by a varint, 8 or 4 bytes, or a varint length and that many bytes. ModelProto.graph is field 7,
GraphProto.initializer field 5, and TensorProto has dims (1), data_type (2), name (8) and
data_location (14).
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Iterator

__all__ = ["HeldTensor", "split_initializers", "tensor_bytes", "joined_chunks", "write_joined", "joined_bytes"]

_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_DIMS, _TENSOR_DATA_TYPE, _TENSOR_NAME, _TENSOR_DATA_LOCATION = 1, 2, 8, 14
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL


@dataclass(frozen=True)
class HeldTensor:
    """An initializer cut out of the model: its header and where its TensorProto bytes are."""

    name: str
    data_type: int
    dims: tuple[int, ...]
    offset: int  # of the encoded TensorProto message in the source buffer / file
    nbytes: int


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _fields(buf: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """Yield ``(number, wire_type, field_start, value_start, value_end)`` for each field."""
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, value_end = _varint(buf, pos)
        elif wire == 1:
            value_end = pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value_end = pos + length
        elif wire == 5:
            value_end = pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} at byte {field_start}")
        yield number, wire, field_start, pos, value_end
        pos = value_end


def _tensor_header(buf: memoryview, start: int, end: int) -> tuple[str, int, tuple[int, ...], bool]:
    name, data_type, dims, external = "", 0, [], False
    for number, wire, _, vs, ve in _fields(buf, start, end):
        if number == _TENSOR_NAME and wire == 2:
            name = bytes(buf[vs:ve]).decode("utf-8")
        elif number == _TENSOR_DATA_TYPE and wire == 0:
            data_type = _varint(buf, vs)[0]
        elif number == _TENSOR_DIMS and wire == 0:
            dims.append(_varint(buf, vs)[0])
        elif number == _TENSOR_DIMS and wire == 2:  # packed
            pos = vs
            while pos < ve:
                d, pos = _varint(buf, pos)
                dims.append(d)
        elif number == _TENSOR_DATA_LOCATION and wire == 0:
            external = _varint(buf, vs)[0] == _EXTERNAL
    return name, data_type, tuple(dims), external


def split_initializers(data: bytes | memoryview, min_bytes: int) -> tuple[bytes, list[HeldTensor]]:
    """Cut every inline initializer of at least ``min_bytes`` out of a serialized ModelProto.

    Args:
        data: the serialized model (bytes, or a read-only ``mmap`` of the file).
        min_bytes: the smallest encoded tensor to cut out.
    Returns:
        (the model's bytes without those initializers, the cut tensors in file order).
    Raises:
        ValueError: ``data`` is not protobuf wire format.
    """
    out = bytearray()
    held: list[HeldTensor] = []
    with memoryview(data) as buf:  # released on exit, so an mmap under it can be closed
        if len(buf) and buf[0] == 0:
            raise ValueError("not a serialized ONNX model")
        try:
            for number, wire, fs, vs, ve in _fields(buf, 0, len(buf)):
                if ve > len(buf):
                    raise ValueError(f"truncated field {number} at byte {fs}")
                if number != _MODEL_GRAPH or wire != 2:
                    out += buf[fs:ve]
                    continue
                graph = bytearray()
                for gnum, gwire, gfs, gvs, gve in _fields(buf, vs, ve):
                    if gnum == _GRAPH_INITIALIZER and gwire == 2 and gve - gvs >= min_bytes:
                        name, data_type, dims, external = _tensor_header(buf, gvs, gve)
                        if not external:
                            held.append(HeldTensor(name, data_type, dims, gvs, gve - gvs))
                            continue
                    graph += buf[gfs:gve]
                out += _encode_varint((_MODEL_GRAPH << 3) | 2) + _encode_varint(len(graph)) + graph
        except IndexError:
            raise ValueError("truncated protobuf data") from None
    return bytes(out), held


def tensor_bytes(data, held: HeldTensor) -> bytes:
    """The encoded TensorProto of ``held`` (parse it with ``onnx.TensorProto.FromString``)."""
    with memoryview(data) as buf:
        return bytes(buf[held.offset:held.offset + held.nbytes])


def _split_at(buf: memoryview, number: int) -> int:
    """Offset of the first field numbered above ``number`` (canonical order sorts by number)."""
    for n, _, fs, _, _ in _fields(buf, 0, len(buf)):
        if n > number:
            return fs
    return len(buf)


def joined_chunks(model_without_held: bytes, held: list[HeldTensor]) -> list[bytes | HeldTensor]:
    """The serialized model with ``held`` appended to its graph's initializers, as chunks.

    ``model_without_held`` is a canonical serialization (``SerializeToString``) whose graph
    does not contain the held tensors. A chunk is bytes, or a :class:`HeldTensor` standing for its
    bytes in the source; written in order they give the bytes ``onnx.save`` writes for the joined
    model.
    """
    buf = memoryview(model_without_held)
    graph_field = next(((fs, vs, ve) for n, w, fs, vs, ve in _fields(buf, 0, len(buf)) if n == _MODEL_GRAPH), None)
    if graph_field is None:
        raise ValueError("the model has no graph")
    fs, vs, ve = graph_field
    graph = buf[vs:ve]
    cut = _split_at(graph, _GRAPH_INITIALIZER)
    entries: list[bytes | HeldTensor] = []
    for h in held:
        entries += [_encode_varint((_GRAPH_INITIALIZER << 3) | 2) + _encode_varint(h.nbytes), h]
    graph_len = len(graph) + sum(e.nbytes if isinstance(e, HeldTensor) else len(e) for e in entries)
    head = _encode_varint((_MODEL_GRAPH << 3) | 2) + _encode_varint(graph_len)
    return [bytes(buf[:fs]), head, bytes(graph[:cut]), *entries, bytes(graph[cut:]), bytes(buf[ve:])]


def joined_bytes(model_without_held: bytes, held: list[HeldTensor], source) -> bytes:
    """:func:`joined_chunks` as one bytes object, the held tensors read from ``source``."""
    return b"".join(tensor_bytes(source, c) if isinstance(c, HeldTensor) else c
                    for c in joined_chunks(model_without_held, held))


def _copy_range(src_fd: int, dst_fd: int, offset: int, count: int) -> bool:
    """Copy in the kernel; False when this file system or kernel cannot (nothing written then)."""
    done = 0
    try:
        while done < count:
            n = os.copy_file_range(src_fd, dst_fd, count - done, offset + done)
            if n == 0:
                break
            done += n
    except OSError as exc:
        if done == 0 and exc.errno in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF):
            return False
        raise
    if done != count:
        raise OSError(errno.EIO, f"copy_file_range stopped after {done} of {count} bytes")
    return True


def write_joined(dst_fd: int, model_without_held: bytes, held: list[HeldTensor], src_fd: int, source) -> int:
    """Write the joined model to ``dst_fd`` (at its current offset); returns the bytes written.

    Held tensors are copied from ``src_fd`` (the file ``source`` maps) in the kernel where the
    platform allows it, else written from ``source``.
    """
    written = 0
    kernel_copy = hasattr(os, "copy_file_range")
    for chunk in joined_chunks(model_without_held, held):
        if isinstance(chunk, HeldTensor):
            if not (kernel_copy and _copy_range(src_fd, dst_fd, chunk.offset, chunk.nbytes)):
                kernel_copy = False
                with memoryview(source) as buf:
                    _write_all(dst_fd, buf[chunk.offset:chunk.offset + chunk.nbytes])
            written += chunk.nbytes
        else:
            _write_all(dst_fd, chunk)
            written += len(chunk)
    return written


def _write_all(fd: int, data) -> None:
    with memoryview(data) as view:
        while len(view):
            n = os.write(fd, view)
            view = view[n:]
