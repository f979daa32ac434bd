"""Forms of a laid-out file that RKNN 2.5.0 compiles where the file as laid out crashed its build (a retry pass).

Found on EfficientViT-M0 (timm; its cascaded group attention), whose laid-out file crashed RKNN twice over, by
compiling cuts of it (docs/targets.md):

* ``rknn::RKNNSubgraphManager`` SIGSEGV where an attention's output, computed in float16 (RKNN fuses the float
  MatMuls into ``exSDPAttention``) and reshaped to a feature map, is read by an INT8 Conv (through Relu and a Q/DQ).
  A float16 depthwise 1x1 Conv with unit weights and no bias after that Reshape (an identity) compiles. Splitting
  the reader Conv across heads, a Q/DQ before the Reshape, a Relu before it or a ``Mul`` by 1 did not.
* then OpEmit SIGSEGV on the residual ``x + DWConv(x)`` after the attention block: the Add read ``x`` in float
  while the depthwise Conv read its Q/DQ. The Add reading the same Q/DQ'd ``x`` as the Conv compiles.

Both are rewritten only after a crash (:class:`~.stages.CompileRknnStage` compiles again once): a file RKNN
compiles is never changed by them. The identity changes no value; the residual then adds the INT8 ``x`` the Conv
reads, which the build_engine gate measures like everything RKNN runs.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ...graph.passes import GraphPass, GraphPassReport
from ...graph.query import attr, static_shape

__all__ = ["CrashForms"]


def _dq_input(node: ir.Node, i: int) -> bool:
    v = node.inputs[i]
    return v is not None and v.producer() is not None and v.producer().op_type == "DequantizeLinear"


def _float_attention_maps(model: ir.Model) -> list[ir.Node]:
    """Reshapes to a 4-D map of a MatMul neither of whose inputs is dequantized (an attention RKNN runs in float16)."""
    found = []
    for node in model.graph:
        if node.op_type != "MatMul" or _dq_input(node, 0) or _dq_input(node, 1):
            continue
        uses = list(node.outputs[0].uses())
        if len(uses) == 1 and uses[0][0].op_type == "Reshape":
            shape = static_shape(uses[0][0].outputs[0])
            if shape is not None and len(shape) == 4:
                found.append(uses[0][0])
    return found


def _identity_after(model: ir.Model, reshape: ir.Node) -> None:
    out = reshape.outputs[0]
    channels = static_shape(out)[1]
    name = f"{reshape.name}_rknn_identity"
    weight = ir.Value(name=f"{name}_w", const_value=ir.tensor(np.ones((channels, 1, 1, 1), np.float32), name=f"{name}_w"))
    bias = ir.Value(name=f"{name}_b", const_value=ir.tensor(np.zeros((channels,), np.float32), name=f"{name}_b"))
    model.graph.register_initializer(weight)
    model.graph.register_initializer(bias)
    conv = ir.node("Conv", [None, weight, bias], {"group": channels, "kernel_shape": [1, 1]}, name=name)
    conv.outputs[0].name, conv.outputs[0].dtype, conv.outputs[0].shape = f"{out.name}_identity", out.dtype, out.shape
    ir.convenience.replace_all_uses_with(out, conv.outputs[0])
    conv.replace_input_with(0, out)
    model.graph.insert_after(reshape, conv)


def _depthwise_residual(add: ir.Node) -> tuple[int, ir.Value] | None:
    """(which input is ``x``, the Q/DQ'd ``x``) for ``x + DQ(Q(DWConv(DQ(Q(x)))))``, else None."""
    for i in (0, 1):
        x, y = add.inputs[i], add.inputs[1 - i]
        dq = y.producer() if y is not None else None
        q = dq.inputs[0].producer() if dq is not None and dq.op_type == "DequantizeLinear" else None
        conv = q.inputs[0].producer() if q is not None and q.op_type == "QuantizeLinear" else None
        if conv is None or conv.op_type != "Conv" or attr(conv, "group", 1) <= 1:
            continue
        x_dq = conv.inputs[0].producer()
        x_q = x_dq.inputs[0].producer() if x_dq is not None and x_dq.op_type == "DequantizeLinear" else None
        if x_q is not None and x_q.op_type == "QuantizeLinear" and x_q.inputs[0] is x:
            return i, x_dq.outputs[0]
    return None


class CrashForms(GraphPass):
    """A float16 identity after each float attention's feature map, and each ``x + DWConv(x)`` adding the
    Q/DQ'd ``x`` its Conv reads (module docstring)."""

    name = "rknn_crash_forms"

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        for reshape in _float_attention_maps(model):
            _identity_after(model, reshape)
            report.skipped[f"{reshape.name}_rknn_identity"] = ("a float16 identity after a float attention's feature "
                                                              "map: RKNN 2.5.0 crashed on the file without it")
            report.changed += 1
        for add in [n for n in model.graph if n.op_type == "Add"]:
            found = _depthwise_residual(add)
            if found is not None:
                add.replace_input_with(found[0], found[1])
                report.changed += 1
