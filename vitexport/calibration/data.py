"""Calibration / parity data: ``.npz`` files (one array per model input, optional ``y`` labels) and
image folders (decoded lazily, batch by batch).

Labels come in three kinds: one class per sample ``y`` [N] (accuracy), a segmenter's label maps ``y``
[N, H, W], and a detector's boxes (:mod:`.boxes`: ``y`` [N, M] beside ``y_boxes`` [N, M, 4] in an ``.npz``,
or a COCO json in an image folder).

A :class:`SampleSet` yields batches lazily: an image folder never holds more than one batch of
decoded images, so memory does not grow with the number of samples. Sampling is a seeded
permutation, so the same path, count and seed always give the same samples in the same order.
"""
from __future__ import annotations

import hashlib
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np

from ..errors import BadInput, VitexportWarning, one_line
from ..preflight.memory import Need, require
from ..runners.base import feed_size
from .boxes import box_labels, coco_box_labels, find_coco_json
from .npz import NpzMember, open_members
from .images import IMAGE_SUFFIXES, ImagePipeline, digest_files, find_images, read_rgb, resolve_pipeline, why_unreadable

if TYPE_CHECKING:  # pragma: no cover
    from ..recipe import PreprocessSpec
    from ..sources.base import Preprocess

__all__ = [
    "SampleSet",
    "NpzSamples",
    "NpzFileSamples",
    "ImageFolderSamples",
    "UnreadableImagesWarning",
    "load_samples",
    "random_samples",
    "feed_size",
]


class UnreadableImagesWarning(VitexportWarning):
    """Some files in a calibration folder could not be decoded and were skipped."""


class SampleSet:
    """Base: ``input_names``, ``len()``, ``batches(batch_size)``, ``labels`` (or None), ``fingerprint()``."""

    input_names: list[str]
    labels: np.ndarray | None = None
    source: str = ""

    def __len__(self) -> int:
        raise NotImplementedError

    def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        raise NotImplementedError

    def fingerprint(self) -> str:
        raise NotImplementedError

    def head(self, n: int) -> SampleSet:
        """The first ``n`` samples (a seeded draw's first ``n`` are a seeded draw too); ``self`` if fewer."""
        return self if n >= len(self) else _Head(self, n)


class _Head(SampleSet):
    """The first ``n`` samples of another set, read lazily through its ``batches``."""

    def __init__(self, base: SampleSet, n: int):
        self.base, self.n = base, n
        self.input_names = list(base.input_names)
        self.labels = None if base.labels is None else base.labels[:n]
        self.source = base.source

    def __len__(self) -> int:
        return self.n

    def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        left = self.n
        for feed in self.base.batches(batch_size):
            if left <= 0:
                return
            take = min(left, feed_size(feed))
            yield {k: v[:take] for k, v in feed.items()}
            left -= take

    def fingerprint(self) -> str:
        return hashlib.sha256(f"{self.base.fingerprint()}:head{self.n}".encode()).hexdigest()[:16]


def _hash_labels(h: "hashlib._Hash", labels: np.ndarray | None) -> None:
    """Labels join a set's fingerprint (none: the fingerprint is the inputs' alone): other labels make
    other accuracy and mIoU figures, so a stage recorded under them must run again."""
    if labels is not None:
        y = np.ascontiguousarray(labels, np.float64 if labels.dtype.kind == "f" else np.int64)  # a detector's boxes
        h.update(f"y:{y.shape}{'f' if y.dtype.kind == 'f' else ''}".encode())
        h.update(y.tobytes())


@dataclass
class NpzSamples(SampleSet):
    arrays: dict[str, np.ndarray]
    labels: np.ndarray | None = None
    source: str = ""
    input_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.input_names = list(self.arrays)

    def __len__(self) -> int:
        return feed_size(self.arrays)

    def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        n = len(self)
        for i in range(0, n, batch_size):
            yield {k: v[i : i + batch_size] for k, v in self.arrays.items()}

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for k in sorted(self.arrays):
            a = np.ascontiguousarray(self.arrays[k])
            h.update(f"{k}:{a.dtype.str}:{a.shape}".encode())
            h.update(a.tobytes())
        _hash_labels(h, self.labels)
        return h.hexdigest()[:16]


class ImageFolderSamples(SampleSet):
    """Images from a folder, preprocessed on the fly into the model's single image input.

    Attributes:
        files: the chosen, readable images in sampling order.
        skipped: files that could not be decoded (and were replaced by the next in the permutation).
        pipeline: the preprocessing applied.
    """

    def __init__(self, root: Path, files: list[Path], input_name: str, dtype: np.dtype, pipeline: ImagePipeline,
                 skipped: list[Path], labels: np.ndarray | None = None):
        self.root = root
        self.files = files
        self.input_names = [input_name]
        self.dtype = np.dtype(dtype)
        self.pipeline = pipeline
        self.skipped = skipped
        self.labels = labels
        self.source = str(root)
        self._fingerprint: str | None = None

    def __len__(self) -> int:
        return len(self.files)

    def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        name = self.input_names[0]
        for i in range(0, len(self.files), batch_size):
            chunk = self.files[i : i + batch_size]
            arr = np.stack([self.pipeline(read_rgb(p)) for p in chunk]).astype(self.dtype, copy=False)
            yield {name: arr}

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            h = hashlib.sha256(digest_files(self.files, self.root).encode())
            h.update(self.pipeline.describe().encode())
            h.update(self.dtype.str.encode())
            if self.labels is not None and self.labels.dtype.kind == "f":  # a COCO json's boxes (class folders: the paths)
                _hash_labels(h, self.labels)
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint


def _as_numpy(v) -> np.ndarray:
    return v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)


def _check_shapes(arrays: dict[str, NpzMember | np.ndarray], example: dict[str, np.ndarray],
                  path: Path) -> tuple[dict[str, NpzMember | np.ndarray], dict[str, np.dtype]]:
    """The file's array for each model input (checked: shape, dtype kind) and the dtype it becomes."""
    names = list(example)
    if len(names) == 1 and names[0] not in arrays:
        # a single-input model accepts the file's only array (or one named 'x') whatever its name
        if "x" in arrays:
            arrays = {names[0]: arrays["x"]}
        elif len(arrays) == 1:
            arrays = {names[0]: next(iter(arrays.values()))}
    missing = [n for n in names if n not in arrays]
    if missing:
        raise BadInput(f"{path}: no array for model input(s) {missing}; the file has {sorted(arrays)}")
    out, want = {}, {}
    for n in names:
        a, shape = arrays[n], tuple(example[n].shape)
        if a.ndim != len(shape) or tuple(a.shape[1:]) != shape[1:]:
            raise BadInput(
                f"{path}: array '{n}' has shape {tuple(a.shape)}, the model input wants (N, {', '.join(map(str, shape[1:]))})"
            )
        want_dt = np.asarray(example[n]).dtype
        if np.issubdtype(want_dt, np.integer) and not (np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_):
            raise BadInput(f"{path}: array '{n}' holds {a.dtype} values, the model input wants integers ({want_dt})")
        out[n], want[n] = a, want_dt
    lengths = {a.shape[0] for a in out.values()}
    if len(lengths) != 1:
        raise BadInput(f"{path}: inputs have different sample counts {sorted(lengths)}")
    return out, want


def _take(a: NpzMember | np.ndarray, idx: np.ndarray) -> np.ndarray:
    return a.rows(idx) if isinstance(a, NpzMember) else a[idx]


class NpzFileSamples(SampleSet):
    """Samples of an ``.npz`` file, read from disk batch by batch (:mod:`.npz`): memory does not
    grow with the number of samples. Batches, order and fingerprint equal those of an
    :class:`NpzSamples` holding the same rows."""

    def __init__(self, members: dict[str, NpzMember | np.ndarray], index: np.ndarray, dtypes: dict[str, np.dtype],
                 labels: np.ndarray | None, source: str):
        self.members, self.index, self.dtypes = members, np.asarray(index, np.int64), dtypes
        self.input_names = list(members)
        self.labels = labels
        self.source = source
        self._fingerprint: str | None = None

    def __len__(self) -> int:
        return len(self.index)

    def batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        for i in range(0, len(self.index), batch_size):
            idx = self.index[i : i + batch_size]
            yield {k: _take(a, idx).astype(self.dtypes[k], copy=False) for k, a in self.members.items()}

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            h = hashlib.sha256()
            for k in sorted(self.members):
                a = self.members[k]
                h.update(f"{k}:{self.dtypes[k].str}:{(len(self.index), *a.shape[1:])}".encode())
                for i in range(0, len(self.index), _CHUNK):
                    h.update(np.ascontiguousarray(_take(a, self.index[i : i + _CHUNK]).astype(self.dtypes[k], copy=False)).tobytes())
            _hash_labels(h, self.labels)
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint


_CHUNK = 16  # rows per read when a whole file is streamed (validation, fingerprint)


def _check_labels(y: np.ndarray, p: Path) -> np.ndarray:
    """Labels must be integer class indices: one per sample, or a segmenter's label map per sample
    [N, H, W] (255: a pixel nobody labelled, as ADE20K and Cityscapes mark it). String or fractional
    labels would make every accuracy silently 0."""
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim not in (1, 3):
        raise BadInput(f"{p}: 'y' has shape {tuple(y.shape)}; labels must be one integer class index per sample "
                       "(not one-hot), or one label map [N, H, W] per sample for a segmenter")
    if y.dtype.kind in "iu" or y.dtype == np.bool_:
        pass
    elif y.dtype.kind == "f" and np.isfinite(y).all() and (y == np.round(y)).all():
        y = y.astype(np.int64)
    else:
        what = {"U": "strings", "S": "bytes", "O": "objects"}.get(y.dtype.kind, f"{y.dtype} values")
        raise BadInput(f"{p}: 'y' holds {what}; labels must be integer class indices (map class names to 0..K-1)")
    if y.size and y.min() < 0:
        raise BadInput(f"{p}: 'y' holds negative labels ({int(y.min())}); labels must be class indices 0..K-1"
                       + (" (255 marks an unlabelled pixel)" if y.ndim == 3 else ""))
    return y.astype(np.int64, copy=False)


def _check_values(inputs: dict[str, NpzMember | np.ndarray], n: int, p: Path) -> None:
    """Float arrays hold finite values, and not one value throughout: constant data (all zeros)
    calibrates every range to 0 and makes every parity gate vacuous. Streamed, a chunk at a time."""
    spans: dict[str, tuple[float, float]] = {}
    for k, a in inputs.items():
        if a.dtype.kind not in "fc":
            continue
        lo, hi = np.inf, -np.inf
        for i in range(0, n, _CHUNK):
            rows = _take(a, np.arange(i, min(i + _CHUNK, n)))
            if not np.isfinite(rows).all():
                raise BadInput(f"{p}: array '{k}' holds NaN or infinite values")
            if rows.size:
                lo, hi = min(lo, float(rows.real.min())), max(hi, float(rows.real.max()))
        spans[k] = (lo, hi)
    if spans and all(lo == hi for lo, hi in spans.values()):
        k, (v, _) = next(iter(spans.items()))
        raise BadInput(f"{p}: the data is constant (every value of '{k}' is {v:g} in all {n} sample(s)); "
                       "calibration and parity need real inputs that vary")


def _load_npz(p: Path, example: dict[str, np.ndarray], num_samples: int | None, seed: int) -> NpzFileSamples:
    try:
        arrays = open_members(p)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise BadInput(f"{p}: not a readable .npz file ({one_line(str(exc), 200) or type(exc).__name__})") from None
    if not arrays:
        raise BadInput(f"{p}: holds no arrays")
    labels, boxes = arrays.pop("y", None), arrays.pop("y_boxes", None)
    if boxes is not None:
        if labels is None:
            raise BadInput(f"{p}: 'y_boxes' without 'y'; a detector's labels are 'y' [N, M] (class per box, -1: none) "
                           "beside 'y_boxes' [N, M, 4]")
        labels = box_labels(np.asarray(labels), np.asarray(boxes), str(p))
    elif labels is not None:
        labels = _check_labels(np.asarray(labels), p)
    inputs, dtypes = _check_shapes(arrays, example, p)
    n = len(next(iter(inputs.values())))
    if n == 0:
        raise BadInput(f"{p}: holds no samples")
    if labels is not None and len(labels) != n:
        raise BadInput(f"{p}: 'y' has {len(labels)} labels for {n} samples")
    _check_values(inputs, n, p)
    idx = np.arange(n)
    if num_samples is not None and num_samples < n:
        idx = np.sort(np.random.default_rng(seed).permutation(n)[:num_samples])
    return NpzFileSamples(inputs, idx, dtypes, labels[idx] if labels is not None else None, str(p))


def _class_labels(files: list[Path], root: Path) -> np.ndarray | None:
    """Labels from integer-named class folders (``root/417/x.jpg``); None when the layout is not that."""
    labels = []
    for f in files:
        rel = f.relative_to(root).parts
        if len(rel) < 2 or not rel[0].isdigit():
            return None
        labels.append(int(rel[0]))
    return np.asarray(labels, dtype=np.int64)


def _load_folder(p: Path, example: dict[str, np.ndarray], num_samples: int | None, seed: int,
                 preprocess: "Preprocess | None", spec: "PreprocessSpec | None") -> ImageFolderSamples:
    if len(example) != 1:
        raise BadInput(
            f"{p}: an image folder can feed only a single-input model; this one has inputs {list(example)} "
            "(use an .npz file with one array per input)"
        )
    name, ex = next(iter(example.items()))
    if ex.ndim != 4 or ex.shape[1] != 3 or not np.issubdtype(ex.dtype, np.floating):
        raise BadInput(f"{p}: an image folder needs a float N,3,H,W model input; '{name}' is {ex.dtype} {tuple(ex.shape)}")
    pipeline = resolve_pipeline(tuple(ex.shape), preprocess, spec)
    others: list[Path] = []
    candidates = find_images(p, others)
    if not candidates:
        extra = f" ({len(others)} image-named entries are not regular files)" if others else ""
        raise BadInput(f"{p}: no image files (jpg, png, bmp, webp) in the folder{extra}")
    order = np.random.default_rng(seed).permutation(len(candidates))
    want = len(candidates) if num_samples is None else num_samples
    chosen: list[Path] = []
    sizes: dict[Path, tuple[int, int]] = {}
    skipped: list[Path] = []
    reasons: dict[Path, str] = {f: "not a regular file" for f in others}
    for i in order:
        if len(chosen) >= want:
            break
        f = candidates[int(i)]
        try:
            sizes[f] = read_rgb(f).size
        except Exception as exc:  # PIL raises many kinds (OSError, ValueError, SyntaxError, DecompressionBomb...)
            skipped.append(f)
            reasons[f] = why_unreadable(exc)
            continue
        chosen.append(f)
    if not chosen:
        first = next(iter(reasons.items()), None)
        why = f"; {first[0].name}: {first[1]}" if first else ""
        raise BadInput(f"{p}: none of the {len(candidates)} image file(s) could be read{why}")
    if reasons:
        shown = ", ".join(f"{f.name} ({why})" for f, why in list(reasons.items())[:3]) + (" ..." if len(reasons) > 3 else "")
        warnings.warn(UnreadableImagesWarning(f"{p}: skipped {len(reasons)} unreadable image file(s): {shown}"), stacklevel=3)
    coco = find_coco_json(p)
    labels = (coco_box_labels(coco, chosen, sizes, p, pipeline.resize, pipeline.crop) if coco is not None
              else _class_labels(chosen, p))
    return ImageFolderSamples(p, chosen, name, ex.dtype, pipeline, skipped + others, labels)


def _check_data_file(p: Path) -> None:
    """A data file must be a regular file holding a zip (an ``.npz``), whatever its name says."""
    if not p.is_file():
        raise BadInput(f"{p}: not a regular file (a pipe or device?); give an .npz file or an image folder")
    try:
        with open(p, "rb") as fh:
            head = fh.read(6)
    except OSError as exc:
        raise BadInput(f"{p}: cannot read ({exc.strerror or exc})") from None
    if head[:4] == b"PK\x03\x04" or (head[:4] == b"PK\x05\x06"):
        return
    if head == b"\x93NUMPY":
        raise BadInput(f"{p}: a single .npy array; save it as an .npz (np.savez('data.npz', x=array))")
    if p.suffix.lower() in IMAGE_SUFFIXES:
        raise BadInput(f"{p}: a single image; give the folder that holds the images")
    if p.suffix.lower() == ".npz":
        raise BadInput(f"{p}: named .npz but not one (an .npz is a zip archive; write it with np.savez)")
    raise BadInput(f"{p}: unsupported data (expected an .npz file or an image folder)")


def load_samples(
    path: str | Path,
    example_inputs: dict,
    *,
    num_samples: int | None = None,
    seed: int = 0,
    preprocess: "Preprocess | None" = None,
    spec: "PreprocessSpec | None" = None,
) -> SampleSet:
    """Load samples for a model whose inputs look like ``example_inputs`` (name → tensor/array).

    Args:
        path: an ``.npz`` file (one array per model input, samples on axis 0, optional ``y``
            labels, a detector's ``y_boxes``) or a folder of images (searched recursively; integer-named
            subfolders give class labels, a COCO json at its top a detector's boxes).
        example_inputs: the model's example inputs (names, trailing shapes, dtypes).
        num_samples: keep at most this many, chosen by a seeded permutation (deterministic).
        seed: the sampling seed.
        preprocess: the model source's preprocessing (images only).
        spec: the recipe's ``calibration.preprocess`` overrides (images only).
    Returns:
        A :class:`SampleSet`.
    Raises:
        BadInput: missing or unreadable file, no readable image, wrong names, shapes or dtypes.
    Warns:
        UnreadableImagesWarning: some images were skipped (the count is in the message).
    """
    p = Path(path)
    if not p.exists():
        raise BadInput(f"data path not found: {p}")
    if num_samples is not None and num_samples < 1:
        raise BadInput(f"num_samples must be at least 1, got {num_samples}")
    example = {k: _as_numpy(v) for k, v in example_inputs.items()}
    if p.is_dir():
        return _load_folder(p, example, num_samples, seed, preprocess, spec)
    _check_data_file(p)
    return _load_npz(p, example, num_samples, seed)


def random_samples(example_inputs: dict, num_samples: int, seed: int = 0, setting: str = "use fewer samples") -> NpzSamples:
    """Seeded synthetic samples shaped like ``example_inputs`` (used only when no data is given).

    Float inputs are standard normal; integer inputs are uniform below the example's maximum + 1,
    except inputs named like a mask, which get a random amount of trailing padding (zeros) per
    sample so that masked positions are exercised.
    Raises:
        ResourceLimit: the samples cannot fit in memory (``setting`` says what to change).
    """
    per_sample = sum(int(np.prod(_as_numpy(v).shape[1:])) * 8 for v in example_inputs.values())  # float64 draws
    require([Need(f"{num_samples} synthetic sample(s)", per_sample * num_samples, setting)])
    rng = np.random.default_rng(seed)
    arrays = {}
    for k, v in example_inputs.items():
        a = _as_numpy(v)
        shape = (num_samples, *a.shape[1:])
        if np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_:
            if "mask" in k.lower():
                m = np.ones(shape, dtype=a.dtype)
                if len(shape) == 2 and shape[1] > 1:
                    keep = rng.integers(max(1, shape[1] // 2), shape[1] + 1, size=num_samples)
                    m = (np.arange(shape[1])[None, :] < keep[:, None]).astype(a.dtype)
                arrays[k] = m
            else:
                hi = max(int(a.max()) + 1, 2)
                arrays[k] = rng.integers(0, hi, size=shape).astype(a.dtype)
        else:
            arrays[k] = rng.standard_normal(shape).astype(a.dtype)
    return NpzSamples(arrays, None, "synthetic")
