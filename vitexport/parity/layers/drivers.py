"""The two localisation drivers: a candidate (ONNX or torch) against the untouched torch model
(:func:`localize_layers`), and ONNX against ONNX (:func:`localize_onnx`, ``vitexport parity --compare``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from ...recipe import Tolerance
from ...runners.base import feed_size
from ..onnx_graph import OnnxGraph, block_scopes
from .mapping import onnx_mapping
from .probes import OnnxLayerProbe, TorchLayerProbe, block_names
from .stats import LayerBudget, LayerReport, compare_layers

__all__ = ['localize_layers', 'localize_onnx']


def _as_budget(budget: LayerBudget | Tolerance | None, tolerance: Tolerance | None) -> LayerBudget:
    if isinstance(budget, LayerBudget):
        return budget
    if isinstance(budget, Tolerance):
        return LayerBudget.from_tolerance(budget)
    return LayerBudget.from_tolerance(tolerance)


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
        mapping, method = onnx_mapping(graph, names, ref, feeds, hint, mapping_model, notes)
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
