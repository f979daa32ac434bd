"""The last pass before a model becomes a file (:func:`vitexport.graph.save_model` runs it on
every artifact): onnx-ir's own passes, in order.

1. ``RemoveUnusedNodesPass``: nodes whose outputs reach no graph output, then initializers no node
   reads (the Q/DQ scales of activations that stayed float were 49 of 292 initializers of a small
   ViT's INT8 file; ONNX Runtime printed a warning line for each when it loaded it);
2. ``RemoveUnusedFunctionsPass`` / ``RemoveUnusedOpsetsPass``: functions and opset imports nothing uses;
3. ``NameFixPass``: unique node and value names, a name for every node (``<Op>_<first output>``, so
   TensorRT's layer names and per-layer precision settings can address it);
4. ``TopologicalSortPass`` (stable: a sorted graph keeps its order);
5. ``ShapeInferencePass``: every intermediate tensor's type and shape as ``value_info`` (onnx-ir
   writes value_info only for tensors the graph holds, so none is left dangling).

**Graph inputs are the model's interface and are never removed**, even one no node reads (a text
encoder that ignores its ``attention_mask``): users feed the torch model, the FP32 file and the INT8
file the same inputs, and TensorRT keeps an unused input too ("unused ... but is not being
removed"). Such inputs are reported (:func:`unused_inputs`) and ``vitexport check`` warns about them.
Every step is deterministic: a model saved twice is written byte for byte the same.
"""
from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes import common as onnx_ir_passes
from onnx_ir.passes.common.naming import SimpleNameGenerator

from .passes import GraphPass, GraphPassReport

__all__ = ["CleanPass", "clean_model", "unused_inputs"]


class _NodeNames(SimpleNameGenerator):
    """A nameless node is named after its op and first output (Polygraphy names one by its index,
    which changes with every edit above it)."""

    def generate_node_name(self, node: ir.Node) -> str:
        if node.name:
            return node.name
        first = node.outputs[0].name if node.outputs and node.outputs[0].name else "out"
        return f"{node.op_type}_{first}"


def unused_inputs(model: ir.Model) -> list[str]:
    """The graph inputs no node reads and no graph output is (in input order)."""
    outputs = set(model.graph.outputs)
    return [v.name or "" for v in model.graph.inputs if not v.uses() and v not in outputs]


class CleanPass(GraphPass):
    """Remove what no output needs, name and sort the nodes, infer shapes (module docstring)."""

    name = "clean"

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        g = model.graph
        nodes, inits, named = g.num_nodes(), len(g.initializers), sum(1 for n in g if n.name)
        onnx_ir_passes.RemoveUnusedNodesPass()(model)
        onnx_ir_passes.RemoveUnusedFunctionsPass()(model)
        onnx_ir_passes.RemoveUnusedOpsetsPass()(model)
        dead_nodes, dead_inits = nodes - g.num_nodes(), inits - len(g.initializers)
        renamed = onnx_ir_passes.NameFixPass(_NodeNames())(model).modified
        sorted_ = onnx_ir_passes.TopologicalSortPass()(model).modified
        _infer_shapes(model)
        report.changed = dead_nodes + dead_inits + int(renamed) + int(sorted_)
        report.notes += [f"{k}: {v}" for k, v in (("unused nodes removed", dead_nodes),
                                                  ("unused initializers removed", dead_inits),
                                                  ("nodes named", (g.num_nodes() - named) if renamed else 0)) if v]
        if sorted_:
            report.notes.append("nodes sorted topologically")
        report.skipped.update({f"input '{name}'": "no node reads it; kept: inputs are the model's interface"
                               for name in unused_inputs(model)})


def _unproven(shape: ir.Shape | None) -> bool:
    return shape is not None and any(isinstance(d, ir.SymbolicDim) and (d.value or "unk__").startswith("unk__")
                                     for d in shape)


def _infer_shapes(model: ir.Model) -> None:
    """Shapes by ONNX shape inference, keeping only what it proved: a dimension it could not resolve
    (``unk__N``: an exported ``cls_token.expand(B, -1, -1)`` goes through Where, which data
    propagation does not follow) is not written as a made-up symbol, so a static graph never looks
    dynamic in its value_info."""
    values = [v for n in ir.traversal.RecursiveGraphIterator(model.graph) for v in n.outputs]
    before = {v: v.shape for v in values}
    weights = list(model.graph.initializers.values())
    # not strict: a custom-domain op without a schema leaves its outputs' shapes unknown, not the
    # whole graph's; data propagation resolves the shape arithmetic of an exported Reshape
    onnx_ir_passes.ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(model)
    for v, shape in before.items():
        if v.shape is not shape and _unproven(v.shape) and not v.is_graph_output():
            v.shape = shape
    if list(model.graph.initializers.values()) != weights:  # onnx-ir's C-API bridge re-adds large ones last
        model.graph.initializers.clear()
        for v in weights:
            model.graph.register_initializer(v)


def clean_model(model: ir.Model) -> GraphPassReport:
    """Run :class:`CleanPass` on ``model`` in place and return its report."""
    return CleanPass()(model).report
