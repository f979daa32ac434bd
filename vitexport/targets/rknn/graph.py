"""Float-graph forms rknn-toolkit2 2.5.0 compiles onto the NPU, and the patterns it crashes on (measured
with its x86 simulator; the INT8 layout of Q/DQ files is :mod:`.qdq`).

- :class:`FullShapeMasks`: a ``Where`` mask whose condition broadcasts (``bool[1,1,1,N]`` against
  ``[B,H,N,N]`` scores) crashes RKNN's compiler (SIGSEGV in ``RKNNSubgraphManager``, which fuses
  ``Where → Softmax`` into a masked softmax), whatever the fill. The same mask written full-shape
  builds and is exact in FP16. Fills below −3e38 are rewritten by RKNN to −10000, so the pass writes
  −10000 itself (the file then says what runs). An *additive* mask builds too (RKNN fuses it into its
  ``exSDPAttention``) but RKNN's INT8 quantizer calibrates it like data (demo: cosine −0.29).
- :class:`CollapseTransposes`: a Transpose of more than 4 axes whose moved axes form at most 4 runs
  (Swin's patch merging: ``[1,4,2,4,2,C]`` with perm ``(0,1,3,4,2,5)``) as Reshape → 4-D Transpose →
  Reshape. RKNN lays the 6-D one out as a 5-D Transpose it runs on the CPU (in every route, its own
  FP16 and INT8 builds too); the 4-D one runs on the NPU (shrunk Swin-T: 0 ops on the CPU).
- :class:`PaddedAvgPools`: a padded ``AveragePool`` that leaves the padding out of its count (ONNX's
  default; PoolFormer's and EfficientFormer's ``pool(x) - x`` token mixer) runs on the CPU; counting the
  padding it runs ``AveragePool INT8`` on the NPU, so it is written as that times a constant map
  (k² / positions counted, 1 inside), a ``Mul`` on the NPU.
- :class:`HalvedGelus`: ``x · (1 + erf(x / √2))``, a GELU whose 0.5 a constant fold moved into the next
  conv, leaves RKNN's ``Erf`` unfused, on the CPU; followed by ``· 0.5 · 2`` it fuses into ``exGelu`` on
  the NPU (and RKNN folds the ``· 2`` into the next conv).
- :func:`rknn_hazards`: the patterns above and the INT8-layout ones, found before RKNN sees the file,
  one line per node with the rule (so a crash names the node, not only the compiler pass).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as ir_common

from ...graph.passes import GraphPass, GraphPassReport
from ...graph.query import const_array, static_shape
from ...runners.sessions import Session, SessionConfig

__all__ = ["FullShapeMasks", "CollapseTransposes", "PaddedAvgPools", "HalvedGelus", "Hazard", "HAZARD_RULES", "rknn_hazards", "new_initializer", "producer",
           "infer_shapes", "append_after", "output_ranges", "activation_zp_dtype",
           "patch_convs", "patch_size", "conv_stride", "strided_convs", "space_to_depth_factor", "RKNN_FILL", "MAX_TRANSPOSE_RANK", "MAX_QDQ_PATCH",
           "MAX_QDQ_STRIDE"]

#: what RKNN writes for a fill below −3e38 ("corrected to -10000"); exp(−10000 − max) is 0 in FP32 and
#: FP16 alike, and −10000 is exact in FP16 (largest finite 65504)
RKNN_FILL = -10000.0
_FILL_LIMIT = -3e38
#: the most axes of a Transpose RKNN runs on the NPU
MAX_TRANSPOSE_RANK = 4
#: the largest p of a p x p stride-p Q/DQ Conv RKNN 2.5.0 compiles in INT8 (4x4 runs ``Conv INT8``; 16x16
#: crashes in ``RKNNWeightTransposePass`` or is refused: ``KeyError: 'x_dq_conv'``)
MAX_QDQ_PATCH = 4
#: the largest stride of a Conv RKNN 2.5.0 compiles: any kernel at stride 8 (3x3, 8x8, PiT's 16x16) crashes
#: it when Q/DQ'd (SIGSEGV in ``RKNNWeightTransposePass``) and is refused in float (``KeyError: 'x_conv'``);
#: strides 2 to 7 run ``Conv INT8`` (16x16/4, 7x7/7, 8x8/7)
MAX_QDQ_STRIDE = 7


def new_initializer(model: ir.Model, name: str, arr: np.ndarray) -> ir.Value:
    """A new initializer holding ``arr`` (the name made unique)."""
    base, k = name, 0
    while name in model.graph.initializers:
        k += 1
        name = f"{base}_{k}"
    v = ir.Value(name=name, const_value=ir.tensor(arr, name=name), shape=ir.Shape(arr.shape),
                 type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)))
    model.graph.register_initializer(v)
    return v


def producer(value: ir.Value | None, op: str) -> ir.Node | None:
    """The node of type ``op`` that produces ``value``, else None."""
    p = value.producer() if value is not None else None
    return p if p is not None and p.op_type == op else None


def infer_shapes(model: ir.Model) -> None:
    """Static shapes on every value (the rewrites need them); a no-op when the file carries them."""
    if any(o.shape is None for n in model.graph for o in n.outputs):
        ir_common.ShapeInferencePass(strict_mode=False)(model)


class FullShapeMasks(GraphPass):
    """``Where`` conditions at the full shape of the scores (a constant one rewritten, one computed at
    run time expanded by an ``Expand``); fills below −3e38 as −10000 (see the module docstring)."""

    name = "rknn_full_shape_masks"

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        infer_shapes(model)  # the scores' shape decides the mask's
        expanded: dict[tuple[str, tuple[int, ...]], ir.Value] = {}  # one Expand per mask and shape, shared
        for node in list(model.graph):
            if node.op_type != "Where":
                continue
            cond, x, fill = node.inputs
            shape, cshape = static_shape(x), static_shape(cond)
            if shape is None or cshape is None:
                report.skipped[node.name] = "scores or condition without a static shape"
                continue
            report.changed += self._full(model, node, cshape, shape, expanded) | self._fill(model, node)

    @staticmethod
    def _full(model: ir.Model, node: ir.Node, cshape: tuple[int, ...], shape: tuple[int, ...],
              expanded: dict[tuple[str, tuple[int, ...]], ir.Value]) -> bool:
        cond, carr, farr = node.inputs[0], const_array(node.inputs[0]), const_array(node.inputs[2])
        full = tuple(np.broadcast_shapes(cshape, shape, farr.shape if farr is not None else ()))
        if tuple(cshape) == full:
            return False
        if carr is not None:
            mask = np.ascontiguousarray(np.broadcast_to(carr, full))
            node.replace_input_with(0, new_initializer(model, f"{cond.name}_full", mask))
            return True
        # computed at run time (a padding mask from an input): Expand it, once for every Where that reads it
        key = (cond.name, full)
        if key not in expanded:
            expand = ir.node("Expand", [cond, new_initializer(model, f"{node.name}_mask_shape", np.array(full, np.int64))],
                             name=f"{node.name}_mask_Expand")
            expand.outputs[0].shape, expand.outputs[0].dtype = ir.Shape(full), cond.dtype
            expand.outputs[0].name = f"{cond.name}_full"
            if cond.producer() is not None:  # beside the mask: every Where after it can read it
                model.graph.insert_after(cond.producer(), [expand])
            else:
                model.graph.insert_before(node, [expand])
            expanded[key] = expand.outputs[0]
        node.replace_input_with(0, expanded[key])
        return True

    @staticmethod
    def _fill(model: ir.Model, node: ir.Node) -> bool:
        fill = node.inputs[2]
        farr = const_array(fill)
        if farr is None or farr.size != 1 or float(farr.reshape(-1)[0]) >= _FILL_LIMIT:
            return False
        node.replace_input_with(2, new_initializer(model, f"{fill.name}_rknn", np.array(RKNN_FILL, farr.dtype).reshape(farr.shape)))
        return True


def _window_counts(shape: Sequence[int], kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int]) -> np.ndarray:
    """How many input positions (padding excluded) each output position of a 2-D pool window covers."""
    h, w = shape[-2:]
    ones = np.pad(np.ones((h, w), np.float32), ((pads[0], pads[2]), (pads[1], pads[3])))
    oh, ow = (ones.shape[0] - kernel[0]) // strides[0] + 1, (ones.shape[1] - kernel[1]) // strides[1] + 1
    return np.array([[ones[i * strides[0]:i * strides[0] + kernel[0], j * strides[1]:j * strides[1] + kernel[1]].sum()
                      for j in range(ow)] for i in range(oh)], np.float32)


class PaddedAvgPools(GraphPass):
    """Each padded 2-D ``AveragePool`` that leaves the padding out of its count (ONNX's default,
    PoolFormer's and EfficientFormer's token mixer) as one that counts it, times a constant map
    (k² / positions counted) that only the border positions differ in: RKNN 2.5.0 runs the first on the
    CPU and the second on the NPU (module docstring)."""

    name = "rknn_padded_avgpools"

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        infer_shapes(model)
        for node in list(model.graph):
            a = {k: v.value for k, v in node.attributes.items()}
            if node.op_type != "AveragePool" or a.get("count_include_pad", 0) or not any(a.get("pads", [0])):
                continue
            shape, kernel = static_shape(node.inputs[0]), list(a["kernel_shape"])
            if shape is None or len(shape) != 4 or a.get("ceil_mode", 0) or a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
                report.skipped[node.name] = "not a static 2-D pool with explicit pads and floor rounding"
                continue
            counts = _window_counts(shape, kernel, list(a.get("strides", [1, 1])), list(a["pads"]))
            node.attributes["count_include_pad"] = ir.AttrInt64("count_include_pad", 1)
            name = node.name or node.outputs[0].name
            corr = (float(np.prod(kernel)) / counts)[None, None]
            mul = ir.node("Mul", [node.outputs[0], new_initializer(model, f"{name}_count_map", corr.astype(np.float32))],
                          name=f"{name}_count_Mul")
            mul.outputs[0].shape, mul.outputs[0].dtype = node.outputs[0].shape, node.outputs[0].dtype
            append_after(model, node.outputs[0], [mul])
            report.changed += 1


def _scalar(value: ir.Value | None) -> float | None:
    arr = const_array(value)
    return float(arr.reshape(-1)[0]) if arr is not None and arr.size == 1 else None


def _other(node: ir.Node, value: ir.Value) -> ir.Value:
    return node.inputs[1] if node.inputs[0] is value else node.inputs[0]


def _unhalved_gelu(erf: ir.Node) -> tuple[ir.Value, ir.Node] | None:
    """(x, the closing Mul) of ``x · (1 + erf(x / √2))``, a GELU whose 0.5 a constant fold moved into the
    next layer, else None (a whole GELU, whose closing Mul a Mul by 0.5 reads, is None too)."""
    pre = erf.inputs[0].producer()
    if pre is None or pre.op_type not in ("Div", "Mul"):
        return None
    c = _scalar(pre.inputs[1])
    if c is None or abs(c - (np.sqrt(2.0) if pre.op_type == "Div" else 1 / np.sqrt(2.0))) > 1e-3:
        return None
    x = pre.inputs[0]
    uses = list(erf.outputs[0].uses())
    add = uses[0][0] if len(uses) == 1 and uses[0][0].op_type == "Add" else None
    if add is None or _scalar(_other(add, erf.outputs[0])) != 1.0:
        return None
    uses = list(add.outputs[0].uses())
    mul = uses[0][0] if len(uses) == 1 and uses[0][0].op_type == "Mul" else None
    if mul is None or _other(mul, add.outputs[0]) is not x:
        return None
    after = list(mul.outputs[0].uses())
    if len(after) == 1 and after[0][0].op_type == "Mul" and _scalar(_other(after[0][0], mul.outputs[0])) == 0.5:
        return None
    return x, mul


class HalvedGelus(GraphPass):
    """Each ``x · (1 + erf(x / √2))`` (a GELU whose 0.5 was folded into the next layer) followed by
    ``· 0.5 · 2``: RKNN 2.5.0 fuses only the whole GELU (``exGelu`` on the NPU) and runs a lone ``Erf`` on
    the CPU (EfficientFormerV2's MLPs: 10 Erf on the CPU); it folds the ``· 2`` into the next conv."""

    name = "rknn_halved_gelus"

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        for node in list(model.graph):
            found = _unhalved_gelu(node) if node.op_type == "Erf" else None
            if found is None:
                continue
            _, mul = found
            name = mul.name or mul.outputs[0].name
            half = ir.node("Mul", [mul.outputs[0], new_initializer(model, f"{name}_half", np.array(0.5, np.float32))],
                           name=f"{name}_gelu_half")
            double = ir.node("Mul", [half.outputs[0], new_initializer(model, f"{name}_double", np.array(2.0, np.float32))],
                             name=f"{name}_gelu_double")
            if mul.outputs[0].dtype is not None:
                for n in (half, double):
                    n.outputs[0].shape, n.outputs[0].dtype = mul.outputs[0].shape, mul.outputs[0].dtype
            append_after(model, mul.outputs[0], [half, double])
            report.changed += 1


def _runs(perm: Sequence[int], shape: Sequence[int]) -> list[list[int]]:
    """The perm's runs of input axes that stay consecutive in the output, size-1 axes left out (they
    move nothing)."""
    moved = [a for a in perm if shape[a] != 1]
    runs: list[list[int]] = []
    for a in moved:
        prev = runs[-1][-1] if runs else None
        if prev is not None and all(shape[b] == 1 for b in range(prev + 1, a)) and a > prev:
            runs[-1].append(a)
        else:
            runs.append([a])
    return runs or [[perm[0]]]


class CollapseTransposes(GraphPass):
    """Each Transpose of more than :data:`MAX_TRANSPOSE_RANK` axes whose moved axes form at most that
    many runs, as Reshape → Transpose → Reshape of the same function (see the module docstring)."""

    name = "rknn_collapse_transposes"

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        infer_shapes(model)
        for node in list(model.graph):
            if node.op_type != "Transpose" or node.attributes.get("perm") is None:
                continue
            perm = list(node.attributes["perm"].as_ints())
            shape, out_shape = static_shape(node.inputs[0]), static_shape(node.outputs[0])
            if len(perm) <= MAX_TRANSPOSE_RANK:
                continue
            if shape is None or out_shape is None:
                report.skipped[node.name] = "no static shape"
                continue
            runs = _runs(perm, shape)
            if len(runs) > MAX_TRANSPOSE_RANK:
                report.skipped[node.name] = f"{len(runs)} runs of axes move: no {MAX_TRANSPOSE_RANK}-D form"
                continue
            order = sorted(runs, key=lambda r: r[0])
            # a run spans the size-1 axes inside it: its size is the product from its first to its last axis
            merged = np.array([int(np.prod(shape[r[0]:r[-1] + 1])) for r in order], np.int64)
            name = node.name or node.outputs[0].name
            r_in = ir.node("Reshape", [node.inputs[0], new_initializer(model, f"{name}_4d_in", merged)],
                           name=f"{name}_4d_Reshape_in")
            tr = ir.node("Transpose", [r_in.outputs[0]], attributes={"perm": [order.index(r) for r in runs]},
                         name=f"{name}_4d")
            r_out = ir.node("Reshape", [tr.outputs[0], new_initializer(model, f"{name}_4d_out", np.array(out_shape, np.int64))],
                            name=f"{name}_4d_Reshape_out")
            r_out.outputs[0].shape, r_out.outputs[0].dtype = ir.Shape(out_shape), node.outputs[0].dtype
            model.graph.insert_after(node, [r_in, tr, r_out])
            ir.convenience.replace_all_uses_with(node.outputs[0], r_out.outputs[0], replace_graph_outputs=True)
            report.changed += 1
        ir_common.RemoveUnusedNodesPass()(model)


def patch_size(node: ir.Node) -> int | None:
    """p of an unpadded, ungrouped p x p stride-p Conv (p ≥ 2) with constant or Q/DQ'd weights (a
    patch embedding), else None."""
    if node.op_type != "Conv":
        return None
    w_dq = producer(node.inputs[1], "DequantizeLinear")
    w = const_array(w_dq.inputs[0]) if w_dq is not None else const_array(node.inputs[1])
    a = {k: v.as_ints() for k, v in node.attributes.items() if k in ("strides", "pads", "dilations")}
    group = node.attributes["group"].as_int() if node.attributes.get("group") is not None else 1
    if w is None or w.ndim != 4 or w.shape[2] != w.shape[3] or w.shape[2] < 2 or group != 1:
        return None
    p = int(w.shape[2])
    if list(a.get("strides", [1, 1])) != [p, p] or any(a.get("pads", [0])) or any(d != 1 for d in a.get("dilations", [1])):
        return None
    return p


def _qdq_conv(n: ir.Node) -> bool:
    return (n.op_type == "Conv" and producer(n.inputs[0], "DequantizeLinear") is not None
            and producer(n.inputs[1], "DequantizeLinear") is not None)


def patch_convs(model: ir.Model) -> list[ir.Node]:
    """Q/DQ'd patch-embedding Convs (activation and weight through DequantizeLinear)."""
    return [n for n in model.graph if patch_size(n) and _qdq_conv(n)]


def conv_stride(node: ir.Node) -> int:
    """The largest stride of a Conv (1 when it has none)."""
    a = node.attributes.get("strides")
    return max(a.as_ints()) if a is not None else 1


def space_to_depth_factor(conv: ir.Node) -> int | None:
    """The space-to-depth factor f (at most :data:`MAX_QDQ_PATCH`) that leaves a k x k stride-s Conv as an
    f x f one-hot conv and a k/f x k/f stride-s/f one RKNN compiles (s/f ≤ :data:`MAX_QDQ_STRIDE`): f
    divides the kernel, the stride, the pads and the input's height and width. None when no f does."""
    w_dq = producer(conv.inputs[1], "DequantizeLinear")
    w = const_array(w_dq.inputs[0]) if w_dq is not None else const_array(conv.inputs[1])
    shape = static_shape(conv.inputs[0])
    a = {k: list(v.as_ints()) for k, v in conv.attributes.items() if k in ("strides", "pads", "dilations")}
    group = conv.attributes["group"].as_int() if conv.attributes.get("group") is not None else 1
    strides, pads = a.get("strides", [1, 1]), a.get("pads", [0, 0, 0, 0])
    if (w is None or w.ndim != 4 or shape is None or len(shape) != 4 or group != 1 or any(d != 1 for d in a.get("dilations", [1]))
            or len(set(strides)) != 1 or w.shape[2] != w.shape[3]):
        return None
    k, st = int(w.shape[2]), strides[0]
    return next((f for f in range(MAX_QDQ_PATCH, 1, -1)
                 if k % f == 0 and st % f == 0 and st // f <= MAX_QDQ_STRIDE and not any(p % f for p in pads)
                 and shape[2] % f == 0 and shape[3] % f == 0), None)


def strided_convs(model: ir.Model) -> list[ir.Node]:
    """Q/DQ'd Convs other than patch embeddings with a stride above :data:`MAX_QDQ_STRIDE` (PiT's 16x16
    stride-8 patch conv), which RKNN crashes on."""
    return [n for n in model.graph if _qdq_conv(n) and not patch_size(n) and conv_stride(n) > MAX_QDQ_STRIDE]


@dataclass(frozen=True)
class Hazard:
    """A node rknn-toolkit2 2.5.0 crashes on or hangs on: the rule, what happens, what to do."""

    rule: str
    node: ir.Node
    problem: str
    hint: str

    def __str__(self) -> str:
        return f"node {self.node.name}: {self.problem} [{self.rule}]; {self.hint}"


#: the rule ids :func:`rknn_hazards` reports
HAZARD_RULES = ("rknn.where_broadcast", "rknn.gemm_qdq", "rknn.softmax_qdq", "rknn.patch_conv", "rknn.conv_stride")


def _where_hazard(node: ir.Node) -> Hazard | None:
    c, x = const_array(node.inputs[0]), static_shape(node.inputs[1])
    cshape = c.shape if c is not None else static_shape(node.inputs[0])
    if cshape is not None and x is not None and tuple(cshape) != tuple(np.broadcast_shapes(cshape, x)):
        return Hazard("rknn.where_broadcast", node, f"Where condition {list(cshape)} broadcasts to {list(x)}: RKNN's "
                      "masked-softmax fusion segfaults (RKNNSubgraphManager)", "write the mask full-shape")
    return None


def _node_hazard(node: ir.Node) -> Hazard | None:
    """The rule ``node`` breaks, or None."""
    if node.op_type == "Where":
        return _where_hazard(node)
    if node.op_type == "Gemm" and producer(node.inputs[0], "DequantizeLinear") is not None:
        return Hazard("rknn.gemm_qdq", node, "Gemm on a 2-D Q/DQ input: RKNN's graph optimizer loops (fuse_two_reshape) "
                      "and never finishes", "write the Linear as a 1x1 Conv")
    if node.op_type == "Softmax" and producer(node.inputs[0], "DequantizeLinear") is not None:
        return Hazard("rknn.softmax_qdq", node, "Softmax reads a DequantizeLinear: RKNN's softmax fusion segfaults "
                      "(RKNNSubgraphManager)", "quantize the scores before their scale Mul, not right before Softmax")
    p = patch_size(node)
    if p and p > MAX_QDQ_PATCH and producer(node.inputs[0], "DequantizeLinear") is not None:
        return Hazard("rknn.patch_conv", node, f"{p}x{p} stride-{p} Conv on a Q/DQ input: RKNN 2.5.0 crashes "
                      "(RKNNWeightTransposePass) or refuses it (KeyError '<input>_conv')",
                      f"split it into convs of at most {MAX_QDQ_PATCH}x{MAX_QDQ_PATCH}")
    if not p and node.op_type == "Conv" and conv_stride(node) > MAX_QDQ_STRIDE and space_to_depth_factor(node) is None:
        return Hazard("rknn.conv_stride", node, f"stride-{conv_stride(node)} Conv: RKNN 2.5.0 compiles no Conv of stride "
                      f"above {MAX_QDQ_STRIDE} (Q/DQ'd: SIGSEGV in RKNNWeightTransposePass; float: KeyError "
                      "'<input>_conv')", "no space-to-depth step of 2 to 4 divides its kernel, stride, pads and input (the qdq "
                      "layout splits one off where it does: PiT's 16x16 stride 8); change the model's stride or kernel")
    return None


def rknn_hazards(model: ir.Model) -> list[Hazard]:
    """Patterns rknn-toolkit2 2.5.0 crashes on or hangs on, one per node (``str()`` of one names the
    node, what happens and the rule). What merely runs on the CPU is not one: RKNN's op table says."""
    infer_shapes(model)
    return [h for h in (_node_hazard(n) for n in model.graph) if h]


def activation_zp_dtype(model: ir.Model) -> np.dtype:
    """The zero-point type of the file's activation QuantizeLinear nodes (uint8 unless int8 only)."""
    kinds = {const_array(n.inputs[2]).dtype for n in model.graph
             if n.op_type == "QuantizeLinear" and len(n.inputs) > 2 and const_array(n.inputs[2]) is not None}
    return np.dtype(np.int8) if kinds == {np.dtype(np.int8)} else np.dtype(np.uint8)


def append_after(model: ir.Model, value: ir.Value, chain: Sequence[ir.Node]) -> None:
    """``chain`` (nodes reading ``value``, the last one's output the result) inserted after ``value``'s
    producer; every other reader of ``value`` reads the result, and so does the graph output it was."""
    uses = [(user, idx) for user, idx in value.uses() if user not in chain]
    model.graph.insert_after(value.producer(), list(chain))
    result = chain[-1].outputs[0]
    for user, idx in uses:
        user.replace_input_with(idx, result)
    for i, out in enumerate(model.graph.outputs):
        if out is value:
            model.graph.outputs[i] = result


def output_ranges(model: ir.Model, feeds: Iterable[Mapping[str, np.ndarray]], names: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Min and max of ``names`` over ``feeds``, computed by ONNX Runtime on ``model`` (the Q/DQ model:
    the ranges the INT8 network produces, which the output Q/DQ must hold)."""
    if not names:
        return {}
    known = [o.name for o in model.graph.outputs]
    sess = Session(model, SessionConfig(), outputs=known + [n for n in names if n not in known])
    lo = {n: np.inf for n in names}
    hi = {n: -np.inf for n in names}
    for feed in feeds:
        for n, arr in zip(names, sess.run(list(names), dict(feed))):
            lo[n], hi[n] = min(lo[n], float(arr.min())), max(hi[n], float(arr.max()))
    return {n: (lo[n], hi[n]) for n in names}
