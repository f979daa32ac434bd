"""Per-layer localisation: which block did the numbers leave the budget in?

Torch side: forward hooks on the module(s) that make up the network's repeated blocks (timm
``blocks.3``, Hugging Face ``encoder.layer.3``, torchvision ``encoder.layers.encoder_layer_3``).
ONNX side: the output of the last node in the module's scope (see :mod:`.onnx_graph`), exposed as an
extra graph output; when the graph has no scopes (some dynamo exports) the tensor is found by value
against the torch reference. ONNX-vs-ONNX matches the same module scopes in both files (QDQ models
keep the node scopes even when tensor names change), or residual Adds by tensor name.

Each layer gets cosine (per sample), SNR and max error, plain and channel-standardized, and the
noise it adds over the previous layer; the first layer outside the budget is the
``first_divergence``, the layers that add the most noise are flagged as the worst.
"""
from __future__ import annotations

import math
from dataclasses import field
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
import onnx
from pydantic import model_validator

from ..recipe import Tolerance
from ..runners.base import feed_size
from ..runners.ort_runner import OnnxRuntimeRunner
from .data import Data, Sparse, result
from .onnx_graph import OnnxGraph, _shape_ok, block_scopes

__all__ = [
    "LayerBudget",
    "LayerResult",
    "LayerReport",
    "LayerProbe",
    "TorchLayerProbe",
    "OnnxLayerProbe",
    "block_names",
    "map_layers_to_onnx",
    "compare_layers",
    "localize_layers",
    "localize_onnx",
    "make_torch_probe",
]


# --- budget and results ---------------------------------------------------------------------------
@result(frozen=True)
class LayerBudget(Sparse):
    """The error a single layer may show before it counts as divergent. ``None`` means not checked.

    ``max_rel`` is the largest ``max|cand - ref| / max|ref|`` of the layer's activations.
    """

    max_rel: float | None = None
    max_abs: float | None = None
    cosine_min: float | None = None
    snr_db_min: float | None = None

    @classmethod
    def from_tolerance(cls, tolerance: Tolerance | None) -> "LayerBudget":
        """The stage tolerance applied to every layer: a relative ``max_abs`` becomes ``max_rel``, an
        absolute one ``max_abs``; ``cosine_min`` carries over. A tolerance that gates neither (an
        accuracy-only stage) gets ``cosine_min=0.99``, so a divergence is still named."""
        if tolerance is None:
            return cls(max_rel=1e-4)
        max_rel = tolerance.max_abs if tolerance.max_abs is not None and tolerance.relative else None
        max_abs = tolerance.max_abs if tolerance.max_abs is not None and not tolerance.relative else None
        cos = tolerance.cosine_min
        if max_rel is None and max_abs is None and cos is None:
            cos = 0.99
        return cls(max_rel=max_rel, max_abs=max_abs, cosine_min=cos)

    def violations(self, r: "LayerResult") -> list[str]:
        """The checks a layer fails, as ``'metric=value (must be op limit)'`` strings."""
        out = []
        if r.nonfinite:
            out.append(f"nonfinite={r.nonfinite}")
        if self.max_rel is not None and not r.rel_err <= self.max_rel:
            out.append(f"rel_err={r.rel_err:.3g} (must be <= {self.max_rel:.3g})")
        if self.max_abs is not None and not r.max_abs <= self.max_abs:
            out.append(f"max_abs={r.max_abs:.3g} (must be <= {self.max_abs:.3g})")
        if self.cosine_min is not None and not r.ch_cosine_min >= self.cosine_min:
            out.append(f"ch_cosine_min={r.ch_cosine_min:.6g} (must be >= {self.cosine_min:.6g})")
        if self.snr_db_min is not None and not r.ch_snr_db >= self.snr_db_min:
            out.append(f"ch_snr_db={r.ch_snr_db:.3g} (must be >= {self.snr_db_min:.3g})")
        return out

    def noise_budget(self) -> float:
        """The budget as a relative noise power (noise / signal): what one layer may add before it
        counts as a material contributor. ``1 - cos ≈ n / 2`` for small noise ``n``."""
        limits = []
        if self.cosine_min is not None:
            limits.append(2.0 * max(1.0 - self.cosine_min, 1e-12))
        if self.snr_db_min is not None:
            limits.append(10 ** (-self.snr_db_min / 10))
        if self.max_rel is not None:
            limits.append(self.max_rel**2)
        return min(limits) if limits else 0.02


@result
class LayerResult(Data):
    """One layer's error against the reference.

    ``cosine_*`` / ``snr_db`` are plain (per sample, flattened). ``ch_*`` are the same on
    channel-standardized activations (each last-axis channel divided by the reference's std of
    that channel): a ViT's residual stream has outlier channels (|x|≈1400 in ViT-B) that dominate
    the plain norm and hide an error in every other channel. The budget's cosine/SNR limits apply
    to the ``ch_*`` values. ``noise_added`` is the channel-standardized relative noise power this
    layer adds over the previous one; ``noise_share`` its share of the total.
    """

    name: str
    tensor: str | None
    max_abs: float
    rel_err: float
    cosine_min: float
    cosine_mean: float
    snr_db: float
    nonfinite: int = 0
    ch_cosine_min: float = 1.0
    ch_snr_db: float = math.inf
    noise_added: float = 0.0
    noise_share: float = 0.0
    passed: bool = True
    flagged: bool = False
    reason: str = ""
    others: dict[str, dict[str, float]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.passed

    @model_validator(mode="before")
    @classmethod
    def _older_reports(cls, data: Any) -> Any:
        # reports written before the channel-standardized figures existed: the plain ones stand in
        if isinstance(data, Mapping) and "cosine_min" in data:
            data = {"ch_cosine_min": data["cosine_min"], "ch_snr_db": data.get("snr_db", math.inf), **data}
        return data


@result
class LayerReport(Data):
    """Per-layer comparison. ``bool(report)`` is true when no layer left the budget.

    Attributes:
        layers: results in network order.
        budget: the per-layer budget applied.
        first_divergence: the first layer outside the budget, or None.
        worst: the layers that add the most noise, worst first: at most three, each adding at
            least a tenth of the budget's noise by itself (or failing the budget).
        method: how layers were matched: ``'scope'`` (ONNX node scopes), ``'value'`` (by value
            against the torch reference), ``'name'`` (same tensor names), ``'module'`` (torch vs torch).
        notes: anything a reader should know (skipped layers, fallbacks).
        candidates: labels of the compared models when several were (the last is ``layers``'
            subject, the others are in ``LayerResult.others``).
    """

    layers: list[LayerResult]
    budget: LayerBudget = field(default_factory=LayerBudget)
    first_divergence: str | None = None
    worst: list[str] = field(default_factory=list)
    method: str = "scope"
    notes: list[str] = field(default_factory=list)
    candidates: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.first_divergence is None

    def get(self, name: str) -> LayerResult | None:
        return next((r for r in self.layers if r.name == name), None)


def _cos_snr(r: np.ndarray, o: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Per-row cosine, SNR dB and relative noise power of rows ``o`` against rows ``r``."""
    diff = o - r
    num = (r * o).sum(1)
    den = np.linalg.norm(r, axis=1) * np.linalg.norm(o, axis=1)
    cos = np.where(den > 0, num / np.maximum(den, 1e-300), np.where(np.abs(diff).sum(1) == 0, 1.0, 0.0))
    noise = float((diff**2).sum())
    signal = float((r**2).sum())
    snr = math.inf if noise == 0 else 10 * math.log10(max(signal, 1e-300) / noise)
    rel_noise = 0.0 if noise == 0 else noise / max(signal, 1e-300)
    return cos, snr, rel_noise


def _layer_stats(name: str, tensor: str | None, ref: np.ndarray, out: np.ndarray) -> tuple[LayerResult, float]:
    """A layer's result and its channel-standardized relative noise power."""
    ref = np.asarray(ref, dtype=np.float64)
    out = np.asarray(out, dtype=np.float64)
    nonfinite = int((~np.isfinite(out)).sum())
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    if nonfinite:
        return LayerResult(name, tensor, math.inf, math.inf, -1.0, -1.0, -math.inf, nonfinite, -1.0, -math.inf), math.inf
    r = ref.reshape(ref.shape[0], -1) if ref.ndim > 1 else ref.reshape(1, -1)
    o = out.reshape(r.shape)
    max_abs = float(np.abs(o - r).max()) if r.size else 0.0
    cos, snr, _ = _cos_snr(r, o)
    # channel-standardized: the last axis is the channel of a token tensor (B, N, D) or (B, D)
    if ref.ndim >= 2:
        std = ref.reshape(-1, ref.shape[-1]).std(0)
        mean_std = float(std.mean())
        w = 1.0 / (std + 1e-3 * mean_std) if mean_std > 0 else np.ones_like(std)
        rz, oz = (ref * w).reshape(r.shape), (out * w).reshape(r.shape)
    else:
        rz, oz = r, o
    ch_cos, ch_snr, rel_noise = _cos_snr(rz, oz)
    rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    res = LayerResult(name, tensor, max_abs, rel, float(cos.min()), float(cos.mean()), snr, 0,
                      float(ch_cos.min()), ch_snr)
    return res, rel_noise


def compare_layers(
    reference: Mapping[str, np.ndarray],
    candidate: Mapping[str, np.ndarray],
    order: Sequence[str],
    budget: LayerBudget,
    *,
    tensors: Mapping[str, str] | None = None,
    method: str = "scope",
    notes: Sequence[str] = (),
) -> LayerReport:
    """Compare per-layer activations and find the first divergence and the worst layers.

    Args:
        reference, candidate: layer name → activations (same batches, samples along axis 0).
        order: layer names in network order; names missing on either side are skipped with a note.
        budget: what one layer may show.
        tensors: layer name → the candidate tensor it was read from (for the report).
    """
    notes = list(notes)
    results: list[LayerResult] = []
    noise: list[float] = []
    for name in order:
        if name not in reference or name not in candidate:
            notes.append(f"layer '{name}' not found in the {'reference' if name not in reference else 'candidate'}; skipped")
            continue
        ref, out = reference[name], candidate[name]
        if np.shape(ref) != np.shape(out):
            notes.append(f"layer '{name}': shape {np.shape(out)} differs from the reference's {np.shape(ref)}; skipped")
            continue
        r, n = _layer_stats(name, (tensors or {}).get(name), ref, out)
        v = budget.violations(r)
        r.passed, r.reason = not v, "; ".join(v)
        results.append(r)
        noise.append(n)
    # noise each layer adds over the previous one (the first non-finite layer takes it all)
    prev = 0.0
    for r, n in zip(results, noise):
        if math.isinf(n):
            r.noise_added = math.inf if not math.isinf(prev) else 0.0
        else:
            r.noise_added = max(n - prev, 0.0)
        prev = n
    if any(math.isinf(r.noise_added) for r in results):
        for r in results:
            r.noise_share = 1.0 if math.isinf(r.noise_added) else 0.0
    else:
        total = sum(r.noise_added for r in results)
        for r in results:
            r.noise_share = r.noise_added / total if total > 0 else 0.0
    first = next((r.name for r in results if not r.passed), None)
    material = 0.1 * budget.noise_budget()
    ranked = sorted((r for r in results if r.noise_added >= material or (not r.passed and r.noise_added > 0)),
                    key=lambda r: -r.noise_added)
    worst = [r.name for r in ranked[:3]]
    for r in results:
        r.flagged = r.name in worst
    return LayerReport(results, budget, first, worst, method, notes)


# --- which modules are layers ----------------------------------------------------------------------
def block_names(module) -> list[str]:
    """Qualified names of the network's repeated blocks, in definition order.

    A block is a child of an ``nn.Sequential`` / ``nn.ModuleList`` holding at least two children of
    the same class that have parameters; only the outermost such blocks are kept (a block's own
    MLP ``Sequential`` is not a list of blocks).
    """
    import torch.nn as nn  # torch loads on first use (~2 s, 0.5 GB): comparing ONNX files never needs it

    names: list[str] = []
    taken: list[str] = []
    for qual, mod in module.named_modules():
        if not isinstance(mod, (nn.Sequential, nn.ModuleList)):
            continue
        if any(qual == t or qual.startswith(t + ".") for t in taken):
            continue
        kids = list(mod.named_children())
        if len(kids) < 2:
            continue
        by_type: dict[type, int] = {}
        for _, k in kids:
            if any(True for _ in k.parameters()) and any(True for _ in k.children()):
                by_type[type(k)] = by_type.get(type(k), 0) + 1
        if not by_type or max(by_type.values()) < 2:
            continue
        kind = max(by_type, key=lambda t: by_type[t])
        for child, k in kids:
            if type(k) is kind:
                full = f"{qual}.{child}" if qual else child
                names.append(full)
                taken.append(full)
    return names


# --- probes: run a model, return per-layer activations ---------------------------------------------
class LayerProbe(Protocol):
    """Runs a model on feeds and returns layer name → activations (concatenated over batches)."""

    engine: str

    def layer_names(self) -> list[str]: ...

    def run(self, feeds: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]: ...


def _first_tensor(obj):
    import torch  # torch loads on first use (~2 s, 0.5 GB): comparing ONNX files never needs it

    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, Mapping):
        obj = list(obj.values())
    if hasattr(obj, "to_tuple"):
        obj = obj.to_tuple()
    if isinstance(obj, (list, tuple)):
        for v in obj:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


class TorchLayerProbe:
    """Forward hooks on named modules of a torch model, run in eval mode without grad (the module's
    training flag is restored afterwards). A module's first tensor output is its activation."""

    engine = "torch"

    def __init__(self, module, layers: Sequence[str] | None = None):
        self.module = module
        self.layers = list(layers) if layers is not None else block_names(module)

    def layer_names(self) -> list[str]:
        return list(self.layers)

    def run(self, feeds: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        import torch  # torch loads on first use (~2 s, 0.5 GB): comparing ONNX files never needs it

        mods = dict(self.module.named_modules())
        acts: dict[str, list[np.ndarray]] = {}
        current: dict[str, np.ndarray] = {}
        handles = []

        def hook(name):
            def fn(_mod, _inp, output):
                t = _first_tensor(output)
                if t is not None:
                    current[name] = t.detach().float().cpu().numpy().copy()
            return fn

        for name in self.layers:
            if name in mods:
                handles.append(mods[name].register_forward_hook(hook(name)))
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad():
                for feed in feeds:
                    current.clear()
                    self.module(**{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in feed.items()})
                    for k, v in current.items():
                        acts.setdefault(k, []).append(v)
        finally:
            for h in handles:
                h.remove()
            self.module.train(was_training)
        return {k: np.concatenate(v, axis=0) for k, v in acts.items()}


class OnnxLayerProbe:
    """Observes chosen tensors of an ONNX model (as extra graph outputs) with ONNX Runtime (CPU)."""

    engine = "onnxruntime"

    def __init__(self, model: str | Path | bytes | onnx.ModelProto, tensors: Mapping[str, str],
                 graph: OnnxGraph | None = None):
        self.graph = graph or OnnxGraph.load(model)
        self.tensors = dict(tensors)

    def layer_names(self) -> list[str]:
        return list(self.tensors)

    def run(self, feeds: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        names = list(dict.fromkeys(self.tensors.values()))
        if not names:
            return {}
        runner = OnnxRuntimeRunner(self.graph.model, output_names=names, name="onnx-layers")
        with runner:
            got = runner.infer_batches(feeds)
        return {layer: got[t] for layer, t in self.tensors.items()}


def make_torch_probe(runner_or_module, layers: Any = True) -> LayerProbe:
    """A probe from ``True`` (the module's blocks), a list of names, or a probe (returned as is)."""
    if hasattr(layers, "run") and hasattr(layers, "layer_names"):
        return layers
    module = getattr(runner_or_module, "module", runner_or_module)
    if not hasattr(module, "named_modules"):
        raise TypeError(f"per-layer capture needs a torch module, got {type(module).__name__}")
    return TorchLayerProbe(module, None if layers is True else list(layers))


# --- matching torch layers to ONNX tensors ---------------------------------------------------------
def map_layers_to_onnx(
    graph: OnnxGraph,
    layers: Sequence[str],
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, str]:
    """Torch module name → ONNX tensor via node scopes (layers that cannot be found are left out)."""
    out = {}
    for name in layers:
        t = graph.scope_output(name, (shapes or {}).get(name))
        if t is not None:
            out[name] = t
    return out


def _map_by_value(graph: OnnxGraph, layers: Sequence[str], reference: Mapping[str, np.ndarray],
                  feed: Mapping[str, np.ndarray], max_rel: float = 1e-3) -> dict[str, str]:
    """Find, for each layer, the ONNX tensor closest to the torch reference activation.

    Used when node names carry no scope. Candidates have the layer's shape; picks are in topological
    order; a candidate is accepted only when its relative error is below ``max_rel``.
    """
    n = feed_size(feed)
    cands: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        if node.op_type in ("Constant", "Identity", "Shape", "QuantizeLinear"):
            continue
        for o in node.output:
            shp = graph.shape(o)
            if not o or shp is None or not graph.is_float(o):
                continue
            if any(_shape_ok(shp, (n, *np.shape(reference[l])[1:])) for l in layers if l in reference):
                cands[o] = i
    if not cands:
        return {}
    names = list(cands)
    values = OnnxLayerProbe(graph.model, {c: c for c in names}, graph).run([feed])
    out: dict[str, str] = {}
    last = -1
    for layer in layers:
        if layer not in reference:
            continue
        ref = np.asarray(reference[layer][:n], dtype=np.float64)
        scale = max(float(np.abs(ref).max()), 1e-12)
        best, best_err = None, math.inf
        for c in names:
            if cands[c] <= last or values[c].shape != ref.shape:
                continue
            err = float(np.abs(values[c] - ref).max()) / scale
            if err < best_err:
                best, best_err = c, err
        if best is not None and best_err <= max_rel:
            out[layer] = best
            last = cands[best]
    return out


def _shapes(acts: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(np.shape(v)) for k, v in acts.items()}


def _as_budget(budget: LayerBudget | Tolerance | None, tolerance: Tolerance | None) -> LayerBudget:
    if isinstance(budget, LayerBudget):
        return budget
    if isinstance(budget, Tolerance):
        return LayerBudget.from_tolerance(budget)
    return LayerBudget.from_tolerance(tolerance)


def _onnx_mapping(graph: OnnxGraph, names: Sequence[str], ref: Mapping[str, np.ndarray], feeds,
                  hint: Mapping[str, str] | None, mapping_model, notes: list[str]) -> tuple[dict[str, str], str]:
    """Layer → tensor in ``graph``: by scope; else by the tensor names of ``hint`` (an earlier
    model's mapping); else by value (against ``mapping_model`` when given, else this graph)."""
    n0 = feed_size(feeds[0])
    shapes = {k: (n0, *np.shape(v)[1:]) for k, v in ref.items()}
    mapping = map_layers_to_onnx(graph, names, shapes) if graph.has_scopes else {}
    method = "scope"
    if len(mapping) < len(names) and hint:
        known = {o for n in graph.nodes for o in n.output}
        extra = {k: graph.follow_qdq(t) for k, t in hint.items() if k not in mapping and t in known}
        if extra:
            mapping.update(extra)
            method = "scope" if graph.has_scopes else "name"
    if not mapping:
        method = "value"
        notes.append("node names carry no module scope; ONNX tensors matched to torch layers by value")
        base = OnnxGraph.load(mapping_model) if mapping_model is not None else graph
        mapping = _map_by_value(base, names, ref, feeds[0])
        if base is not graph:
            known = {o for n in graph.nodes for o in n.output}
            mapping = {k: graph.follow_qdq(t) for k, t in mapping.items() if t in known}
    return {k: mapping[k] for k in names if k in mapping}, method


def localize_layers(
    torch_module,
    feeds: Sequence[Mapping[str, np.ndarray]],
    candidate: Any,
    *,
    layers: Sequence[str] | None = None,
    tolerance: Tolerance | None = None,
    budget: LayerBudget | Tolerance | None = None,
    reference_layers: Mapping[str, np.ndarray] | None = None,
    mapping_model: str | Path | onnx.ModelProto | None = None,
    max_batches: int = 1,
) -> LayerReport:
    """Per-layer comparison of candidate model(s) with the untouched torch model.

    Args:
        torch_module: the untouched model: its blocks name the layers, and its hooks give the
            reference activations unless ``reference_layers`` is given (then it may be None).
        feeds: parity batches; the first ``max_batches`` are used (with ``reference_layers`` they
            must be the batches those were captured on: ``GoldenReference.feeds``).
        candidate: an ONNX model (path, bytes, ModelProto) or a torch module (a pass's output), or
            an ordered mapping label → model (``{"fp32": fp32_path, "int8": int8_path}``): every
            one is compared, the *last* is the report's subject and the others' cosine/SNR per
            layer go to ``LayerResult.others``.
        layers: module names to compare (default: the repeated blocks).
        tolerance: the stage's tolerance; it becomes the per-layer budget unless ``budget`` is given.
        budget: a :class:`LayerBudget` (or a Tolerance, converted).
        reference_layers: activations captured before any pass (``GoldenReference.layers``).
        mapping_model: an FP32 ONNX export matched by value when a candidate's node names carry no
            module scope (the candidate then reuses its tensor names).
        max_batches: how many batches to compare.
    Returns:
        The :class:`LayerReport` of the (last) candidate; ``first_divergence`` names the first
        module outside the budget.
    """
    feeds = list(feeds)[: max(1, max_batches)]
    nref = sum(feed_size(f) for f in feeds)
    if reference_layers:
        names = list(layers) if layers is not None else list(reference_layers)
        ref = {k: np.asarray(reference_layers[k])[:nref] for k in names if k in reference_layers}
    else:
        names = list(layers) if layers is not None else block_names(torch_module)
        ref = TorchLayerProbe(torch_module, names).run(feeds)
    budget = _as_budget(budget, tolerance)
    cands = dict(candidate) if isinstance(candidate, Mapping) else {"candidate": candidate}
    reports: dict[str, LayerReport] = {}
    hint: dict[str, str] | None = None
    for label, model in cands.items():
        notes: list[str] = []
        if not names:
            notes.append("no repeated blocks found in the torch model; pass layer names explicitly")
        if hasattr(model, "named_modules"):
            cand = TorchLayerProbe(model, names).run(feeds)
            reports[label] = compare_layers(ref, cand, names, budget, tensors={n: n for n in names},
                                            method="module", notes=notes)
            continue
        graph = OnnxGraph.load(model)
        mapping, method = _onnx_mapping(graph, names, ref, feeds, hint, mapping_model, notes)
        missing = [n for n in names if n not in mapping]
        if missing:
            notes.append(f"no ONNX tensor found for {len(missing)} layer(s): {', '.join(missing[:5])}")
        cand = OnnxLayerProbe(graph.model, mapping, graph).run(feeds) if mapping else {}
        reports[label] = compare_layers(ref, cand, list(mapping), budget, tensors=mapping, method=method, notes=notes)
        hint = mapping
    labels = list(reports)
    main = reports[labels[-1]]
    main.candidates = labels
    if len(labels) > 1:
        for r in main.layers:
            for label in labels[:-1]:
                other = reports[label].get(r.name)
                if other is not None:
                    r.others[label] = {"cosine_min": other.cosine_min, "snr_db": other.snr_db,
                                       "ch_cosine_min": other.ch_cosine_min, "ch_snr_db": other.ch_snr_db,
                                       "rel_err": other.rel_err, "passed": float(other.passed)}
        for label in labels[:-1]:
            fd = reports[label].first_divergence
            if fd is not None:
                main.notes.append(f"{label}: first divergence at {fd}")
    return main


def _residual_adds(graph: OnnxGraph) -> list[str]:
    """Outputs of ``Add`` nodes whose two inputs are both computed (not weights or constants)."""
    out = []
    for node in graph.nodes:
        if node.op_type != "Add" or len(node.input) != 2:
            continue
        ok = True
        for x in node.input:
            p = graph.producer.get(x)
            if x in graph.initializers or p is None or graph.nodes[p].op_type in ("Constant", "ConstantOfShape", "Identity"):
                ok = False
        if ok:
            out.append(node.output[0])
    return out


def localize_onnx(
    reference: str | Path | bytes | onnx.ModelProto,
    candidate: str | Path | bytes | onnx.ModelProto,
    feeds: Sequence[Mapping[str, np.ndarray]],
    *,
    layers: Sequence[str] | None = None,
    tolerance: Tolerance | None = None,
    budget: LayerBudget | Tolerance | None = None,
    max_batches: int = 1,
) -> LayerReport:
    """Per-layer comparison of two ONNX models on the same inputs (``vitexport parity --compare``).

    Layers are the block scopes both graphs share (``model.blocks.3``); each side's tensor is the
    output of the last node in that scope, followed through a Q/DQ pair. Without scopes, residual
    ``Add`` outputs present in both graphs under the same name are compared.

    Args:
        reference, candidate: the two models; ``reference`` is the one trusted.
        feeds: parity batches (the first ``max_batches`` are used).
        layers: scopes to compare (default: every block scope of ``reference``).
        tolerance, budget: as for :func:`localize_layers`.
    """
    feeds = list(feeds)[: max(1, max_batches)]
    ga, gb = OnnxGraph.load(reference), OnnxGraph.load(candidate)
    budget = _as_budget(budget, tolerance)
    notes: list[str] = []
    if ga.has_scopes and gb.has_scopes:
        names = list(layers) if layers is not None else block_scopes(ga.module_scopes())
        ma, mb = {}, {}
        for name in names:
            ta = ga.scope_output(name)
            if ta is None:
                continue
            tb = gb.scope_output(name, ga.shape(ta))
            if tb is not None:
                ma[name], mb[name] = ta, tb
        method = "scope"
        if not names:
            notes.append("no repeated block scopes (X.<index>) in the reference graph")
    else:
        method = "name"
        notes.append("node names carry no module scope; residual Add outputs compared by tensor name")
        known_b = {o for n in gb.nodes for o in n.output}
        names = [t for t in _residual_adds(ga) if t in known_b] if layers is None else list(layers)
        ma = {t: t for t in names}
        mb = {t: gb.follow_qdq(t) for t in names}
    missing = [n for n in names if n not in mb]
    if missing:
        notes.append(f"{len(missing)} layer(s) not found in both graphs: {', '.join(missing[:5])}")
    ref = OnnxLayerProbe(ga.model, ma, ga).run(feeds) if ma else {}
    cand = OnnxLayerProbe(gb.model, mb, gb).run(feeds) if mb else {}
    return compare_layers(ref, cand, [n for n in names if n in mb], budget, tensors=mb, method=method, notes=notes)
