"""Small graphs, each clean or breaking rules on purpose: ``linear`` is x → Q/DQ → MatMul(DQ(int8
weight)) → y, the layout vitexport writes for TensorRT, with knobs that plant one fault each."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["linear", "single_op", "save", "plant_unused_initializer", "plant_nameless_node", "plant"]

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


def plant_unused_initializer(m: onnx.ModelProto, name: str = "stale_scale") -> onnx.ModelProto:
    """Add an initializer no node reads (what an INT8 file held for every activation left float)."""
    m.graph.initializer.append(numpy_helper.from_array(np.float32(0.05), name))
    return m


def plant_nameless_node(m: onnx.ModelProto) -> onnx.ModelProto:
    """Route the graph output through a nameless Identity writing 'y_out' (the output is renamed)."""
    out = m.graph.output[0]
    m.graph.node.append(helper.make_node("Identity", [out.name], ["y_out"]))
    out.name = "y_out"
    return m


def plant(fault: str, m: onnx.ModelProto) -> onnx.ModelProto:
    """One lint fault in ``m`` (a :func:`linear` graph): see the cases in test_lint.py."""
    g = m.graph
    if fault == "dead_node":
        g.node.append(helper.make_node("Relu", ["x"], ["x_relu"], name="orphan_relu"))
    elif fault == "dead_value_info":
        g.value_info.append(helper.make_tensor_value_info("removed_tensor", TensorProto.FLOAT, [3]))
    elif fault == "unused_input":
        g.input.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, 4]))
    elif fault == "duplicate_node_name":
        g.node[2].name = "act_q"  # the weight DQ takes the activation Q's name
    elif fault == "input_shadows_initializer":
        g.input.append(helper.make_tensor_value_info("w_q", TensorProto.INT8, [8, 6]))
    elif fault == "float64":
        g.initializer.append(numpy_helper.from_array(np.ones((1, 4, 6), np.float64), "offset64"))
        g.node.extend([helper.make_node("Cast", ["y_mm"], ["y64"], name="to_double", to=TensorProto.DOUBLE),
                       helper.make_node("Add", ["y64", "offset64"], ["y_sum"], name="add64"),
                       helper.make_node("Cast", ["y_sum"], ["y"], name="to_float", to=TensorProto.FLOAT)])
        next(n for n in g.node if n.name == "mm").output[0] = "y_mm"
    elif fault == "requantize":  # DQ(act) -> Reshape -> Q/DQ on the same grid -> MatMul
        g.initializer.append(numpy_helper.from_array(np.asarray([1, 4, 8], np.int64), "same_shape"))
        nodes = list(g.node)
        nodes[-1:-1] = [helper.make_node("Reshape", ["x_dq", "same_shape"], ["x_r"], name="reshape"),
                        helper.make_node("QuantizeLinear", ["x_r", "act_s", "act_zp"], ["x_rq"], name="again_q"),
                        helper.make_node("DequantizeLinear", ["x_rq", "act_s", "act_zp"], ["x_rdq"], name="again_dq")]
        nodes[-1].input[0] = "x_rdq"  # mm
        del g.node[:]
        g.node.extend(nodes)
    elif fault == "qdq_output":  # the output itself fake-quantized
        next(n for n in g.node if n.name == "mm").output[0] = "y_mm"
        g.node.extend([helper.make_node("QuantizeLinear", ["y_mm", "act_s", "act_zp"], ["y_q"], name="out_q"),
                       helper.make_node("DequantizeLinear", ["y_q", "act_s", "act_zp"], ["y"], name="out_dq")])
    else:
        raise ValueError(fault)
    return m
