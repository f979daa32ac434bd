"""The scale table (``calibration.json``) and TensorRT's calibration cache (``calibration.cache``).

The table records, per tensor, the calibrated range and the int8 scale, plus what produced it
(method, settings, sample count, a hash of the model and of the data). A later run whose model,
data and settings hash the same reuses it instead of calibrating again.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BadInput
from ..io import atomic_write_json, atomic_write_text

__all__ = ["TABLE_VERSION", "ScaleTable", "write_trt_cache", "read_trt_cache", "scale_to_hex", "hex_to_scale"]

TABLE_VERSION = 1


@dataclass
class ScaleTable:
    """Calibration results.

    Attributes:
        method: the calibration method.
        num_samples: samples seen.
        model_hash: sha256 of the float model file as given to quantization.
        data_hash: the sample set's fingerprint.
        settings: everything else that changes the result (target, percentile, bins, equalisation...).
        tensors: name → {amax, scale, lo, hi, min, max} (scale = amax / 127).
        equalization: site name → per-channel factors (empty when none).
    """

    method: str
    num_samples: int
    model_hash: str
    data_hash: str
    settings: dict[str, Any]
    tensors: dict[str, dict[str, float]] = field(default_factory=dict)
    equalization: dict[str, list[float]] = field(default_factory=dict)

    def key(self) -> dict[str, Any]:
        return {"model_hash": self.model_hash, "data_hash": self.data_hash, "method": self.method,
                "settings": self.settings}

    def matches(self, model_hash: str, data_hash: str, method: str, settings: dict[str, Any]) -> bool:
        """Whether this table was made from the same model, data and settings."""
        return self.key() == {"model_hash": model_hash, "data_hash": data_hash, "method": method,
                              "settings": json.loads(json.dumps(settings))}

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": TABLE_VERSION,
            "method": self.method,
            "num_samples": self.num_samples,
            "model_hash": self.model_hash,
            "data_hash": self.data_hash,
            "settings": self.settings,
            "tensors": {k: self.tensors[k] for k in sorted(self.tensors)},
            "equalization": {k: self.equalization[k] for k in sorted(self.equalization)},
        }

    def save(self, path: str | Path) -> Path:
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "ScaleTable":
        """Read a table; raise BadInput when it is unreadable or of another version."""
        p = Path(path)
        try:
            d = json.loads(p.read_text())
            if d.get("version") != TABLE_VERSION:
                raise BadInput(f"{p}: scale table version {d.get('version')!r}, expected {TABLE_VERSION}")
            return cls(d["method"], int(d["num_samples"]), d["model_hash"], d["data_hash"], d["settings"],
                       {k: {kk: float(vv) for kk, vv in v.items()} for k, v in d["tensors"].items()},
                       {k: [float(x) for x in v] for k, v in d.get("equalization", {}).items()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BadInput(f"{p}: not a readable scale table ({exc})") from None


def scale_to_hex(scale: float) -> str:
    """Big-endian IEEE float32 bytes as 8 lowercase hex digits (TensorRT's cache format)."""
    return struct.pack(">f", float(scale)).hex()


def hex_to_scale(text: str) -> float:
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
