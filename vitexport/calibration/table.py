"""The scale table (``calibration.json``); a target writes its own format from it (``Target.write_artifacts``).

The table records, per tensor, the calibrated range and the int8 scale, plus what produced it
(method, settings, sample count, a hash of the model and of the data). A later run whose model,
data and settings hash the same reuses it instead of calibrating again.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import BadInput
from ..io import atomic_write_json

__all__ = ["TABLE_VERSION", "ScaleTable"]

TABLE_VERSION = 2


class ScaleTable(BaseModel):
    """Calibration results (``calibration.json``).

    Attributes:
        method: the calibration method.
        num_samples: samples seen.
        model_hash: sha256 of the float model file as given to quantization.
        data_hash: the sample set's fingerprint.
        settings: everything else that changes the result (target, percentile, bins, smoothing...).
        tensors: name → {amax, scale, lo, hi, min, max} (scale = amax / 127).
        equalization: smoothing site → per-channel factors (empty when none).
        bias: Linear node → the mean INT8 output error its float bias absorbs (bias correction).
        choices: what the searches chose (``alpha`` per site, ``range`` per tensor), for the report.
        float_ranges: tensor → largest |value|, of every float tensor (an FP16 model's island evidence).
    """

    model_config = ConfigDict(extra="forbid")

    version: int = TABLE_VERSION
    method: str
    num_samples: int
    model_hash: str
    data_hash: str
    settings: dict[str, Any]
    tensors: dict[str, dict[str, float]] = Field(default_factory=dict)
    equalization: dict[str, list[float]] = Field(default_factory=dict)
    bias: dict[str, list[float]] = Field(default_factory=dict)
    choices: dict[str, dict[str, Any]] = Field(default_factory=dict)
    float_ranges: dict[str, float] = Field(default_factory=dict)

    def key(self) -> dict[str, Any]:
        return {"model_hash": self.model_hash, "data_hash": self.data_hash, "method": self.method,
                "settings": self.settings}

    def matches(self, model_hash: str, data_hash: str, method: str, settings: dict[str, Any]) -> bool:
        """Whether this table was made from the same model, data and settings."""
        return self.key() == {"model_hash": model_hash, "data_hash": data_hash, "method": method,
                              "settings": json.loads(json.dumps(settings))}

    def to_dict(self) -> dict[str, Any]:
        d = self.model_dump(mode="json")
        d["tensors"] = dict(sorted(d["tensors"].items()))
        d["equalization"] = dict(sorted(d["equalization"].items()))
        d["bias"] = dict(sorted(d["bias"].items()))
        return d

    def save(self, path: str | Path) -> Path:
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "ScaleTable":
        """Read a table; raise BadInput when it is unreadable or of another version."""
        p = Path(path)
        try:
            d = json.loads(p.read_text())
            if not isinstance(d, dict) or d.get("version") != TABLE_VERSION:
                got = d.get("version") if isinstance(d, dict) else None
                raise BadInput(f"{p}: scale table version {got!r}, expected {TABLE_VERSION}")
            return cls.model_validate(d)
        except (OSError, ValueError, ValidationError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BadInput(f"{p}: not a readable scale table ({first})") from None
