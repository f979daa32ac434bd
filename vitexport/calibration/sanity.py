"""Does the calibration data look like the parity data? A warning when it does not, never an error.

INT8 ranges are measured on the calibration data and judged on the parity data. Calibration that
does not look like that data calibrates without a word and costs accuracy the fallback cannot
predict (grayscale copies of colour photos, a set from elsewhere: predicted cosine 0.9974, gate
0.9852). The first :data:`CHECK_SAMPLES` samples of each set (both are seeded draws, so their
heads are seeded draws too) are compared on:

- the per-channel mean: warned when it moves more than :data:`MEAN_SHIFT` parity standard
  deviations *and* more than :data:`MEAN_NOISE` standard errors of the two sets' means (so a small
  draw of the same data does not warn);
- the per-channel spread: warned when the standard deviations differ by more than :data:`SPREAD_RATIO`
  times either way (an input quantizer's range scales with it);
- grayscale vs colour: a sample whose three channels are one affine function of each other
  (correlation >= :data:`GRAY_CORRELATION`; normalisation keeps gray channels exactly correlated)
  is grayscale; warned when the grayscale shares differ by more than :data:`GRAY_SHARE` (50 points);
- the value range: warned when parity values fall outside the calibration range by more than
  :data:`RANGE_BEYOND` of its span (they would be clipped by a range calibrated on the other data);
- the source images' resolution (image folders): warned when the median shorter side differs by
  more than :data:`RESOLUTION_RATIO` times (one set is upsampled or blurred relative to the other).

Integer inputs (token ids, masks) are not compared: their statistics say nothing about the text.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from ..errors import VitexportWarning
from ..io import display_path
from .data import ImageFolderSamples, SampleSet

__all__ = ["CalibrationMismatchWarning", "DataCheck", "check_data", "CHECK_SAMPLES", "MEAN_SHIFT", "MEAN_NOISE",
           "SPREAD_RATIO", "GRAY_CORRELATION", "GRAY_SHARE", "RANGE_BEYOND", "RESOLUTION_RATIO"]

#: samples of each set compared: the standard error of a set's channel mean is then about 1/8 of
#: the spread between samples, and 128 images decode in about a second
CHECK_SAMPLES = 64
#: a mean shift of half a parity standard deviation moves the bulk of the values across a large
#: part of an 8-bit range calibrated on the other set
MEAN_SHIFT = 0.5
#: and beyond 4 standard errors of the difference, so sampling noise of a small set is not reported
MEAN_NOISE = 4.0
#: a range calibrated on data 1.5x wider wastes a third of the 256 levels; 1.5x narrower clips
SPREAD_RATIO = 1.5
#: gray images normalised per channel stay exactly correlated (up to float rounding); colour photos
#: sit well below (0.8-0.99 between R, G and B)
GRAY_CORRELATION = 0.9999
#: half the samples gray in one set and not in the other is no accident of the draw
GRAY_SHARE = 0.5
#: parity values beyond the calibrated span by a quarter of it are clipped hard
RANGE_BEYOND = 0.25
#: twice the resolution is a different level of detail after the resize to the model's input
RESOLUTION_RATIO = 2.0


class CalibrationMismatchWarning(VitexportWarning):
    """The calibration data does not look like the parity data (the statistic and both sets named)."""


@dataclass
class _Stats:
    """Statistics of one float input of one set: per channel (axis 1 of N,C,H,W; one channel else)."""

    n: int
    mean: np.ndarray
    std: np.ndarray
    sample_mean_std: np.ndarray  # spread of the per-sample channel means (the sampling noise)
    lo: float
    hi: float
    gray: float | None  # share of grayscale samples (3-channel image inputs only)

    def to_dict(self) -> dict[str, Any]:
        r = lambda a: [round(float(v), 4) for v in np.atleast_1d(a)]  # noqa: E731
        return {"samples": self.n, "mean": r(self.mean), "std": r(self.std), "min": round(self.lo, 4),
                "max": round(self.hi, 4), "gray_share": None if self.gray is None else round(self.gray, 3)}


@dataclass
class DataCheck:
    """What was compared, the preprocessing of image folders, and what differs.

    Attributes:
        calibration, parity: per set, ``source``, ``kind`` (``images``, ``arrays`` of an .npz, or None),
            ``preprocess`` (an image folder's, else None),
            ``short_side_px`` (median shorter side of its images) and ``inputs`` (name → statistics).
        warnings: one sentence per difference, naming both sets, the statistic and by how much.
        compared: False when there is nothing to compare (the same data, or synthetic inputs).
    """

    calibration: dict[str, Any] = field(default_factory=dict)
    parity: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    compared: bool = True
    why_not: str = ""

    def preprocess_line(self) -> str | None:
        """The preprocessing of the image folders as one terminal line, or None (no image folder)."""
        parts = {}
        for role, d in (("calibration", self.calibration), ("parity", self.parity)):
            if d.get("preprocess"):
                parts.setdefault(d["preprocess"]["summary"], []).append(f"{role} {d['source']}")
        return "; ".join(f"preprocessing of {' and '.join(who)}: {how}" for how, who in parts.items()) or None

    def to_dict(self) -> dict[str, Any]:
        return {"compared": self.compared, "why_not": self.why_not or None, "calibration": self.calibration,
                "parity": self.parity, "warnings": list(self.warnings),
                "thresholds": {"mean_shift_parity_std": MEAN_SHIFT, "mean_shift_standard_errors": MEAN_NOISE,
                               "spread_ratio": SPREAD_RATIO, "gray_share_difference": GRAY_SHARE,
                               "range_beyond_span": RANGE_BEYOND, "resolution_ratio": RESOLUTION_RATIO,
                               "samples_compared": CHECK_SAMPLES}}


def _image_folder(samples: SampleSet) -> ImageFolderSamples | None:
    """The image folder under a set's wrappers (a head, a slice of whole batches), if any."""
    s: Any = samples
    while s is not None and not isinstance(s, ImageFolderSamples):
        s = getattr(s, "base", None)
    return s


def _gray(x: np.ndarray) -> np.ndarray:
    """Per sample of (N, 3, P): are the channels one affine function of each other?"""
    xc = x - x.mean(axis=2, keepdims=True)
    var = (xc**2).mean(axis=2)  # (N, 3)
    gray = np.ones(len(x), bool)
    for c in (1, 2):
        cov = (xc[:, 0] * xc[:, c]).mean(axis=1)
        both = np.sqrt(var[:, 0] * var[:, c])
        corr = np.where(both > 0, cov / np.where(both > 0, both, 1.0), (var[:, 0] == var[:, c]).astype(float))
        gray &= corr >= GRAY_CORRELATION
    return gray


def _stats(samples: SampleSet, limit: int) -> dict[str, _Stats]:
    """Per float input: channel moments, per-sample means, range and grayscale share, streamed."""
    parts: dict[str, dict[str, list]] = {}
    for feed in samples.head(limit).batches(8):
        for name, a in feed.items():
            if a.dtype.kind != "f" or a.ndim < 2:
                continue
            p = parts.setdefault(name, {"m": [], "sq": [], "lo": [], "hi": [], "gray": []})
            for row in a:  # one sample at a time in float64: a few copies of one image, not of a batch
                x = row.astype(np.float64).reshape(1, row.shape[0] if a.ndim == 4 else 1, -1)
                p["m"].append(x.mean(axis=2))
                p["sq"].append((x**2).mean(axis=2))
                p["lo"].append(float(x.min()))
                p["hi"].append(float(x.max()))
                if x.shape[1] == 3 and a.ndim == 4:
                    p["gray"].append(_gray(x))
    out = {}
    for name, p in parts.items():
        m, sq = np.concatenate(p["m"]), np.concatenate(p["sq"])  # (N, C): every sample has as many values
        mean = m.mean(axis=0)
        std = np.sqrt(np.maximum(sq.mean(axis=0) - mean**2, 0.0))
        gray = float(np.concatenate(p["gray"]).mean()) if p["gray"] else None
        out[name] = _Stats(len(m), mean, std, m.std(axis=0), min(p["lo"]), max(p["hi"]), gray)
    return out


def _short_side(folder: ImageFolderSamples | None, limit: int) -> int | None:
    """Median shorter side (pixels) of a folder's first images, read from their headers only."""
    if folder is None:
        return None
    sides = []
    for f in folder.files[:limit]:
        try:
            with Image.open(f) as im:
                sides.append(min(im.size))
        except Exception:  # a file that went away since it was chosen: its size is not needed
            continue
    return int(np.median(sides)) if sides else None


def _describe(samples: SampleSet, limit: int, with_stats: bool) -> tuple[dict[str, Any], dict[str, _Stats]]:
    folder = _image_folder(samples)
    kind = "images" if folder is not None else "arrays" if samples.source.lower().endswith(".npz") else None
    d: dict[str, Any] = {"source": display_path(samples.source), "kind": kind, "samples": len(samples),
                         "preprocess": None, "short_side_px": None, "inputs": {}}
    if folder is not None:
        d["preprocess"] = {**folder.pipeline.to_dict(), "summary": folder.pipeline.summary()}
    if not with_stats:
        return d, {}
    d["short_side_px"] = _short_side(folder, limit)
    stats = _stats(samples, limit)
    d["inputs"] = {k: s.to_dict() for k, s in stats.items()}
    return d, stats


def _channels(idx: np.ndarray) -> str:
    return ("channel " if len(idx) == 1 else "channels ") + ", ".join(str(int(i)) for i in idx)


def _compare_input(name: str, c: _Stats, p: _Stats) -> list[str]:
    """What differs between the calibration and parity statistics of one input."""
    found = []
    label = f"input '{name}' " if name else ""
    scale = np.maximum(p.std, 1e-12)
    shift = np.abs(c.mean - p.mean)
    noise = np.sqrt(c.sample_mean_std**2 / c.n + p.sample_mean_std**2 / p.n)
    bad = np.flatnonzero((shift > MEAN_SHIFT * scale) & (shift > MEAN_NOISE * noise))
    if bad.size:
        found.append(f"{label}mean differs by {', '.join(f'{shift[i] / scale[i]:.2f}' for i in bad)} parity std "
                     f"({_channels(bad)}; warned above {MEAN_SHIFT})")
    ratio = np.maximum(c.std, 1e-12) / scale
    bad = np.flatnonzero((ratio > SPREAD_RATIO) | (ratio < 1 / SPREAD_RATIO))
    if bad.size:
        found.append(f"{label}std is {', '.join(f'{ratio[i]:.2f}x' for i in bad)} the parity std ({_channels(bad)}; "
                     f"warned beyond {SPREAD_RATIO}x either way)")
    if c.gray is not None and p.gray is not None and abs(c.gray - p.gray) > GRAY_SHARE:
        found.append(f"{label}grayscale vs colour: {c.gray:.0%} of the calibration samples are grayscale (equal "
                     f"channels), {p.gray:.0%} of the parity samples (warned above {GRAY_SHARE:.0%} apart)")
    span = max(c.hi - c.lo, 1e-12)
    beyond = max(c.lo - p.lo, p.hi - c.hi, 0.0) / span
    if beyond > RANGE_BEYOND:
        found.append(f"{label}parity values span [{p.lo:.3g}, {p.hi:.3g}], calibration [{c.lo:.3g}, {c.hi:.3g}]: "
                     f"{beyond:.0%} of the calibration span outside it (warned above {RANGE_BEYOND:.0%})")
    return found


def _resolution(c: int | None, p: int | None) -> list[str]:
    if not c or not p or max(c, p) / min(c, p) <= RESOLUTION_RATIO:
        return []
    return [f"source images differ in resolution {max(c, p) / min(c, p):.1f}x (median shorter side: calibration "
            f"{c} px, parity {p} px; warned above {RESOLUTION_RATIO:g}x)"]


def check_data(calib: SampleSet, parity: SampleSet, *, limit: int = CHECK_SAMPLES) -> DataCheck:
    """Compare the calibration data with the parity data; warn once per difference.

    Args:
        calib, parity: the run's sets (an image folder may sit under a head or a slice).
        limit: samples of each set compared.
    Returns:
        A :class:`DataCheck` (the report's "Calibration and parity data" section).
    Warns:
        CalibrationMismatchWarning: one per difference, naming both sets, the statistic, how much.
    """
    same = calib.source == parity.source
    synthetic = "synthetic" in (calib.source, parity.source)
    compare = not same and not synthetic
    c_desc, c_stats = _describe(calib, limit, compare)
    p_desc, p_stats = _describe(parity, limit, compare)
    check = DataCheck(c_desc, p_desc, compared=compare)
    if not compare:
        check.why_not = ("calibration and parity data are the same source" if same
                         else "synthetic inputs: there is no data to compare")
        return check
    one = len(p_stats) == 1
    for name in p_stats:
        if name in c_stats:
            check.warnings += _compare_input("" if one else name, c_stats[name], p_stats[name])
    check.warnings += _resolution(c_desc["short_side_px"], p_desc["short_side_px"])
    for w in check.warnings:
        warnings.warn(CalibrationMismatchWarning(
            f"calibration data {c_desc['source']} does not look like parity data {p_desc['source']}: {w}"), stacklevel=2)
    return check
