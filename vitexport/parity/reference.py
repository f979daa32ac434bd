"""The golden reference: the untouched model's outputs, captured once, before any pass runs.

Exporters can change a model's state (a Hugging Face text encoder's torch outputs moved by up to
0.92 after a ``torch.onnx.export``), so every stage is compared with outputs captured first, never
with the torch model re-run later. The reference holds the parity inputs too, so every stage sees
exactly the same batches, and optionally per-layer activations for localisation.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from ..calibration.boxes import is_box_labels
from ..runners.base import BaseRunner, feed_size
from ..errors import BadInput
from ..io import atomic_path
from .layers import make_torch_probe
from .nonfinite import locate_nonfinite

__all__ = ["GoldenReference", "capture_reference", "vacuous_reason", "primary_name", "REFERENCE_FILE"]

REFERENCE_FILE = "reference.npz"
_FORMAT = 1


def primary_name(outputs: Iterable[str]) -> str:
    """The output the classification metrics (top-1, accuracy) and the INT8 judge read: ``output``
    (a model's only output), else ``logits``, else the first (the model's own order)."""
    names = list(outputs)
    for name in ("output", "logits"):
        if name in names:
            return name
    return names[0]


@dataclass
class GoldenReference:
    """Outputs of the untouched model on the parity inputs.

    Attributes:
        outputs: output name → array over all samples, in the model's order: ``{'output': ...}``
            for a model with one output, else every tensor output by its name (``logits``,
            ``pred_boxes``...); :attr:`primary` names the one the classification metrics read.
        feeds: the parity inputs, one dict per batch (input name → array).
        labels: integer labels per sample [N], a segmenter's label maps [N, H, W], a detector's boxes
            [N, M, 5], or None (:attr:`class_labels` / :attr:`pixel_labels` / :attr:`box_labels` give each kind).
        source: what produced it (``'untouched torch model timm:vit_tiny...'``).
        layers: optional per-layer activations (module name → array) of the first
            ``layer_batches`` batches, in network order; used by :func:`localize_layers`.
        layer_batches: how many of ``feeds`` the layer activations cover.
        engine: the engine that produced it.
    """

    outputs: dict[str, np.ndarray]
    feeds: list[dict[str, np.ndarray]]
    labels: np.ndarray | None = None
    source: str = ""
    layers: dict[str, np.ndarray] | None = None
    layer_batches: int = 0
    engine: str = "torch"
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def primary(self) -> str:
        """The primary output's name: ``output`` (the only one), else ``logits``, else the first."""
        return primary_name(self.outputs)

    @property
    def output(self) -> np.ndarray:
        """The primary output (``outputs[self.primary]``)."""
        return self.outputs[self.primary]

    @property
    def class_labels(self) -> np.ndarray | None:
        """One integer class per sample (accuracy), or None (no labels, or label maps)."""
        return self.labels if self.labels is not None and self.labels.ndim == 1 else None

    @property
    def pixel_labels(self) -> np.ndarray | None:
        """A segmenter's label maps [N, H, W] (mIoU against labels), or None."""
        return self.labels if self.labels is not None and self.labels.ndim == 3 and not is_box_labels(self.labels) else None

    @property
    def box_labels(self) -> np.ndarray | None:
        """A detector's boxes [N, M, 5] (class, cx, cy, w, h; :mod:`~vitexport.calibration.boxes`), or None."""
        return self.labels if is_box_labels(self.labels) else None

    @property
    def task_labels(self) -> np.ndarray | None:
        """The labels a task metric reads: label maps or boxes (None: none, or one class per sample)."""
        return self.pixel_labels if self.pixel_labels is not None else self.box_labels

    @property
    def num_samples(self) -> int:
        return int(self.output.shape[0])

    @property
    def input_names(self) -> list[str]:
        return list(self.feeds[0]) if self.feeds else []

    # --- persistence ------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write ``reference.npz`` into ``directory`` atomically (no pickle). Returns the file path."""
        target = Path(directory) / REFERENCE_FILE
        arrays: dict[str, np.ndarray] = {}
        out_names = list(self.outputs)
        for i, name in enumerate(out_names):
            arrays[f"out{i}"] = np.asarray(self.outputs[name])
        feed_names = self.input_names
        for b, feed in enumerate(self.feeds):
            for j, name in enumerate(feed_names):
                arrays[f"feed{b}_{j}"] = np.asarray(feed[name])
        if self.labels is not None:
            arrays["labels"] = np.asarray(self.labels)
        layer_names = list(self.layers or {})
        for i, name in enumerate(layer_names):
            arrays[f"layer{i}"] = np.asarray(self.layers[name])  # type: ignore[index]
        meta = {
            "format": _FORMAT,
            "outputs": out_names,
            "inputs": feed_names,
            "batches": len(self.feeds),
            "layers": layer_names,
            "layer_batches": self.layer_batches,
            "source": self.source,
            "engine": self.engine,
            "meta": self.meta,
        }
        arrays["meta"] = np.array(json.dumps(meta))
        with atomic_path(target) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, **arrays)
        return target

    @classmethod
    def load(cls, directory: str | Path) -> "GoldenReference":
        """Read ``reference.npz`` from ``directory`` (or the file itself).

        Raises:
            BadInput: missing or unreadable file.
        """
        path = Path(directory)
        if path.is_dir():
            path = path / REFERENCE_FILE
        if not path.is_file():
            raise BadInput(f"golden reference not found: {path}")
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                outputs = {n: z[f"out{i}"] for i, n in enumerate(meta["outputs"])}
                feeds = [{n: z[f"feed{b}_{j}"] for j, n in enumerate(meta["inputs"])} for b in range(meta["batches"])]
                labels = z["labels"] if "labels" in z.files else None
                layers = {n: z[f"layer{i}"] for i, n in enumerate(meta.get("layers", []))} or None
        except (OSError, ValueError, KeyError, EOFError) as exc:
            raise BadInput(f"{path}: not a readable golden reference ({str(exc).splitlines()[0][:120]})") from None
        return cls(outputs, feeds, labels, meta.get("source", ""), layers, int(meta.get("layer_batches", 0)),
                   meta.get("engine", "torch"), dict(meta.get("meta", {})))


def capture_reference(
    runner: BaseRunner,
    samples_batches: Iterable[Mapping[str, np.ndarray]],
    labels: np.ndarray | None = None,
    source: str = "",
    *,
    layers: Any = None,
    layer_samples: int = 8,
) -> GoldenReference:
    """Run the untouched model once on the parity inputs and keep its outputs.

    Call this before any pass or export touches the model.

    Args:
        runner: usually a :class:`~vitexport.runners.TorchRunner` on the untouched module.
        samples_batches: the parity inputs, batch by batch (kept in the reference).
        labels: optional integer labels, one per sample, or label maps [N, H, W] (a segmenter's).
        source: a description stored with the reference (``'untouched torch model <uri>'``).
        layers: also capture per-layer activations for localisation: ``True`` (the repeated
            blocks of a TorchRunner's module), a list of module names, or a layer probe
            (an object with ``layer_names()`` and ``run(feeds)``).
        layer_samples: capture layer activations on the first batches holding at least this many
            samples (they can be large).
    Returns:
        The :class:`GoldenReference`.
    Raises:
        BadInput: no samples, a label count that does not match, or a reference that is not
            finite (the untouched model itself produces NaN/Inf on these inputs).
    """
    feeds = [{k: np.array(v, copy=True) for k, v in b.items()} for b in samples_batches]
    if not feeds:
        raise BadInput("no parity samples: the golden reference needs at least one batch")
    was_active = runner.is_active
    runner.activate()
    try:
        outs: dict[str, list[np.ndarray]] = {}
        for out in runner.infer_many(feeds):
            for k, v in out.items():
                outs.setdefault(k, []).append(np.asarray(v))
    finally:
        if not was_active:
            runner.deactivate()
    outputs = {k: np.concatenate(v, axis=0) for k, v in outs.items()}
    n = outputs[primary_name(outputs)].shape[0]
    if labels is not None:
        labels = np.asarray(labels)
        labels = labels if labels.ndim == 3 else labels.reshape(-1)
        if len(labels) != n:
            raise BadInput(f"{len(labels)} labels for {n} parity samples")
    for name, out in outputs.items():
        bad = ~np.isfinite(out)
        if bad.any():
            first = int(np.argwhere(bad.reshape(n, -1).any(1))[0][0]) if n else 0
            where = _batch_of(feeds, first)
            src = locate_nonfinite(runner, feeds[where])
            said = "" if len(outputs) == 1 else f" in output '{name}'"
            raise BadInput(
                f"the untouched model produces NaN/Inf{said} on the parity inputs (sample {first}"
                + (f", first at {src}" if src else "")
                + "); no stage can be checked against it"
            )
    layer_acts: dict[str, np.ndarray] | None = None
    layer_batches = 0
    if layers is not None and layers is not False:
        probe = make_torch_probe(runner, layers)
        count = 0
        for feed in feeds:
            layer_batches += 1
            count += feed_size(feed)
            if count >= layer_samples:
                break
        layer_acts = probe.run(feeds[:layer_batches])
    return GoldenReference(outputs, feeds, labels, source, layer_acts, layer_batches, runner.engine)


def _batch_of(feeds: list[dict[str, np.ndarray]], sample: int) -> int:
    seen = 0
    for b, feed in enumerate(feeds):
        seen += feed_size(feed)
        if sample < seen:
            return b
    return len(feeds) - 1


def vacuous_reason(reference: GoldenReference) -> str | None:
    """Why comparing with this reference proves nothing, or None: an all-zero output (a
    zero-initialised head), or one output for every sample although the inputs differ."""
    out = reference.output
    if out.size == 0:
        return None
    if not np.any(out):
        return "the untouched model outputs all zeros on every parity sample (an untrained or zero-initialised head?)"
    if out.shape[0] < 2 or not np.all(out == out[:1]):
        return None
    inputs = [np.concatenate([f[k] for f in reference.feeds]) for k in reference.input_names]
    if all(np.all(a == a[:1]) for a in inputs):
        return None  # the samples are all the same: a constant output says nothing
    return (f"the untouched model gives the same output for all {out.shape[0]} different parity samples "
            "(are the weights loaded?)")
