"""TensorRT's legacy INT8 calibration cache (``calibration.cache``), written from vitexport's scale table.

TensorRT reads it in an implicit-quantization build (``--int8 --calib=calibration.cache``): a header line
naming the calibrator, then ``tensor: <scale>`` per tensor, the scale as big-endian float32 hex.
"""
from __future__ import annotations

import struct
from pathlib import Path

from ...errors import BadInput
from ...io import atomic_write_text

__all__ = ["write_trt_cache", "read_trt_cache", "scale_to_hex", "hex_to_scale"]


def scale_to_hex(scale: float) -> str:
    """Big-endian IEEE float32 bytes as 8 lowercase hex digits (TensorRT's cache format)."""
    return struct.pack(">f", float(scale)).hex()


def hex_to_scale(text: str) -> float:
    """8 hex digits of :func:`scale_to_hex` back to the float."""
    return struct.unpack(">f", bytes.fromhex(text.strip()))[0]


def write_trt_cache(path: str | Path, scales: dict[str, float], header: str = "TRT-8501-EntropyCalibration2") -> Path:
    """Write a TensorRT INT8 calibration cache: a header line, then ``name: <hex scale>`` per tensor."""
    lines = [header] + [f"{name}: {scale_to_hex(s)}" for name, s in sorted(scales.items())]
    return atomic_write_text(path, "\n".join(lines) + "\n")


def read_trt_cache(path: str | Path) -> tuple[str, dict[str, float]]:
    """(header, name → scale) of a TensorRT calibration cache."""
    lines = Path(path).read_text().splitlines()
    if not lines:
        raise BadInput(f"{path}: empty calibration cache")
    out = {}
    for ln in lines[1:]:
        if not ln.strip():
            continue
        name, _, hx = ln.rpartition(":")
        out[name] = hex_to_scale(hx)
    return lines[0], out
