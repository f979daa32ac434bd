"""The Q/DQ layout rknn-toolkit2 2.5.0 runs in INT8 (measured with its op table on the x86 simulator).

RKNN runs a Q/DQ (QAT) file's op in INT8 only when a DequantizeLinear feeds the op directly *and* its
output is Q/DQ'd too; otherwise the op runs in float16 with conversions around it. vitexport's Q/DQ
file quantizes op inputs only, so each pass here adds what RKNN needs, keeping the function:

- :class:`LinearsAsConv`: a ``MatMul`` Linear never qualifies (RKNN turns it into a 1x1 ``Conv``
  behind a Transpose it inserts *after* the DQ, so the Conv reads float16: the demo ran 4 % of its
  GEMM MACs in INT8). Written as ``Transpose → Q/DQ → Conv 1x1 (weights [Cout,Cin,1,1], per-channel
  axis 0) → Q/DQ → Transpose``, the same Linear runs INT8 (``Conv INT8`` in RKNN's op table).
- :class:`PatchConvsInInt8`: a p x p stride-p patch embedding with p ≤ 4 only needs its output Q/DQ'd
  (any Conv of stride > 7 is split the same way where a factor divides kernel, stride, pads and input);
  a larger one (ViT's 16x16) crashes RKNN (``RKNNWeightTransposePass``) or is refused (``KeyError:
  'x_dq_conv'``), so it becomes two Q/DQ'd convs of at most 4x4: a one-hot ``f x f`` stride-f conv
  (space to depth, exact in INT8: one-hot weights, the input's own scale) and the patch conv's weights
  rearranged as a ``p/f x p/f`` stride-``p/f`` conv. Both run ``Conv INT8`` on the NPU (the older
  patches-to-channels + 1x1 form, kept for patches no such split fits, puts its channel-merging
  Reshape on the CPU).
- :class:`MoveScoreScales` + :class:`OutputQdq`: attention's Q·Kᵀ runs INT8 when its output is Q/DQ'd,
  but a Q/DQ pair feeding Softmax directly crashes RKNN's softmax fusion (SIGSEGV in
  ``RKNNSubgraphManager``). timm applies the 1/√d scale to q *before* Q·Kᵀ, so the scores go straight
  to Softmax; :class:`MoveScoreScales` moves that scalar Mul after the MatMul (the q Q/DQ's scale divided
  by it: the same int8 values), and the scores' Q/DQ then sits before it. HF BERT divides the scores
  itself and Swin adds a bias: there the Q/DQ goes on the MatMul output as it is.
- :class:`ConvOutputsQdq`: every other quantized Conv's output Q/DQ'd where RKNN wants it (below), a
  QuantizeLinear already reading it (the next op's input) shared with its other readers; a Conv without
  a bias gets a zero one and its own activation DQ where a Concat shares it (both measured on
  EfficientViT's ``aggreg`` conv: ``Conv bias scale (…) is empty``, SIGABRT; then float16), and a grouped
  conv's float bias is written in int32 at the scale ONNX Runtime uses (NextViT: ``clip_truncate < 0``, SIGABRT).
  A smoothing Mul on token rows a Transpose or Reshape made becomes a depthwise 1x1 conv on the channels of
  :class:`LinearsAsConv`'s view (:func:`channel_scale`; the Mul crashes RKNN, SIGSEGV in OpEmit).
- :class:`ConvsInFloat`: Q/DQ taken off any Conv still without its output Q/DQ (no range measured, an
  activation or a weight the quantizer left float, a stride no split fits).

Measured on rknn-toolkit2 2.5.0's op table (rk3588, x86 simulator), one op between a Q/DQ'd producer
and a Q/DQ'd consumer, 16 channels at 16x16 (``DQ`` in, ``Q/DQ`` out unless said):

=============================================  ====================================================
conv kind / op                                 RKNN's op table
=============================================  ====================================================
3x3, bias or none; 1x1; 5x5; stride 2          ``Conv INT8``; without the output Q/DQ ``Conv FLOAT16``
depthwise 3x3, 7x7, stride 2; grouped (4)      ``Conv INT8`` (grouped: RKNN splits or densifies it)
k x k stride s, s ≤ 7 (4x4/2, 8x8/4, 16x16/4,  ``Conv INT8``
8x8/7, 7x7/7, 6x6/6)
any kernel at stride ≥ 8 (3x3/8, 8x8/8,        Q/DQ'd: SIGSEGV in ``RKNNWeightTransposePass``; float:
16x16/8)                                       ``KeyError: '<input>_conv'`` (split: one-hot f x f / f,
                                               then k/f x k/f / s/f: both ``Conv INT8``)
Conv → Relu / Clip, Q/DQ after the activation  ``ConvRelu`` / ``ConvClip INT8`` (Q/DQ between: the same)
Conv → HardSwish / Sigmoid / SiLU / GELU,      ``ConvHardSwish`` / ``ConvSigmoid`` / ``ConvExSwish`` /
Q/DQ after the activation only                 ``ConvExGelu FLOAT16``
the same, Q/DQ right after the Conv            ``Conv INT8``, the activation alone in FLOAT16; with
                                               Q/DQ after the activation too: ``ConvExSwish INT8``
AveragePool 3x3/1 pad 1, padding not counted   INT8 **on the CPU** (PoolFormer, EfficientFormer)
AveragePool counting its padding; unpadded;    ``AveragePool INT8`` on the NPU (hence
2x2/2                                          :class:`~.graph.PaddedAvgPools`)
GlobalAveragePool                              two ``Conv`` rows (counted as GEMM MACs): INT8
                                               between Q/DQ, float16 on a float input
MaxPool 3x3/2; Resize nearest / linear; Concat ``INT8`` on the NPU
Add of two Q/DQ'd tensors                      fused away (into the next Conv)
Softmax, last axis ≤ 256 / ≥ 320               NPU / ``exSoftmax13`` **on the CPU** (PiT at 224: 730)
=============================================  ====================================================
- :class:`BatchedProbsInFloat`: RKNN runs the float16 → int8 conversion of a Softmax output on the
  CPU when its leading dimension is > 1 and its last a multiple of 16 (Swin's first stage, (4 windows,
  2 heads, 16, 16): 2 of 177 ops off the NPU; measured on a bare attention: (2|4, 2, T, T) on the CPU
  for T = 16, 32, on the NPU for T = 8, 12, 20, 24, and (1, ·, 16, 16) on the NPU, as is every ViT's
  (1, heads, N, N); Reshapes to a leading 1 around the Q/DQ or the Softmax are folded away by RKNN and
  change nothing). Those probabilities lose their Q/DQ: attn·V runs float16 there, every op on the NPU.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as ir_common

from ...graph.passes import GraphPass, GraphPassReport
from ...graph.query import const_array, quantized_linears, static_shape
from .graph import (
    MAX_QDQ_PATCH, MAX_QDQ_STRIDE, conv_stride, infer_shapes, new_initializer, patch_convs, patch_size, producer,
    space_to_depth_factor, strided_convs,
)

__all__ = ["LinearSite", "linear_sites", "LinearsAsConv", "PatchConvsInInt8", "patch_split", "stride_split", "MoveScoreScales",
           "score_matmuls", "OutputQdq", "FUSED_ACTIVATIONS", "quantized_convs", "conv_output", "pooled_shortcut", "feeds_softmax", "float_conv_rule", "conv_outputs_to_measure",
           "ConvOutputsQdq", "ConvsInFloat", "BatchedProbsInFloat", "unquantized_outputs", "position_add"]

#: ops between attention's Q·Kᵀ and its Softmax (scale, bias, mask, the head reshapes)
_SCORE_PATH = ("Mul", "Div", "Add", "Where", "Reshape", "Transpose")


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
    infer_shapes(model)
    return [LinearSite(n, _bias_add(n) if n.op_type == "MatMul" else None, n.inputs[0].producer(), n.inputs[1].producer())
            for n in quantized_linears(model)
            if (n.op_type == "MatMul" or _plain_gemm(n)) and static_shape(n.inputs[0]) is not None]


def _quantized(value: ir.Value) -> bool:
    uses = list(value.uses())
    return bool(uses) and all(u[0].op_type == "QuantizeLinear" for u in uses)


def unquantized_outputs(model: ir.Model) -> list[ir.Value]:
    """Outputs of Conv and activation x activation MatMul nodes whose inputs are all Q/DQ'd but whose
    output (after a constant bias Add) is not: RKNN runs such an op in float16."""
    out = []
    for node in model.graph:
        if node.op_type not in ("Conv", "MatMul"):
            continue
        data = node.inputs[:2]
        if not all(producer(v, "DequantizeLinear") is not None for v in data):
            continue
        if node.op_type == "MatMul" and const_array(producer(data[1], "DequantizeLinear").inputs[0]) is not None:
            continue  # a Linear: LinearsAsConv's
        value = (_bias_add(node) or node).outputs[0]
        if not _quantized(value):
            out.append(value)
    return out


def _qparams(lo: float, hi: float, zp_dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Scale and zero point of a range in the activation encoding the file already uses."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if np.dtype(zp_dtype) == np.uint8:
        scale = max(hi - lo, 1e-12) / 255.0
        return np.array(scale, np.float32), np.array(np.clip(round(-lo / scale), 0, 255), np.uint8)
    return np.array(max(-lo, hi, 1e-12) / 127.0, np.float32), np.array(0, np.int8)


def _qdq(x: ir.Value, scale: ir.Value, zp: ir.Value, name: str) -> list[ir.Node]:
    q = ir.node("QuantizeLinear", [x, scale, zp], name=f"{name}_Q")
    q.outputs[0].name = f"{name}_quantized"
    dq = ir.node("DequantizeLinear", [q.outputs[0], scale, zp], name=f"{name}_DQ")
    dq.outputs[0].name = f"{name}_dequantized"
    return [q, dq]


def _range_qdq(model: ir.Model, x: ir.Value, lo: float, hi: float, zp_dtype: np.dtype, name: str) -> list[ir.Node]:
    """A Q/DQ pair of ``x`` for the range [lo, hi] in the file's activation encoding."""
    s, z = _qparams(float(lo), float(hi), zp_dtype)
    return _qdq(x, new_initializer(model, f"{name}_scale", s), new_initializer(model, f"{name}_zp", z), name)


def _zp_dtype(zp: ir.Value) -> np.dtype:
    arr = const_array(zp)
    return arr.dtype if arr is not None else np.dtype(np.uint8)


def _per_channel(model: ir.Model, wq: np.ndarray, ws: np.ndarray, wz: np.ndarray, name: str) -> ir.Node:
    """A DequantizeLinear of the int8 conv weight ``wq`` [Cout, ...] with one scale per output channel."""
    cout = wq.shape[0]
    ws = np.broadcast_to(np.asarray(ws, np.float32).reshape(-1), (cout,)).copy()
    wz = np.broadcast_to(np.asarray(wz).reshape(-1), (cout,)).astype(wq.dtype)
    vq, vs, vz = (new_initializer(model, f"{name}_w{k}", a) for k, a in (("q", np.ascontiguousarray(wq)), ("s", ws), ("z", wz)))
    dq = ir.node("DequantizeLinear", [vq, vs, vz], attributes={"axis": 0}, name=f"{name}_w_DQ")
    dq.outputs[0].name = f"{name}_w_dequantized"
    return dq


def _replace(old: ir.Value, new: ir.Value) -> None:
    """Every reader of ``old`` reads ``new``; a graph output keeps its name."""
    is_output = old.is_graph_output()
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    if is_output:
        name = old.name
        old.name = f"{name}_before_rknn"
        new.name = name


class LinearsAsConv(GraphPass):
    """Each quantized ``MatMul`` Linear (+ bias ``Add``) rewritten as a Q/DQ'd 1x1 ``Conv`` on a
    ``[1, Cin, 1, T]`` view with a Q/DQ'd output (see the module docstring).

    Args:
        ranges: Linear output tensor (the bias Add's output, else the MatMul's) → (lo, hi), measured
            on calibration data by :func:`~.graph.output_ranges`. A site without a range is skipped.
    """

    name = "rknn_linears_as_conv"

    def __init__(self, ranges: Mapping[str, tuple[float, float]]):
        super().__init__()
        self.ranges = ranges

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        for site in linear_sites(model):
            q = site.x_dq.inputs[0].producer()
            if site.output.name not in self.ranges:
                report.skipped[site.matmul.name] = "no output range"
            elif q is None or q.op_type != "QuantizeLinear":
                report.skipped[site.matmul.name] = "activation DequantizeLinear not fed by a QuantizeLinear"
            else:
                self._rewrite(model, site, q)
                report.changed += 1
        ir_common.RemoveUnusedNodesPass()(model)

    def _rewrite(self, model: ir.Model, site: LinearSite, q: ir.Node) -> None:
        x, (xs, xz) = q.inputs[0], (q.inputs[1], q.inputs[2])
        xshape, oshape = static_shape(site.matmul.inputs[0]), static_shape(site.output)
        cin, t = xshape[-1], int(np.prod(xshape[:-1]))
        name = site.matmul.name or site.output.name
        scaled = channel_scale(x, cin)
        shifted = None if scaled else position_add(x, t, cin)
        rows = scaled[0] if scaled else shifted[0] if shifted else x
        nodes = [ir.node("Reshape", [rows, new_initializer(model, f"{name}_nc_shape", np.array([1, t, 1, cin], np.int64))],
                         name=f"{name}_nc_Reshape")]
        nodes.append(ir.node("Transpose", [nodes[-1].outputs[0]], attributes={"perm": [0, 3, 2, 1]}, name=f"{name}_nc_Transpose"))
        if shifted:  # the constant added on the [1, Cin, 1, T] view, right before its Q/DQ
            view = new_initializer(model, f"{name}_nc_position", shifted[1].T.reshape(1, cin, 1, t).astype(np.float32))
            nodes.append(ir.node("Add", [nodes[-1].outputs[0], view], name=f"{name}_nc_position_Add"))
        if scaled:  # the smoothing as a depthwise 1x1 Conv on the [1, Cin, 1, T] view, right before its Q/DQ (a zero bias:
            # without one RKNN aborts, "Conv bias scale ... is empty", as on _zero_bias's convs)
            s = new_initializer(model, f"{name}_nc_smooth", scaled[1].reshape(cin, 1, 1, 1))
            b = new_initializer(model, f"{name}_nc_smooth_bias", np.zeros(cin, np.float32))
            nodes.append(ir.node("Conv", [nodes[-1].outputs[0], s, b], attributes={"group": cin, "kernel_shape": [1, 1]}, name=f"{name}_nc_smooth_Conv"))
        nodes += _qdq(nodes[-1].outputs[0], xs, xz, f"{name}_nc_in")
        wq, ws, wz = (const_array(v) for v in site.w_dq.inputs[:3])
        w_dq = _per_channel(model, (wq if site.weight_out_in else wq.T)[:, :, None, None], ws, wz, f"{name}_conv")
        conv_in = [nodes[-1].outputs[0], w_dq.outputs[0]]
        bias = site.bias()
        if bias is not None:
            conv_in.append(new_initializer(model, f"{name}_conv_bias", bias.astype(np.float32)))
        conv = ir.node("Conv", conv_in, attributes={"kernel_shape": [1, 1]}, name=f"{name}_Conv")
        lo, hi = self.ranges[site.output.name]
        nodes += [w_dq, conv, *_range_qdq(model, conv.outputs[0], lo, hi, _zp_dtype(xz), f"{name}_nc_out")]
        nodes.append(ir.node("Transpose", [nodes[-1].outputs[0]], attributes={"perm": [0, 3, 2, 1]}, name=f"{name}_tc_Transpose"))
        nodes.append(ir.node("Reshape", [nodes[-1].outputs[0], new_initializer(model, f"{name}_tc_shape", np.array(oshape, np.int64))],
                             name=f"{name}_tc_Reshape"))
        new_out = nodes[-1].outputs[0]
        new_out.shape, new_out.dtype = ir.Shape(oshape), ir.DataType.FLOAT
        model.graph.insert_after(site.bias_add or site.matmul, nodes)
        _replace(site.output, new_out)


def position_add(x: ir.Value, t: int, cin: int) -> tuple[ir.Value, np.ndarray] | None:
    """(its other input, the constant as ``[T, Cin]``) when ``x`` is an ``Add`` of a constant with one value per
    token and channel (a position embedding) to token rows a Transpose or Reshape made from a conv stage's feature
    map: DETR's encoder adds its sine position embedding to the flattened backbone features right before the q and
    k projections. RKNN 2.5.0 segfaults in OpEmit on that ``Add`` between the rows' Transpose and the conv view's
    (its optimiser cancels the two Transposes and moves the Add across the Reshape), and on it moved back onto the
    NCHW feature map alike (at the attn·V that follows); added on the conv view's ``[1, Cin, 1, T]`` channels, after
    the view's Transpose and before its Q/DQ, it compiles (the task zoo's DETR: every compute op on the NPU)."""
    found = _constant_on_rows(x, "Add")
    if found is None:
        return None
    rows, c = found
    shape = static_shape(rows)
    if c.size != t * cin or c.shape[-1:] != (cin,) or shape is None or shape[-1] != cin or int(np.prod(shape[:-1])) != t:
        return None
    return rows, c.reshape(t, cin)


def channel_scale(x: ir.Value, cin: int) -> tuple[ir.Value, np.ndarray] | None:
    """(its input, the float32 vector) when ``x`` is a Mul by a constant over its last axis (``cin`` values) of
    token rows a Transpose or Reshape made: the smoothing Mul vitexport inserts before a Linear no LayerNorm
    absorbs, on a conv stage's feature map turned into tokens. RKNN 2.5.0 crashes in OpEmit on that Mul, where
    it is and moved after the Conv view's Transpose alike (SIGSEGV after "LayoutMatchManager: recursion_depth=3,
    Logic is Dangerous": NextViT's E-MHSA, whose q, k and v read such rows), and compiles the same scaling as a
    float16 depthwise 1x1 Conv on the channels of :class:`LinearsAsConv`'s ``[1, Cin, 1, T]`` view."""
    found = _constant_on_rows(x, "Mul")
    if found is None or found[1].size != cin or found[1].shape[-1:] != (cin,):
        return None
    return found[0], found[1].reshape(-1)


def _constant_on_rows(x: ir.Value, op_type: str) -> tuple[ir.Value, np.ndarray] | None:
    """(the other input, the float32 constant) when ``x`` is ``op_type`` of a constant and token rows a Transpose
    or Reshape made (a conv stage's feature map turned into tokens)."""
    node = x.producer()
    if node is None or node.op_type != op_type:
        return None
    for i in (0, 1):
        c = const_array(node.inputs[i])
        other = node.inputs[1 - i]
        rows = other.producer() if other is not None else None
        if c is not None and c.dtype == np.float32 and rows is not None and rows.op_type in ("Transpose", "Reshape"):
            return other, c
    return None


def patch_split(p: int) -> int | None:
    """The space-to-depth factor f that splits a p x p patch conv into an f x f and a p/f x p/f conv
    of at most :data:`~.graph.MAX_QDQ_PATCH` each (None: p fits as it is, or no split fits)."""
    if p <= MAX_QDQ_PATCH:
        return None
    return next((f for f in range(MAX_QDQ_PATCH, 1, -1) if p % f == 0 and p // f <= MAX_QDQ_PATCH), None)


def stride_split(conv: ir.Node) -> int | None:
    """The space-to-depth factor that splits a Conv of stride above :data:`~.graph.MAX_QDQ_STRIDE`
    (:func:`~.graph.space_to_depth_factor`), None when none does."""
    return space_to_depth_factor(conv)


class PatchConvsInInt8(GraphPass):
    """Each Q/DQ'd patch-embedding Conv in a form RKNN runs in INT8 (see the module docstring): its
    output Q/DQ'd (p ≤ 4), split into two ≤ 4x4 convs (p ≤ 16), else patches-to-channels + a 1x1 conv;
    a Conv of stride above :data:`~.graph.MAX_QDQ_STRIDE` (PiT's 16x16 stride 8) split the same
    way (:func:`stride_split`), else left for ConvsInFloat with the reason.

    Args:
        ranges: Conv output tensor → (lo, hi), from :func:`~.graph.output_ranges`.
    """

    name = "rknn_patch_convs_in_int8"

    def __init__(self, ranges: Mapping[str, tuple[float, float]]):
        super().__init__()
        self.ranges = ranges

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        for conv in patch_convs(model) + strided_convs(model):
            q = producer(conv.inputs[0].producer().inputs[0], "QuantizeLinear")
            if q is None or conv.outputs[0].name not in self.ranges:
                report.skipped[conv.name] = "no QuantizeLinear before it" if q is None else "no output range"
                continue
            p = patch_size(conv)
            f = patch_split(p) if p else stride_split(conv)
            if p and p <= MAX_QDQ_PATCH:
                self._output_qdq(model, conv, q)
            elif f is not None:
                self._split(model, conv, q, f)
            elif p:
                self._as_1x1(model, conv, q)
            else:
                report.skipped[conv.name] = (f"stride {conv_stride(conv)}: no space-to-depth step of 2 to {MAX_QDQ_PATCH} "
                                             "divides its kernel, stride, pads and input (rknn.conv_stride)")
                continue
            report.changed += 1
        ir_common.RemoveUnusedNodesPass()(model)

    def _finish(self, model: ir.Model, conv: ir.Node, new: ir.Node, nodes: list[ir.Node], zp: ir.Value) -> None:
        """``new`` (the conv computing ``conv``'s output) with its output Q/DQ'd, in place of ``conv``."""
        lo, hi = self.ranges[conv.outputs[0].name]
        name = conv.name or conv.outputs[0].name
        nodes += [*_range_qdq(model, new.outputs[0], lo, hi, _zp_dtype(zp), f"{name}_int8_out")]
        nodes[-1].outputs[0].shape, nodes[-1].outputs[0].dtype = conv.outputs[0].shape, ir.DataType.FLOAT
        model.graph.insert_after(conv, nodes)
        _replace(conv.outputs[0], nodes[-1].outputs[0])

    def _output_qdq(self, model: ir.Model, conv: ir.Node, q: ir.Node) -> None:
        lo, hi = self.ranges[conv.outputs[0].name]
        name = conv.name or conv.outputs[0].name
        uses = list(conv.outputs[0].uses())  # before the new Q becomes a reader too
        nodes = _range_qdq(model, conv.outputs[0], lo, hi, _zp_dtype(q.inputs[2]), f"{name}_int8_out")
        model.graph.insert_after(conv, nodes)
        for node, idx in uses:
            node.replace_input_with(idx, nodes[-1].outputs[0])

    def _split(self, model: ir.Model, conv: ir.Node, q: ir.Node, f: int) -> None:
        """conv k x k / s = (one-hot f x f / f: channel c·f²+i·f+j) then (k/f x k/f / s/f, pads / f)."""
        wq, ws, wz = (const_array(v) for v in conv.inputs[1].producer().inputs[:3])
        cout, cin, p = wq.shape[0], wq.shape[1], wq.shape[2]
        k = p // f
        stride = conv_stride(conv) // f
        pads = [x // f for x in conv.attributes["pads"].as_ints()] if conv.attributes.get("pads") is not None else [0] * 4
        onehot = np.zeros((cin * f * f, cin, f, f), wq.dtype)
        w2 = np.zeros((cout, cin * f * f, k, k), wq.dtype)
        for c in range(cin):
            for i in range(f):
                for j in range(f):
                    onehot[c * f * f + i * f + j, c, i, j] = 127  # × scale 1/127: exactly 1.0 after DQ
                    w2[:, c * f * f + i * f + j] = wq[:, c, i::f, j::f]
        name = conv.name or conv.outputs[0].name
        s2d_w = _per_channel(model, onehot, np.full(cin * f * f, 1 / 127, np.float32), np.zeros(1, wq.dtype), f"{name}_s2d")
        s2d = ir.node("Conv", [conv.inputs[0], s2d_w.outputs[0]], attributes={"kernel_shape": [f, f], "strides": [f, f]},
                      name=f"{name}_s2d")
        # the one-hot conv only moves the input's dequantized values: the input's own Q/DQ holds them exactly
        nodes = [s2d_w, s2d, *_qdq(s2d.outputs[0], q.inputs[1], q.inputs[2], f"{name}_s2d_out")]
        w = _per_channel(model, w2, ws, wz, f"{name}_patch")
        new = ir.node("Conv", [nodes[-1].outputs[0], w.outputs[0], *conv.inputs[2:]],
                      attributes={"kernel_shape": [k, k], "strides": [stride, stride], "pads": pads}, name=f"{name}_patch")
        self._finish(model, conv, new, [*nodes, w, new], q.inputs[2])

    def _as_1x1(self, model: ir.Model, conv: ir.Node, q: ir.Node) -> None:
        """[1, C, H, W] → [1, C·p·p, H/p, W/p] (channels ordered like the weight) → Q/DQ → 1x1 conv."""
        wq, ws, wz = (const_array(v) for v in conv.inputs[1].producer().inputs[:3])
        cout, p = wq.shape[0], wq.shape[2]
        n, c, h, w_ = static_shape(q.inputs[0])
        name = conv.name or conv.outputs[0].name
        shape6 = np.array([n, c, h // p, p, w_ // p, p], np.int64)
        r1 = ir.node("Reshape", [q.inputs[0], new_initializer(model, f"{name}_s2d_shape6", shape6)], name=f"{name}_s2d_Reshape6")
        tr = ir.node("Transpose", [r1.outputs[0]], attributes={"perm": [0, 1, 3, 5, 2, 4]}, name=f"{name}_s2d_Transpose")
        shape4 = np.array([n, c * p * p, h // p, w_ // p], np.int64)
        r2 = ir.node("Reshape", [tr.outputs[0], new_initializer(model, f"{name}_s2d_shape4", shape4)], name=f"{name}_s2d_Reshape4")
        nodes = [r1, tr, r2, *_qdq(r2.outputs[0], q.inputs[1], q.inputs[2], f"{name}_s2d")]
        w = _per_channel(model, wq.reshape(cout, -1, 1, 1), ws, wz, f"{name}_1x1")
        new = ir.node("Conv", [nodes[-1].outputs[0], w.outputs[0], *conv.inputs[2:]], attributes={"kernel_shape": [1, 1]},
                      name=f"{name}_1x1")
        self._finish(model, conv, new, [*nodes, w, new], q.inputs[2])


def _reaches_softmax(value: ir.Value, depth: int = 8) -> bool:
    """``value`` flows, through one reader at a time of :data:`_SCORE_PATH` ops, into a Softmax."""
    for _ in range(depth):
        uses = list(value.uses())
        if len(uses) != 1:
            return False
        node = uses[0][0]
        if node.op_type == "Softmax":
            return True
        if node.op_type not in _SCORE_PATH:
            return False
        value = node.outputs[0]
    return False


def score_matmuls(model: ir.Model) -> list[ir.Node]:
    """Attention's Q·Kᵀ MatMuls: both inputs Q/DQ'd activations, the output unquantized, flowing into a Softmax."""
    out = []
    for node in model.graph:
        if node.op_type != "MatMul" or _quantized(node.outputs[0]):
            continue
        dqs = [producer(v, "DequantizeLinear") for v in node.inputs[:2]]
        if all(d is not None and const_array(d.inputs[0]) is None for d in dqs) and _reaches_softmax(node.outputs[0]):
            out.append(node)
    return out


def _scalar_mul_before(dq: ir.Node) -> tuple[ir.Node, ir.Node, float] | None:
    """(Mul, QuantizeLinear, c) when ``dq`` dequantizes ``Q(Mul(x, c))`` for a positive scalar c read by that Q only."""
    q = producer(dq.inputs[0], "QuantizeLinear")
    mul = producer(q.inputs[0], "Mul") if q is not None else None
    if mul is None or len(list(mul.outputs[0].uses())) != 1 or len(list(q.outputs[0].uses())) != 1:
        return None
    for i in (0, 1):
        c = const_array(mul.inputs[1 - i])
        if c is not None and c.size == 1 and float(c.reshape(-1)[0]) > 0:
            return mul, q, float(c.reshape(-1)[0])
    return None


class MoveScoreScales(GraphPass):
    """Where a Q·Kᵀ MatMul feeds Softmax directly and its q (or k) is ``Q/DQ(Mul(x, c))``, the Mul moves
    after the MatMul and the Q/DQ of x takes scale s / c: the same int8 values, the same scores, and a
    place for the scores' Q/DQ that is not right before Softmax (see the module docstring)."""

    name = "rknn_move_score_scales"

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        infer_shapes(model)
        for mm in score_matmuls(model):
            if list(mm.outputs[0].uses())[0][0].op_type != "Softmax":
                continue  # something already sits between the scores and the Softmax
            found = [_scalar_mul_before(producer(v, "DequantizeLinear")) for v in mm.inputs[:2]]
            hit = next((f for f in found if f is not None), None)
            if hit is None:
                report.skipped[mm.name] = "no scalar scale on q or k to move: the scores stay float16"
                continue
            self._move(model, mm, *hit)
            report.changed += 1
        ir_common.RemoveUnusedNodesPass()(model)

    @staticmethod
    def _move(model: ir.Model, mm: ir.Node, mul: ir.Node, q: ir.Node, c: float) -> None:
        x = mul.inputs[0] if const_array(mul.inputs[0]) is None else mul.inputs[1]
        dq = list(q.outputs[0].uses())[0][0]
        s = const_array(q.inputs[1])
        scale = new_initializer(model, f"{q.name}_unscaled", (s / np.float32(c)).astype(s.dtype))
        q.replace_input_with(0, x)
        q.replace_input_with(1, scale)
        dq.replace_input_with(1, scale)
        name = mm.name or mm.outputs[0].name
        uses = list(mm.outputs[0].uses())  # before the new Mul becomes a reader too
        after = ir.node("Mul", [mm.outputs[0], new_initializer(model, f"{name}_scale", np.array(c, np.float32))],
                        name=f"{name}_scale_Mul")
        if mm.outputs[0].dtype is not None:
            after.outputs[0].shape, after.outputs[0].dtype = mm.outputs[0].shape, mm.outputs[0].dtype
        model.graph.insert_after(mm, [after])
        for node, idx in uses:
            node.replace_input_with(idx, after.outputs[0])


class OutputQdq(GraphPass):
    """A Q/DQ pair after each tensor of ``ranges`` (Q·Kᵀ scores from :func:`score_matmuls`, outputs from
    :func:`unquantized_outputs`), in the encoding of the file's activations, so that RKNN runs its
    producer (a Conv, an attention MatMul) in INT8."""

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
            uses = list(v.uses())  # before the new Q becomes a reader too
            nodes = _range_qdq(model, v, lo, hi, self.zp_dtype, f"{name}_out")
            model.graph.insert_after(v.producer(), nodes)
            for node, idx in uses:
                node.replace_input_with(idx, nodes[-1].outputs[0])
            if v.is_graph_output():
                report.skipped[name] = "a graph output: its readers only were re-pointed"
            report.changed += 1


#: activations RKNN fuses into the Conv before it and runs in INT8 with the Conv: their output takes the
#: Conv's output Q/DQ (HardSwish, Sigmoid, SiLU, GELU fuse too, but then run the pair in float16)
FUSED_ACTIVATIONS = ("Relu", "Clip")


def quantized_convs(model: ir.Model) -> list[ir.Node]:
    """Convs whose activation and constant weight both come through DequantizeLinear, of a stride RKNN
    compiles in INT8 (:data:`~.graph.MAX_QDQ_STRIDE`; :class:`PatchConvsInInt8` splits the others it can)."""
    return [node for node in model.graph if _quantized_conv(node)]


def _quantized_conv(node: ir.Node) -> bool:
    if node.op_type != "Conv" or producer(node.inputs[0], "DequantizeLinear") is None or conv_stride(node) > MAX_QDQ_STRIDE:
        return False
    w_dq = producer(node.inputs[1], "DequantizeLinear")
    return w_dq is not None and const_array(w_dq.inputs[0]) is not None


def conv_output(conv: ir.Node) -> ir.Value:
    """The tensor whose Q/DQ makes RKNN run ``conv`` in INT8: the output of a Relu/Clip it alone feeds
    (fused into ``ConvRelu``/``ConvClip``), else the Conv's own output (an activation RKNN would fuse in
    float16 then reads the DQ and runs on its own in float16)."""
    out = conv.outputs[0]
    uses = list(out.uses())
    if len(uses) == 1 and uses[0][0].op_type in FUSED_ACTIVATIONS and not out.is_graph_output():
        return uses[0][0].outputs[0]
    return out


def pooled_shortcut(conv: ir.Node) -> bool:
    """The Conv's output is summed with a pooled tensor (``conv(x) + pool(x)``: EfficientFormerV2's
    downsampling attention, a 3x3 stride-2 depthwise conv beside a 1x1 stride-2 AveragePool): RKNN 2.5.0
    crashes on it with the Conv in INT8 (SIGILL in ``RKNNAllocateConvCachePass``, after "The
    dimensionSize of Tensor is 0"), and compiles it with the Conv in float16."""
    uses = list(conv.outputs[0].uses())
    if len(uses) != 1 or uses[0][0].op_type != "Add":
        return False
    add = uses[0][0]
    other = add.inputs[1] if add.inputs[0] is conv.outputs[0] else add.inputs[0]
    return other is not None and other.producer() is not None and other.producer().op_type in ("AveragePool", "MaxPool")


def feeds_softmax(conv: ir.Node) -> bool:
    """The Conv's output (:func:`conv_output`) is read by a Softmax: EfficientFormerV2's talking-heads
    mix (a 1x1 conv across the heads of the scores, right before the Softmax). Q/DQ'd there, Softmax reads a
    DequantizeLinear, which RKNN's softmax fusion segfaults on (rule ``rknn.softmax_qdq``); the mix runs
    in float16 (heads² multiply-accumulates per score: a small share)."""
    return any(u.op_type == "Softmax" for u, _ in conv_output(conv).uses())


def split_chain(conv: ir.Node) -> bool:
    """The Conv's output (:func:`conv_output`) is read both by a ``Concat`` and by an ``Add``: a link of a
    Res2Net-style channel-split chain (EdgeNeXt's SDTA block: each split's conv output joins the final
    ``Concat`` and is added to the next split's input). RKNN 2.5.0 crashes compiling it with the conv in
    INT8 ("The dimensionSize of Tensor is 0", then SIGILL in ``OpEmit``), and compiles it with the conv in
    float16 (a depthwise conv on a slice of the channels: a small share of the multiply-accumulates)."""
    readers = {u.op_type for u, _ in conv_output(conv).uses()}
    return {"Concat", "Add"} <= readers


def float_conv_rule(conv: ir.Node) -> str | None:
    """Why RKNN 2.5.0 must run ``conv`` in float16 whatever its Q/DQ says, or None."""
    if pooled_shortcut(conv):
        return ("it is summed with a pooled shortcut (conv(x) + pool(x)), which RKNN 2.5.0 crashes on with the "
                "conv in INT8 (SIGILL in RKNNAllocateConvCachePass)")
    if feeds_softmax(conv):
        return ("its output feeds a Softmax directly, and a Q/DQ right before a Softmax crashes RKNN 2.5.0's "
                "softmax fusion (SIGSEGV, rule rknn.softmax_qdq)")
    if split_chain(conv):
        return ("its output is read by both a Concat and an Add (a channel-split chain, EdgeNeXt's SDTA), which RKNN "
                "2.5.0 crashes on with the conv in INT8 (SIGILL in OpEmit)")
    return None


def conv_outputs_to_measure(model: ir.Model) -> list[str]:
    """The :func:`conv_output` of each quantized Conv that no QuantizeLinear reads yet: the tensors
    :class:`ConvOutputsQdq` adds a Q/DQ pair to, whose ranges it needs."""
    names = []
    for conv in quantized_convs(model):
        if float_conv_rule(conv):
            continue
        v = conv_output(conv)
        if not any(u.op_type == "QuantizeLinear" for u, _ in v.uses()) and v.name not in names:
            names.append(v.name)
    return names


def _zero_bias(model: ir.Model, conv: ir.Node) -> None:
    """A zero float bias on a Conv without one: RKNN 2.5.0 derives the int32 scale of the bias it
    synthesises for such a Conv from tensors it may have rewritten, and aborts (``Conv bias scale (…
    weight_dequantized_bias_0) is empty``, SIGABRT in ``RKNNAllocateConvCachePass``: EfficientViT's
    depthwise ``aggreg`` conv, whose input also feeds a Concat); with a zero bias it compiles."""
    if len(conv.inputs) > 2 and conv.inputs[2] is not None:
        return
    cout = const_array(conv.inputs[1].producer().inputs[0]).shape[0]
    bias = new_initializer(model, f"{conv.name or conv.outputs[0].name}_zero_bias", np.zeros(cout, np.float32))
    if len(conv.inputs) > 2:
        conv.replace_input_with(2, bias)
    else:
        conv.resize_inputs(3)
        conv.replace_input_with(2, bias)


def _int32_bias(model: ir.Model, conv: ir.Node) -> None:
    """A grouped (not depthwise) Conv's float bias written as an int32 ``DequantizeLinear`` at the scale
    ONNX Runtime's QLinearConv uses (activation scale × each channel's weight scale): from a float bias RKNN
    2.5.0 derives a bias scale of its own for a grouped conv and can abort ("clip_truncate < 0, plz make sure
    bias_scale > weight_scale * input_scale", SIGABRT in OpEmit: NextViT's 3x3 convs of 12 groups of 32
    channels); given its int32 bias, it compiles."""
    w_dq, x_dq = conv.inputs[1].producer(), conv.inputs[0].producer()
    w = const_array(w_dq.inputs[0])
    b = const_array(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] is not None else None
    group = conv.attributes["group"].as_int() if conv.attributes.get("group") is not None else 1
    sx = const_array(x_dq.inputs[1])
    if group < 2 or w.shape[1] < 2 or b is None or b.dtype != np.float32 or sx is None or np.size(sx) != 1:
        return
    scale = (np.float32(np.ravel(sx)[0]) * np.broadcast_to(np.asarray(const_array(w_dq.inputs[1]), np.float32).reshape(-1),
                                                          b.shape)).astype(np.float32)
    q = np.round(b.astype(np.float64) / np.maximum(scale, np.float32(1e-30)))
    if np.any(np.abs(q) > 2**31 - 1):
        return  # a dead weight channel's scale with a live bias: no int32 holds it, the float bias stays
    q = q.astype(np.int32)
    stem = f"{conv.name}_bias"
    dq = ir.node("DequantizeLinear", [new_initializer(model, f"{stem}_quantized", q), new_initializer(model, f"{stem}_scale", scale),
                                      new_initializer(model, f"{stem}_zero_point", np.zeros_like(q))],
                 {"axis": 0}, name=f"{stem}_DequantizeLinear")
    dq.outputs[0].name, dq.outputs[0].dtype = f"{stem}_dequantized", ir.DataType.FLOAT
    model.graph.insert_before(conv, [dq])
    conv.replace_input_with(2, dq.outputs[0])


def _own_dq(model: ir.Model, conv: ir.Node) -> None:
    """The Conv's activation DequantizeLinear made its own when other nodes read it too (a Concat):
    RKNN 2.5.0 then ran EfficientViT's depthwise ``aggreg`` conv in float16 despite its Q/DQ."""
    dq = conv.inputs[0].producer()
    if len(list(dq.outputs[0].uses())) == 1:
        return
    own = ir.node("DequantizeLinear", list(dq.inputs), attributes=dict(dq.attributes), name=f"{conv.name}_own_DQ")
    own.outputs[0].name = f"{dq.outputs[0].name}_{conv.name}"
    own.outputs[0].shape, own.outputs[0].dtype = dq.outputs[0].shape, dq.outputs[0].dtype
    model.graph.insert_after(dq, [own])
    conv.replace_input_with(0, own.outputs[0])


class ConvOutputsQdq(GraphPass):
    """Each quantized Conv's output (after a Relu/Clip RKNN fuses into it, :func:`conv_output`) Q/DQ'd,
    so that RKNN runs the Conv in INT8 (module docstring). Where a QuantizeLinear already reads that
    tensor (the next op's input), its DequantizeLinear feeds the tensor's other readers too (a residual
    Add, a Concat): RKNN then reads one int8 tensor; otherwise a new pair is added for the range measured
    on calibration data.

    Args:
        ranges: tensor name → (lo, hi), from :func:`~.graph.output_ranges` on
            :func:`conv_outputs_to_measure`. A tensor without one is skipped (ConvsInFloat then strips its Conv).
        zp_dtype: the zero-point type of the file's activations.
    """

    name = "rknn_conv_outputs_qdq"

    def __init__(self, ranges: Mapping[str, tuple[float, float]], zp_dtype: np.dtype = np.dtype(np.uint8)):
        super().__init__()
        self.ranges, self.zp_dtype = ranges, np.dtype(zp_dtype)

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        for conv in quantized_convs(model):
            rule = float_conv_rule(conv)
            if rule:
                report.skipped[conv.name] = rule
                continue
            _zero_bias(model, conv)
            _int32_bias(model, conv)
            _own_dq(model, conv)
            v = conv_output(conv)
            uses = list(v.uses())
            qs = [u for u, _ in uses if u.op_type == "QuantizeLinear"]
            if uses and len(qs) == len(uses):
                continue  # already in the INT8 layout
            dq = next((d for q in qs for d, _ in q.outputs[0].uses() if d.op_type == "DequantizeLinear"), None)
            if dq is not None:
                for node, idx in uses:
                    if node.op_type != "QuantizeLinear":
                        node.replace_input_with(idx, dq.outputs[0])
            elif v.name in self.ranges:
                lo, hi = self.ranges[v.name]
                nodes = _range_qdq(model, v, lo, hi, self.zp_dtype, f"{conv.name or v.name}_int8_out")
                model.graph.insert_after(v.producer(), nodes)
                nodes[-1].outputs[0].shape, nodes[-1].outputs[0].dtype = v.shape, v.dtype
                _replace(v, nodes[-1].outputs[0])
                nodes[0].replace_input_with(0, v)  # _replace re-pointed the new Q too
            else:
                report.skipped[conv.name] = "no output range"
                continue
            report.changed += 1


def _int8_conv_output(value: ir.Value) -> bool:
    """``value`` is the Q/DQ'd output (:func:`conv_output`) of a Conv in the INT8 layout: its Q/DQ is what
    makes RKNN run that Conv in INT8, so a float Conv reading it keeps reading the DequantizeLinear (FastViT:
    a 7x7 downsampling conv before a 1x1 conv the fallback kept float; taking the pair off left the 7x7
    conv, 34 % of the model's multiply-accumulates, in float16)."""
    p = value.producer()
    conv = p if p is not None and p.op_type == "Conv" else (
        p.inputs[0].producer() if p is not None and p.op_type in FUSED_ACTIVATIONS and p.inputs[0] is not None else None)
    return conv is not None and conv.op_type == "Conv" and conv_output(conv) is value and _quantized_conv(conv)


def _float_reason(conv: ir.Node, x_dq: ir.Node | None, w_dq: ir.Node | None) -> str:
    """Why :class:`ConvsInFloat` took a Conv's Q/DQ off (the INT8-share gate names it per node)."""
    head = "rknn_convs_in_float took its Q/DQ off: "
    if conv_stride(conv) > MAX_QDQ_STRIDE:
        return head + (f"stride {conv_stride(conv)}: no space-to-depth step of 2 to {MAX_QDQ_PATCH} divides its kernel, "
                       "stride, pads and input (RKNN compiles no conv of stride above 7, rule rknn.conv_stride)")
    rule = float_conv_rule(conv)
    if rule:
        return head + rule
    if x_dq is None or w_dq is None or const_array(w_dq.inputs[0]) is None:
        return head + "its activation or its weight is not Q/DQ'd in the quantized file (RKNN 2.5.0 runs a Conv in INT8 only with both)"
    return head + "no calibration range was measured for its output Q/DQ (RKNN 2.5.0 runs a Conv in INT8 only with its output Q/DQ'd)"


class ConvsInFloat(GraphPass):
    """Q/DQ taken off every Conv whose output (:func:`conv_output`) is not Q/DQ'd (its activation reads
    the float tensor, its weight the dequantized values): RKNN 2.5.0 rejects some Q/DQ'd Convs it cannot
    run in INT8 in its bias handling (``KeyError: 'x_dequantized_conv'``). After :class:`ConvOutputsQdq`
    only Convs without a measured output range, or whose activation or weight is not Q/DQ'd, are left."""

    name = "rknn_convs_in_float"

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        for node in list(model.graph):
            if node.op_type != "Conv":
                continue
            x_dq, w_dq = producer(node.inputs[0], "DequantizeLinear"), producer(node.inputs[1], "DequantizeLinear")
            if (x_dq is None and w_dq is None) or (_quantized(conv_output(node)) and conv_stride(node) <= MAX_QDQ_STRIDE):
                continue  # already float, or already in the INT8 layout (its output Q/DQ'd, a stride RKNN compiles)
            q = producer(x_dq.inputs[0], "QuantizeLinear") if x_dq is not None else None
            if x_dq is not None and q is not None and not _int8_conv_output(q.inputs[0]):
                node.replace_input_with(0, q.inputs[0])
            if w_dq is not None and const_array(w_dq.inputs[0]) is not None:
                wq, ws, wz = (const_array(v) for v in w_dq.inputs[:3])
                axis = w_dq.attributes["axis"].as_int() if w_dq.attributes.get("axis") is not None else 1
                shape = [1] * wq.ndim
                if np.ndim(ws):
                    shape[axis] = -1
                w = (wq.astype(np.float32) - np.reshape(wz, shape).astype(np.float32)) * np.reshape(ws, shape)
                node.replace_input_with(1, new_initializer(model, f"{node.name}_w_float", w.astype(np.float32)))
            # said per node: the INT8-share gate names this rule as the reason RKNN runs the conv in float16
            report.skipped[node.name] = _float_reason(node, x_dq, w_dq)
            report.changed += 1
        ir_common.RemoveUnusedNodesPass()(model)


class BatchedProbsInFloat(GraphPass):
    """The Q/DQ pair right after a Softmax whose output has a leading dimension > 1 and a last one that is
    a multiple of 16 taken off, its readers reading the Softmax: RKNN 2.5.0 converts such probabilities
    to int8 on the CPU (module docstring)."""

    name = "rknn_batched_probs_in_float"

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        infer_shapes(model)
        for node in list(model.graph):
            if node.op_type != "Softmax":
                continue
            probs = node.outputs[0]
            shape = static_shape(probs)
            uses = list(probs.uses())
            if (shape is None or len(shape) < 2 or shape[0] <= 1 or shape[-1] % 16 or len(uses) != 1
                    or uses[0][0].op_type != "QuantizeLinear"):
                continue
            q = uses[0][0]
            dqs = [u for u, _ in q.outputs[0].uses()]
            if not dqs or any(d.op_type != "DequantizeLinear" for d in dqs):
                report.skipped[node.name] = "its quantized probabilities are read other than by a DequantizeLinear"
                continue
            for dq in dqs:
                ir.convenience.replace_all_uses_with(dq.outputs[0], probs)
            report.changed += 1
        ir_common.RemoveUnusedNodesPass()(model)


class CpuQuantizesInFloat(GraphPass):
    """The Q/DQ pairs whose QuantizeLinear RKNN's op table placed on the CPU (``exDataConvert`` named after
    it) taken off, their readers reading the float tensor: what RKNN cannot convert on the NPU it would
    convert on the CPU at every inference. Its reader runs float16 either way (EfficientFormerV2's
    downsampling attention with uint8 activations: probabilities (1, 8, 4, 16) quantized on the CPU,
    then dequantized for a float16 MatMul). Run on the laid-out file between two compiles
    (:class:`~.stages.CompileRknnStage`), not in :func:`~.routes.qdq_layout`: only the compiler knows."""

    name = "rknn_cpu_quantizes_in_float"

    def __init__(self, quantizes: set[str]) -> None:
        self.quantizes = quantizes

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        for q in [n for n in model.graph if n.op_type == "QuantizeLinear" and n.name in self.quantizes]:
            readers = [u for u, _ in q.outputs[0].uses()]
            if not readers or any(r.op_type != "DequantizeLinear" for r in readers):
                report.skipped[q.name] = "its quantized tensor is read other than by a DequantizeLinear"
                continue
            for dq in readers:
                for user, _ in list(dq.outputs[0].uses()):  # said per reader: the INT8-share gate names it
                    report.skipped[user.name] = (f"rknn_cpu_quantizes_in_float took the Q/DQ off its input "
                                                 f"({q.name}): RKNN converted it on the CPU")
                ir.convenience.replace_all_uses_with(dq.outputs[0], q.inputs[0])
            report.skipped[q.name] = "RKNN converted it on the CPU: its Q/DQ taken off, the tensor stays float16"
            report.changed += 1
        ir_common.RemoveUnusedNodesPass()(model)
