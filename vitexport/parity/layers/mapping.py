"""Torch layer → ONNX tensor: by node scope, by an earlier model's tensor names, or by value against the
torch reference when node names carry no scope.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from ...runners.base import feed_size
from ..onnx_graph import OnnxGraph, _shape_ok
from .probes import OnnxLayerProbe

__all__ = ['map_layers_to_onnx', 'onnx_mapping']


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


def onnx_mapping(graph: OnnxGraph, names: Sequence[str], ref: Mapping[str, np.ndarray], feeds,
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
