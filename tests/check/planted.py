"""Small graphs, each clean or breaking rules on purpose: ``linear`` is x → Q/DQ → MatMul(DQ(int8
weight)) → y, the layout vitexport writes for TensorRT, with knobs that plant one fault each."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["linear", "single_op", "save"]

_NP = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}


def _model(nodes, inputs, outputs, inits, opset: int) -> onnx.ModelProto:
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9 if opset >= 19 else 8
    return m


def linear(*, opset: int = 17, dtype: int = TensorProto.FLOAT, zero_point: int = 0, zp_dtype=np.int8,
           weight_axis: int | None = 1, act_channels: bool = False, act_scale: float = 0.05,
           consumer: str = "MatMul", batch: int | str = 1) -> onnx.ModelProto:
    """x[batch,4,8] → Q/DQ 'act' → MatMul 'mm' with DQ 'w_dq' of an int8 [8,6] weight → y[batch,4,6].

    Args:
        weight_axis: the weight DQ's per-channel axis (None: per tensor); 1 is right for MatMul.
        act_channels: a per-channel activation scale (8 entries along axis 2).
        consumer: the op the activation DQ feeds ('Add' plants a DQ into a residual Add).
    """
    f = _NP[dtype]
    act_s = np.full(8, act_scale, f) if act_channels else np.asarray(act_scale, f)
    zp = np.full(act_s.shape, zero_point, zp_dtype)
    w = np.random.default_rng(0).integers(-127, 128, (8, 6)).astype(np.int8)
    chans = 6 if weight_axis in (1, -1) else 8
    w_s = np.full(chans, 0.02, f) if weight_axis is not None else np.asarray(0.02, f)
    inits = [numpy_helper.from_array(a, n) for a, n in
             ((act_s, "act_s"), (zp, "act_zp"), (w, "w_q"), (w_s, "w_s"), (np.zeros(w_s.shape, np.int8), "w_zp"))]
    axis = {"axis": weight_axis} if weight_axis is not None else {}
    act_axis = {"axis": 2} if act_channels else {}
    nodes = [helper.make_node("QuantizeLinear", ["x", "act_s", "act_zp"], ["x_q"], name="act_q", **act_axis),
             helper.make_node("DequantizeLinear", ["x_q", "act_s", "act_zp"], ["x_dq"], name="act_dq", **act_axis),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["w"], name="w_dq", **axis)]
    if consumer == "Add":
        nodes += [helper.make_node("Add", ["x_dq", "x"], ["r"], name="residual"),
                  helper.make_node("MatMul", ["r", "w"], ["y"], name="mm")]
    else:
        nodes.append(helper.make_node("MatMul", ["x_dq", "w"], ["y"], name="mm"))
    x = helper.make_tensor_value_info("x", dtype, [batch, 4, 8])
    y = helper.make_tensor_value_info("y", dtype, [batch, 4, 6])
    return _model(nodes, [x], [y], inits, opset)


def single_op(op: str, *, opset: int = 17, dtype: int = TensorProto.FLOAT, shape=(1, 4, 4), n_inputs: int = 1,
              **attrs) -> onnx.ModelProto:
    """One node 'the_<op>' on input x (used ``n_inputs`` times), output y of x's shape."""
    node = helper.make_node(op, ["x"] * n_inputs, ["y"], name=f"the_{op.lower()}", **attrs)
    out_shape = shape[:-2] if op == "Det" else shape
    return _model([node], [helper.make_tensor_value_info("x", dtype, list(shape))],
                  [helper.make_tensor_value_info("y", dtype, list(out_shape))], [], opset)


def save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)
