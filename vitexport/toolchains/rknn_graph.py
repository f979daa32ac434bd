"""ONNX layouts rknn-toolkit2 2.5.0 compiles, and runs in INT8 (measured with its x86 simulator).

- :class:`FullShapeMasks`: a ``Where`` mask whose condition broadcasts (``bool[1,1,1,N]`` against
  ``[B,H,N,N]`` scores) crashes RKNN's compiler (SIGSEGV in ``RKNNSubgraphManager``, which fuses
  ``Where → Softmax`` into a masked softmax), whatever the fill. The same mask written full-shape
  builds and is exact in FP16. Fills below −3e38 are rewritten by RKNN to −10000, so the pass writes
  −10000 itself (the file then says what runs). An *additive* mask builds too (RKNN fuses it into its
  ``exSDPAttention``) but RKNN's INT8 quantizer calibrates it like data (demo: cosine −0.29).
- :class:`LinearsAsConv`: RKNN runs a Q/DQ (QAT) file's op in INT8 only when a DequantizeLinear feeds
  the op directly and its output is Q/DQ'd too. A ``MatMul`` Linear never qualifies: RKNN turns it into
  a 1x1 ``Conv`` behind a Transpose it inserts *after* the DQ, so the Conv reads float16 (the QDQ demo
  ran 4 % of its GEMM MACs in INT8). Written as ``Transpose → Q/DQ → Conv 1x1 (weights [Cout,Cin,1,1],
  per-channel axis 0) → Q/DQ → Transpose``, the same Linear runs INT8 (``ConvRelu INT8`` in RKNN's op
  table). The output Q/DQ takes a range measured on calibration data (:func:`output_ranges`).
- :func:`rknn_hazards`: the patterns above, found before RKNN sees the file, one line per node with
  the rule (so a crash names the node, not only the compiler pass).
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as ir_common

from ..graph.passes import GraphPass, GraphPassReport
from ..graph.query import const_array, static_shape

__all__ = ["FullShapeMasks", "LinearsAsConv", "PatchConvsAs1x1", "patch_convs", "OutputQdq", "ConvsInFloat", "rknn_hazards", "linear_sites", "unquantized_outputs",
           "output_ranges", "activation_zp_dtype", "RKNN_FILL", "LinearSite"]

#: what RKNN writes for a fill below −3e38 ("corrected to -10000"); exp(−10000 − max) is 0 in FP32 and
#: FP16 alike, and −10000 is exact in FP16 (largest finite 65504)
RKNN_FILL = -10000.0
_FILL_LIMIT = -3e38


def _init(model: ir.Model, name: str, arr: np.ndarray) -> ir.Value:
    """A new initializer holding ``arr`` (the name made unique)."""
    base, k = name, 0
    while name in model.graph.initializers:
        k += 1
        name = f"{base}_{k}"
    v = ir.Value(name=name, const_value=ir.tensor(arr, name=name), shape=ir.Shape(arr.shape),
                 type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)))
    model.graph.register_initializer(v)
    return v


def _set_const(model: ir.Model, node: ir.Node, idx: int, arr: np.ndarray, name: str) -> None:
    """Feed ``node`` input ``idx`` a new initializer holding ``arr`` (other readers keep the old one)."""
    node.replace_input_with(idx, _init(model, name, arr))


class FullShapeMasks(GraphPass):
    """``Where`` conditions at the full shape of the scores (a constant one rewritten, one computed at
    run time expanded by an ``Expand``); fills below −3e38 as −10000 (see the module docstring)."""

    name = "rknn_full_shape_masks"

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        _infer_shapes(model)  # the scores' shape decides the mask's
        for node in list(model.graph):
            if node.op_type != "Where":
                continue
            cond, x, fill = node.inputs
            shape, cshape = static_shape(x), static_shape(cond)
            carr, farr = const_array(cond), const_array(fill)
            if shape is None or cshape is None:
                report.skipped[node.name] = "scores or condition without a static shape"
                continue
            changed = False
            full = np.broadcast_shapes(cshape, shape, farr.shape if farr is not None else ())
            if tuple(cshape) != full and carr is not None:
                _set_const(model, node, 0, np.ascontiguousarray(np.broadcast_to(carr, full)), f"{cond.name}_full")
                changed = True
            elif tuple(cshape) != full:  # computed at run time (a padding mask from an input): Expand it
                expand = ir.node("Expand", [cond, _init(model, f"{node.name}_mask_shape", np.array(full, np.int64))],
                                 name=f"{node.name}_mask_Expand")
                expand.outputs[0].shape, expand.outputs[0].dtype = ir.Shape(full), cond.dtype
                model.graph.insert_before(node, [expand])
                node.replace_input_with(0, expand.outputs[0])
                changed = True
            if farr is not None and farr.size == 1 and float(farr.reshape(-1)[0]) < _FILL_LIMIT:
                _set_const(model, node, 2, np.array(RKNN_FILL, farr.dtype).reshape(farr.shape), f"{fill.name}_rknn")
                changed = True
            report.changed += changed


def _infer_shapes(model: ir.Model) -> None:
    """Static shapes on every value (the rewrites need them); a no-op when the file carries them."""
    if any(o.shape is None for n in model.graph for o in n.outputs):
        ir_common.ShapeInferencePass(strict_mode=False)(model)


def rknn_hazards(model: ir.Model) -> list[str]:
    """Patterns rknn-toolkit2 2.5.0 crashes on, hangs on or silently miscomputes, one line per node."""
    _infer_shapes(model)
    out = []
    for node in model.graph:
        if node.op_type == "Where":
            c, x = const_array(node.inputs[0]), static_shape(node.inputs[1])
            cshape = c.shape if c is not None else static_shape(node.inputs[0])
            if cshape is not None and x is not None and tuple(cshape) != tuple(np.broadcast_shapes(cshape, x)):
                out.append(f"node {node.name}: Where condition {list(cshape)} broadcasts to {list(x)}: RKNN's "
                           "masked-softmax fusion segfaults (RKNNSubgraphManager); write it full-shape")
        elif node.op_type == "Gemm" and any(i is not None and i.producer() is not None
                                            and i.producer().op_type == "DequantizeLinear" for i in node.inputs[:1]):
            out.append(f"node {node.name}: Gemm on a 2-D Q/DQ input: RKNN's graph optimizer loops "
                       "(fuse_two_reshape) and never finishes; write the Linear as a 1x1 Conv")
    return out


class LinearSite:
    """A quantized Linear: ``MatMul(DQ(x), DQ(W))`` with an optional constant bias ``Add`` after it, or
    ``Gemm(DQ(x), DQ(W), bias)`` (``transB``: W stored [Cout, Cin])."""

    def __init__(self, matmul: ir.Node, bias_add: ir.Node | None, x_dq: ir.Node, w_dq: ir.Node):
        self.matmul, self.bias_add, self.x_dq, self.w_dq = matmul, bias_add, x_dq, w_dq

    @property
    def output(self) -> ir.Value:
        return (self.bias_add or self.matmul).outputs[0]

    @property
    def weight_out_in(self) -> bool:
        """The weight is stored [Cout, Cin] (a Gemm with transB=1)."""
        attrs = self.matmul.attributes
        return self.matmul.op_type == "Gemm" and attrs.get("transB") is not None and attrs["transB"].as_int() == 1

    def bias(self) -> np.ndarray | None:
        if self.matmul.op_type == "Gemm":
            return const_array(self.matmul.inputs[2]) if len(self.matmul.inputs) > 2 else None
        if self.bias_add is None:
            return None
        a = self.bias_add.inputs
        return const_array(a[1] if a[0] is self.matmul.outputs[0] else a[0])


def _producer(value: ir.Value | None, op: str) -> ir.Node | None:
    p = value.producer() if value is not None else None
    return p if p is not None and p.op_type == op else None


def _bias_add(node: ir.Node) -> ir.Node | None:
    uses = list(node.outputs[0].uses())
    add = uses[0][0] if len(uses) == 1 and uses[0][0].op_type == "Add" else None
    if add is None:
        return None
    other = add.inputs[1] if add.inputs[0] is node.outputs[0] else add.inputs[0]
    b = const_array(other)
    return add if b is not None and b.ndim == 1 else None


def _plain_gemm(node: ir.Node) -> bool:
    a = node.attributes
    return all(a.get(k) is None or a[k].as_float() == 1.0 for k in ("alpha", "beta")) and (
        a.get("transA") is None or a["transA"].as_int() == 0)


def linear_sites(model: ir.Model) -> list[LinearSite]:
    """Every MatMul / Gemm whose activation and constant 2-D weight both come through DequantizeLinear."""
    _infer_shapes(model)
    sites = []
    for node in model.graph:
        if node.op_type not in ("MatMul", "Gemm") or (node.op_type == "Gemm" and not _plain_gemm(node)):
            continue
        x_dq, w_dq = _producer(node.inputs[0], "DequantizeLinear"), _producer(node.inputs[1], "DequantizeLinear")
        if x_dq is None or w_dq is None or const_array(w_dq.inputs[0]) is None:
            continue
        if const_array(w_dq.inputs[0]).ndim != 2 or static_shape(node.inputs[0]) is None:
            continue
        sites.append(LinearSite(node, _bias_add(node) if node.op_type == "MatMul" else None, x_dq, w_dq))
    return sites


def unquantized_outputs(model: ir.Model) -> list[ir.Value]:
    """Outputs of Conv and activation x activation MatMul nodes whose inputs are all Q/DQ'd but whose
    output (after a constant bias Add) is not: RKNN runs such an op in float16."""
    out = []
    for node in model.graph:
        if node.op_type not in ("Conv", "MatMul"):
            continue
        data = node.inputs[:2]
        if not all(_producer(v, "DequantizeLinear") is not None for v in data):
            continue
        if node.op_type == "MatMul" and const_array(_producer(data[1], "DequantizeLinear").inputs[0]) is not None:
            continue  # a Linear: LinearsAsConv's
        add = _bias_add(node)
        value = (add or node).outputs[0]
        uses = list(value.uses())
        if uses and all(u[0].op_type == "QuantizeLinear" for u in uses):
            continue
        out.append(value)
    return out


def _qparams(lo: float, hi: float, zp_dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Scale and zero point of a range in the activation encoding the file already uses."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if np.dtype(zp_dtype) == np.uint8:
        scale = max(hi - lo, 1e-12) / 255.0
        return np.array(scale, np.float32), np.array(np.clip(round(-lo / scale), 0, 255), np.uint8)
    return np.array(max(-lo, hi, 1e-12) / 127.0, np.float32), np.array(0, np.int8)


def _qdq(model: ir.Model, x: ir.Value, scale: ir.Value, zp: ir.Value, name: str) -> list[ir.Node]:
    q = ir.node("QuantizeLinear", [x, scale, zp], name=f"{name}_Q")
    q.outputs[0].name = f"{name}_quantized"
    dq = ir.node("DequantizeLinear", [q.outputs[0], scale, zp], name=f"{name}_DQ")
    dq.outputs[0].name = f"{name}_dequantized"
    return [q, dq]


class LinearsAsConv(GraphPass):
    """Each quantized ``MatMul`` Linear (+ bias ``Add``) rewritten as a Q/DQ'd 1x1 ``Conv`` on a
    ``[1, Cin, 1, T]`` view with a Q/DQ'd output (see the module docstring).

    Args:
        ranges: Linear output tensor (the bias Add's output, else the MatMul's) → (lo, hi), measured
            on calibration data by :func:`output_ranges`. A site without a range is skipped.
    """

    name = "rknn_linears_as_conv"

    def __init__(self, ranges: Mapping[str, tuple[float, float]]):
        super().__init__()
        self.ranges = ranges

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        for site in linear_sites(model):
            out = site.output
            if out.name not in self.ranges:
                report.skipped[site.matmul.name] = "no output range"
                continue
            q = site.x_dq.inputs[0].producer()
            if q is None or q.op_type != "QuantizeLinear":
                report.skipped[site.matmul.name] = "activation DequantizeLinear not fed by a QuantizeLinear"
                continue
            self._rewrite(model, site, q)
            report.changed += 1
        ir_common.RemoveUnusedNodesPass()(model)

    def _rewrite(self, model: ir.Model, site: LinearSite, q: ir.Node) -> None:
        x, (xs, xz) = q.inputs[0], (q.inputs[1], q.inputs[2])
        xshape, oshape = static_shape(site.matmul.inputs[0]), static_shape(site.output)
        cin, t = xshape[-1], int(np.prod(xshape[:-1]))
        name = site.matmul.name or site.output.name
        nodes = [ir.node("Reshape", [x, _init(model, f"{name}_nc_shape", np.array([1, t, 1, cin], np.int64))],
                         name=f"{name}_nc_Reshape")]
        nodes.append(ir.node("Transpose", [nodes[-1].outputs[0]], attributes={"perm": [0, 3, 2, 1]}, name=f"{name}_nc_Transpose"))
        nodes += _qdq(model, nodes[-1].outputs[0], xs, xz, f"{name}_nc_in")
        w_conv, w_scale, w_zp = self._weights(model, site, name)
        conv_in = [nodes[-1].outputs[0], w_conv]
        bias = site.bias()
        if bias is not None:
            conv_in.append(_init(model, f"{name}_conv_bias", bias.astype(np.float32)))
        conv = ir.node("Conv", conv_in, attributes={"kernel_shape": [1, 1]}, name=f"{name}_Conv")
        nodes.append(conv)
        lo, hi = self.ranges[site.output.name]
        zp_dtype = const_array(xz).dtype if const_array(xz) is not None else np.dtype(np.uint8)
        s, z = _qparams(float(lo), float(hi), zp_dtype)
        nodes += _qdq(model, conv.outputs[0], _init(model, f"{name}_out_scale", s), _init(model, f"{name}_out_zp", z),
                      f"{name}_nc_out")
        nodes.append(ir.node("Transpose", [nodes[-1].outputs[0]], attributes={"perm": [0, 3, 2, 1]}, name=f"{name}_tc_Transpose"))
        nodes.append(ir.node("Reshape", [nodes[-1].outputs[0], _init(model, f"{name}_tc_shape", np.array(oshape, np.int64))],
                             name=f"{name}_tc_Reshape"))
        new_out = nodes[-1].outputs[0]
        new_out.shape, new_out.dtype = ir.Shape(oshape), ir.DataType.FLOAT
        old = site.output
        model.graph.insert_after(site.bias_add or site.matmul, nodes)
        is_output = old.is_graph_output()
        ir.convenience.replace_all_uses_with(old, new_out, replace_graph_outputs=True)
        if is_output:  # the graph output keeps its name
            old_name = old.name
            old.name = f"{old_name}_nc"
            new_out.name = old_name

    @staticmethod
    def _weights(model: ir.Model, site: LinearSite, name: str) -> tuple[ir.Value, ir.Value, ir.Value]:
        """The int8 weight [Cin, Cout] as [Cout, Cin, 1, 1] with its scale per output channel (axis 0)."""
        wq, ws, wz = (const_array(v) for v in site.w_dq.inputs[:3])
        w_oi = wq if site.weight_out_in else wq.T
        cout = w_oi.shape[0]
        w4 = np.ascontiguousarray(w_oi[:, :, None, None])
        ws = np.broadcast_to(np.asarray(ws, np.float32).reshape(-1), (cout,)).copy()
        wz = np.broadcast_to(np.asarray(wz).reshape(-1), (cout,)).astype(wq.dtype)
        vq, vs, vz = (_init(model, f"{name}_conv_w{k}", a) for k, a in (("q", w4), ("s", ws), ("z", wz)))
        dq = ir.node("DequantizeLinear", [vq, vs, vz], attributes={"axis": 0}, name=f"{name}_conv_w_DQ")
        dq.outputs[0].name = f"{name}_conv_w_dequantized"
        model.graph.insert_before(site.matmul, [dq])
        return dq.outputs[0], vs, vz


class OutputQdq(GraphPass):
    """A Q/DQ pair after each tensor of ``ranges`` (from :func:`unquantized_outputs`), in the encoding
    of the file's activations, so that RKNN runs its producer (a Conv, an attention MatMul) in INT8."""

    name = "rknn_output_qdq"

    def __init__(self, ranges: Mapping[str, tuple[float, float]], zp_dtype: np.dtype = np.dtype(np.uint8)):
        super().__init__()
        self.ranges, self.zp_dtype = ranges, np.dtype(zp_dtype)

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        values = ir.convenience.create_value_mapping(model.graph)
        for name, (lo, hi) in self.ranges.items():
            v = values.get(name)
            if v is None or v.producer() is None:
                report.skipped[name] = "not in the graph"
                continue
            s, z = _qparams(float(lo), float(hi), self.zp_dtype)
            nodes = _qdq(model, v, _init(model, f"{name}_out_scale", s), _init(model, f"{name}_out_zp", z), f"{name}_out")
            uses = list(v.uses())
            model.graph.insert_after(v.producer(), nodes)
            for node, idx in uses:
                node.replace_input_with(idx, nodes[-1].outputs[0])
            if v.is_graph_output():
                report.skipped[name] = "a graph output: its readers only were re-pointed"
            report.changed += 1


class ConvsInFloat(GraphPass):
    """Q/DQ taken off every Conv whose output is not Q/DQ'd (its activation reads the float tensor, its
    weight the dequantized values): RKNN 2.5.0 rejects a Q/DQ'd patch-embedding Conv (``KeyError: 'x_dequantized_conv'`` in its
    bias handling for ViT-Tiny's 16x16 stride-16 conv; ``KeyError: '<conv output>_dequantized'`` once its
    output is Q/DQ'd too), so the patch embedding runs in float16 (~2 % of ViT-Tiny's MACs)."""

    name = "rknn_convs_in_float"

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        for node in list(model.graph):
            if node.op_type != "Conv":
                continue
            x_dq, w_dq = _producer(node.inputs[0], "DequantizeLinear"), _producer(node.inputs[1], "DequantizeLinear")
            uses = list(node.outputs[0].uses())
            if (x_dq is None and w_dq is None) or (uses and all(u[0].op_type == "QuantizeLinear" for u in uses)):
                continue  # already float, or already in the INT8 layout (its output Q/DQ'd)
            q = _producer(x_dq.inputs[0], "QuantizeLinear") if x_dq is not None else None
            if x_dq is not None and q is not None:
                node.replace_input_with(0, q.inputs[0])
            if w_dq is not None and const_array(w_dq.inputs[0]) is not None:
                wq, ws, wz = (const_array(v) for v in w_dq.inputs[:3])
                axis = w_dq.attributes["axis"].as_int() if w_dq.attributes.get("axis") is not None else 1
                shape = [1] * wq.ndim
                if np.ndim(ws):
                    shape[axis] = -1
                w = (wq.astype(np.float32) - np.reshape(wz, shape).astype(np.float32)) * np.reshape(ws, shape)
                node.replace_input_with(1, _init(model, f"{node.name}_w_float", w.astype(np.float32)))
            report.changed += 1
        ir_common.RemoveUnusedNodesPass()(model)


def patch_convs(model: ir.Model) -> list[ir.Node]:
    """Q/DQ'd Convs whose kernel equals their stride (a patch embedding), unpadded, ungrouped."""
    out = []
    for node in model.graph:
        if node.op_type != "Conv" or _producer(node.inputs[0], "DequantizeLinear") is None:
            continue
        w_dq = _producer(node.inputs[1], "DequantizeLinear")
        w = const_array(w_dq.inputs[0]) if w_dq is not None else None
        a = {k: v.as_ints() for k, v in node.attributes.items() if k in ("strides", "pads", "dilations")}
        group = node.attributes["group"].as_int() if node.attributes.get("group") is not None else 1
        if w is None or w.ndim != 4 or w.shape[2] != w.shape[3] or w.shape[2] < 2 or group != 1:
            continue
        if list(a.get("strides", [1, 1])) != [w.shape[2]] * 2 or any(a.get("pads", [0])) or any(d != 1 for d in a.get("dilations", [1])):
            continue
        out.append(node)
    return out


class PatchConvsAs1x1(GraphPass):
    """A p x p stride-p patch-embedding Conv as ``patches to channels → Q/DQ → Conv 1x1 → Q/DQ``: the same
    function, in the one Conv form RKNN 2.5.0 runs from a Q/DQ file (the p x p form is rejected in its
    bias handling: ``KeyError: 'x_dequantized_conv'``; in float it fails on ``KeyError: 'x_conv'``).

    Args:
        ranges: Conv output tensor → (lo, hi), from :func:`output_ranges`.
    """

    name = "rknn_patch_convs_as_1x1"

    def __init__(self, ranges: Mapping[str, tuple[float, float]]):
        super().__init__()
        self.ranges = ranges

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        for conv in patch_convs(model):
            q = _producer(conv.inputs[0].producer().inputs[0], "QuantizeLinear")
            if q is None or conv.outputs[0].name not in self.ranges:
                report.skipped[conv.name] = "no QuantizeLinear before it" if q is None else "no output range"
                continue
            self._rewrite(model, conv, q)
            report.changed += 1
        ir_common.RemoveUnusedNodesPass()(model)

    @staticmethod
    def _patches(model: ir.Model, x: ir.Value, p: int, name: str) -> list[ir.Node]:
        """[1, C, H, W] → [1, C·p·p, H/p, W/p], channels ordered (c, row, column) like a Conv weight."""
        n, c, h, w = static_shape(x)
        r1 = ir.node("Reshape", [x, _init(model, f"{name}_s2d_shape6", np.array([n, c, h // p, p, w // p, p], np.int64))],
                     name=f"{name}_s2d_Reshape6")
        tr = ir.node("Transpose", [r1.outputs[0]], attributes={"perm": [0, 1, 3, 5, 2, 4]}, name=f"{name}_s2d_Transpose")
        r2 = ir.node("Reshape", [tr.outputs[0], _init(model, f"{name}_s2d_shape4", np.array([n, c * p * p, h // p, w // p], np.int64))],
                     name=f"{name}_s2d_Reshape4")
        return [r1, tr, r2]

    def _rewrite(self, model: ir.Model, conv: ir.Node, q: ir.Node) -> None:
        w_dq = conv.inputs[1].producer()
        wq, ws, wz = (const_array(v) for v in w_dq.inputs[:3])
        cout, p = wq.shape[0], wq.shape[2]
        # patches to channels in the weight's own (channel, row, column) order: RKNN runs this
        # Reshape/Transpose on the NPU, where it puts a SpaceToDepth op on the CPU
        w1 = np.ascontiguousarray(wq.reshape(cout, -1, 1, 1))
        ws = np.broadcast_to(np.asarray(ws, np.float32).reshape(-1), (cout,)).copy()
        wz = np.broadcast_to(np.asarray(wz).reshape(-1), (cout,)).astype(wq.dtype)
        name = conv.name or conv.outputs[0].name
        nodes = self._patches(model, q.inputs[0], p, name)
        nodes += _qdq(model, nodes[-1].outputs[0], q.inputs[1], q.inputs[2], f"{name}_s2d")
        w = ir.node("DequantizeLinear", [_init(model, f"{name}_1x1_wq", w1), _init(model, f"{name}_1x1_ws", ws),
                                         _init(model, f"{name}_1x1_wz", wz)], attributes={"axis": 0}, name=f"{name}_1x1_w_DQ")
        new = ir.node("Conv", [nodes[-1].outputs[0], w.outputs[0], *conv.inputs[2:]], attributes={"kernel_shape": [1, 1]},
                      name=f"{name}_1x1")
        lo, hi = self.ranges[conv.outputs[0].name]
        zp = const_array(q.inputs[2])
        s, z = _qparams(float(lo), float(hi), zp.dtype if zp is not None else np.dtype(np.uint8))
        nodes += [w, new, *_qdq(model, new.outputs[0], _init(model, f"{name}_out_scale", s), _init(model, f"{name}_out_zp", z),
                                 f"{name}_1x1_out")]
        nodes[-1].outputs[0].shape, nodes[-1].outputs[0].dtype = conv.outputs[0].shape, ir.DataType.FLOAT
        model.graph.insert_after(conv, nodes)
        ir.convenience.replace_all_uses_with(conv.outputs[0], nodes[-1].outputs[0])


def activation_zp_dtype(model: ir.Model) -> np.dtype:
    """The zero-point type of the file's activation QuantizeLinear nodes (uint8 unless int8 only)."""
    kinds = {const_array(n.inputs[2]).dtype for n in model.graph
             if n.op_type == "QuantizeLinear" and len(n.inputs) > 2 and const_array(n.inputs[2]) is not None}
    return np.dtype(np.int8) if kinds == {np.dtype(np.int8)} else np.dtype(np.uint8)


def output_ranges(model: ir.Model, feeds: Iterable[Mapping[str, np.ndarray]], names: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Min and max of ``names`` over ``feeds``, computed by ONNX Runtime on ``model`` (the Q/DQ model:
    the ranges the INT8 network produces, which the output Q/DQ must hold)."""
    import onnxruntime as ort

    proto = ir.serde.serialize_model(model)
    known = {o.name for o in proto.graph.output}
    for n in names:
        if n not in known:
            proto.graph.output.add().name = n
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    lo = {n: np.inf for n in names}
    hi = {n: -np.inf for n in names}
    for feed in feeds:
        for n, arr in zip(names, sess.run(list(names), dict(feed))):
            lo[n], hi[n] = min(lo[n], float(arr.min())), max(hi[n], float(arr.max()))
    return {n: (lo[n], hi[n]) for n in names}
