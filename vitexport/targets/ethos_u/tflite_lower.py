"""vitexport's ONNX graph as a TFLite program: the ``tflite`` route of the ethos-u targets.

Vela compiles INT8/INT16 TFLite (the format TFLite Micro runs on Ethos-U MCUs). This module lowers the
fixed-shape FP32 ONNX that ``simplify`` wrote into the float TFLite ops it computes, one ONNX node at a
time, and writes the result as a *program*: ``program.json`` (tensors, ops with their builtin options) and
``program.npz`` (constants). The Ethos-U worker serializes it as a float ``.tflite``, calibrates and
quantizes it with LiteRT's own post-training quantizer on vitexport's calibration samples (int16
activations, per-channel int8 weights: TFLite's 16x8 mode), runs it on the LiteRT interpreter and compiles
it with Vela. Nothing here imports the toolchain: the JSON is the interface.

Layout: tensors keep ONNX's shapes; an NCHW convolution is wrapped in two TRANSPOSEs (TFLite's convolutions
are NHWC), which Vela runs on the NPU. Patterns are matched: the erf form of GELU (written in its tanh form: Vela's GELU is int8-only),
``MatMul`` + bias ``Add`` (one FULLY_CONNECTED), a constant-condition ``Where`` (an attention mask: a MUL by
the 0/1 mask and an ADD of the calibrated fill, like the executorch route's). An op with no rule is :class:`BadInput` naming the node.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
from onnx import numpy_helper

from ...errors import BadInput

__all__ = ["Program", "lower_onnx", "PROGRAM_JSON", "PROGRAM_NPZ", "MASK_MARGIN"]

PROGRAM_JSON, PROGRAM_NPZ = "program.json", "program.npz"
#: masked logits get the smallest unmasked logit seen in calibration minus this (exp(-12) ≈ 6e-6): the
#: softmax input's int16 range then grows by 12 rather than by 1e9
MASK_MARGIN = 12.0
_MASK_FLOOR = -1e4
#: a transpose of rank >= _MIN_SLICE_RANK is written as at most this many slices (3 x heads) and concatenations
_MAX_SLICES = 32
_MIN_SLICE_RANK = 5


@dataclass
class Program:
    """A TFLite program in float: tensors by name (shape, constant or not), ops in execution order."""

    inputs: list[str]
    outputs: list[str]
    shapes: dict[str, list[int]]
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    ops: list[dict[str, Any]] = field(default_factory=list)
    #: each attention mask whose minus infinity became a calibrated fill: ``{node, fill}``
    mask_fill: list[dict[str, Any]] = field(default_factory=list)
    _n: int = 0

    def const(self, value: np.ndarray, hint: str, dtype: Any = np.float32) -> str:
        """A new constant tensor (its name unique)."""
        self._n += 1
        name = f"{hint}__c{self._n}"
        arr = np.asarray(value, dtype=dtype)
        self.consts[name], self.shapes[name] = arr, list(arr.shape)
        return name

    def temp(self, hint: str, shape: list[int]) -> str:
        """A new intermediate tensor."""
        self._n += 1
        name = f"{hint}__t{self._n}"
        self.shapes[name] = [int(d) for d in shape]
        return name

    def op(self, op: str, inputs: list[str | None], outputs: list[str], node: str, **options: Any) -> dict:
        entry = {"op": op, "inputs": inputs, "outputs": outputs, "options": options, "node": node}
        self.ops.append(entry)
        return entry

    def save(self, folder: Path) -> tuple[Path, Path]:
        """``program.json`` + ``program.npz`` in ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        keys = {k: f"c{i}" for i, k in enumerate(self.consts)}  # npz keys: tensor names hold "/" and ":"
        np.savez(folder / PROGRAM_NPZ, **{keys[k]: v for k, v in self.consts.items()})
        body = {"inputs": self.inputs, "outputs": self.outputs, "shapes": self.shapes, "ops": self.ops,
                "const_keys": keys}
        (folder / PROGRAM_JSON).write_text(json.dumps(body))
        return folder / PROGRAM_JSON, folder / PROGRAM_NPZ


def _moves_only_ones(shape: list[int], perm: list[int]) -> bool:
    """Whether a transpose keeps every axis longer than 1 in its order: then it is a reshape."""
    big = [a for a in perm if shape[a] > 1]
    return big == sorted(big)


class _Lowering:
    """One pass over the ONNX nodes in order; each rule writes the TFLite ops of its node."""

    def __init__(self, model: onnx.ModelProto, mask_fill: Callable[[str], float]):
        self.g = model.graph
        self.opsets = list(model.opset_import)
        self.mask_fill = mask_fill
        self.shapes: dict[str, list[int]] = {}
        for vi in [*self.g.input, *self.g.output, *self.g.value_info]:
            dims = vi.type.tensor_type.shape.dim
            self.shapes[vi.name] = [int(d.dim_value) for d in dims]
        self.values: dict[str, np.ndarray] = {i.name: numpy_helper.to_array(i) for i in self.g.initializer}
        for n in self.g.node:
            if n.op_type == "Constant":
                self.values[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        inits = set(self.values)
        self.p = Program(inputs=[i.name for i in self.g.input if i.name not in inits],
                         outputs=[o.name for o in self.g.output], shapes={})
        for name in self.p.inputs:
            self.p.shapes[name] = self.shapes[name]
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in self.g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.alias: dict[str, str] = {}
        self.skip: set[str] = set()
        #: tensors written untransposed for a BATCH_MATMUL that reads them transposed (``adj_y``)
        self.adj_y: set[str] = set()

    # -- tensors -------------------------------------------------------------------------------------
    def name(self, onnx_name: str) -> str:
        """The program tensor of an ONNX value (a constant becomes a float constant tensor)."""
        onnx_name = self.alias.get(onnx_name, onnx_name)
        if onnx_name in self.p.shapes:
            return onnx_name
        if onnx_name in self.values:
            arr = self.values[onnx_name].astype(np.float32)
            self.p.consts[onnx_name], self.p.shapes[onnx_name] = arr, list(arr.shape)
            return onnx_name
        raise BadInput(f"the tflite route cannot find value '{onnx_name}' in the ONNX graph")

    def out(self, onnx_name: str) -> str:
        self.p.shapes[onnx_name] = self.shapes_of(onnx_name)
        return onnx_name

    def shapes_of(self, onnx_name: str) -> list[int]:
        if onnx_name not in self.shapes or not all(d > 0 for d in self.shapes[onnx_name]):
            raise BadInput(f"the tflite route needs the fixed shape of '{onnx_name}' (the simplify stage's "
                           "fixed-shape file; stages.simplify.enabled)")
        return self.shapes[onnx_name]

    def const_of(self, onnx_name: str) -> np.ndarray | None:
        return self.values.get(self.alias.get(onnx_name, onnx_name))

    def attrs(self, n: onnx.NodeProto) -> dict[str, Any]:
        return {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}

    # -- the pass ------------------------------------------------------------------------------------
    def run(self) -> Program:
        for n in self.g.node:
            if n.op_type == "Constant" or n.name in self.skip:
                continue
            if n.op_type == "Shape" and n.input[0] in self.shapes:  # fixed shapes: a Shape is a constant
                self.values[n.output[0]] = np.array(self.shapes[n.input[0]], np.int64)
                continue
            if all(i in self.values or i == "" for i in n.input) and n.op_type not in ("Identity",):
                self.fold(n)
                continue
            rule = getattr(self, f"_{n.op_type}", None)
            if rule is None:
                raise BadInput(f"the tflite route has no rule for ONNX op {n.op_type} (node '{n.name}'): use "
                               "target_options.route=executorch")
            rule(n)
        for name in self.p.outputs:
            if name not in self.p.shapes:
                raise BadInput(f"the tflite route did not compute output '{name}'")
        return self.p

    def fold(self, n: onnx.NodeProto) -> None:
        """A node whose inputs are all constant: computed here with the ONNX reference evaluator."""
        from onnx.reference import ReferenceEvaluator

        inputs = [i for i in n.input if i]
        sub = onnx.helper.make_graph([n], "fold", [], [onnx.helper.make_empty_tensor_value_info(o) for o in n.output],
                                     initializer=[numpy_helper.from_array(self.values[i], i) for i in inputs])
        outs = ReferenceEvaluator(onnx.helper.make_model(sub, opset_imports=self.opsets)).run(None, {})
        for name, val in zip(n.output, outs):
            self.values[name] = np.asarray(val)

    # -- rules ---------------------------------------------------------------------------------------
    def _Identity(self, n):
        self.alias[n.output[0]] = self.alias.get(n.input[0], n.input[0])
        if n.input[0] in self.values:
            self.values[n.output[0]] = self.values[n.input[0]]

    def _binary(self, n, op):
        a, b = (self.name(i) for i in n.input)
        self.p.op(op, [a, b], [self.out(n.output[0])], n.name)

    def _Add(self, n):
        self._binary(n, "ADD")

    def _Sub(self, n):
        self._binary(n, "SUB")

    def _Mul(self, n):
        if not self._feeds_gelu(n):
            self._binary(n, "MUL")

    def _feeds_gelu(self, n) -> bool:
        """A ``x / √2`` (or ``x · 1/√2``) read only by an Erf: the GELU the Erf's rule writes computes it."""
        users = self.consumers.get(n.output[0], [])
        return len(users) == 1 and users[0].op_type == "Erf"

    def _Div(self, n):
        if self._feeds_gelu(n):
            return
        c = self.const_of(n.input[1])
        if c is not None:  # x / c = x · (1/c): TFLite's quantized DIV is CPU-only
            self.p.op("MUL", [self.name(n.input[0]), self.p.const(1.0 / c.astype(np.float64), n.name)],
                      [self.out(n.output[0])], n.name)
        else:
            self._binary(n, "DIV")

    def _Pow(self, n):
        c = self.const_of(n.input[1])
        if c is None or float(c) != 2.0:
            raise BadInput(f"the tflite route lowers Pow only with exponent 2 (node '{n.name}')")
        x = self.name(n.input[0])
        self.p.op("MUL", [x, x], [self.out(n.output[0])], n.name)

    def _unary(self, n, op, **opts):
        self.p.op(op, [self.name(n.input[0])], [self.out(n.output[0])], n.name, **opts)

    def _Relu(self, n):
        self._unary(n, "RELU")

    def _Sigmoid(self, n):
        self._unary(n, "LOGISTIC")

    def _Tanh(self, n):
        self._unary(n, "TANH")

    def _Sqrt(self, n):
        self._unary(n, "SQRT")

    def _Gelu(self, n):
        self._gelu(self.name(n.input[0]), self.out(n.output[0]), n.name)

    def _gelu(self, x: str, y: str, node: str) -> None:
        """GELU in its tanh form, ``x/2 · (1 + tanh(k·x·(1 + a·x²)))``, out of MUL, ADD and TANH: Vela runs
        TFLite's GELU on int8 only, these on int16 (the form differs from erf's by < 5e-4)."""
        k = math.sqrt(2.0 / math.pi)
        shape = self.p.shapes[x]
        x2, a, b, u, th, w, hx = (self.p.temp(node + s, shape) for s in
                                  ("_x2", "_ax2", "_inner", "_arg", "_tanh", "_one_plus", "_half"))
        self.p.op("MUL", [x, x], [x2], node)
        self.p.op("MUL", [x2, self.p.const(np.float32(0.044715 * k), node + "_a")], [a], node)
        self.p.op("ADD", [a, self.p.const(np.float32(k), node + "_k")], [b], node)
        self.p.op("MUL", [x, b], [u], node)
        self.p.op("TANH", [u], [th], node)
        self.p.op("ADD", [th, self.p.const(np.float32(1.0), node + "_one")], [w], node)
        self.p.op("MUL", [x, self.p.const(np.float32(0.5), node + "_halfc")], [hx], node)
        self.p.op("MUL", [hx, w], [y], node)

    def _Softmax(self, n):
        axis = self.attrs(n).get("axis", -1)
        if axis not in (-1, len(self.shapes_of(n.input[0])) - 1):
            raise BadInput(f"the tflite route lowers Softmax over the last axis only (node '{n.name}', axis {axis})")
        self._unary(n, "SOFTMAX", beta=1.0)

    def _Erf(self, n):
        """``0.5·x·(1 + erf(x/√2))`` (in any order of its Muls) is one GELU; a lone Erf has no TFLite op."""
        div = next((d for d in self.g.node if n.input[0] in d.output), None)
        x = div.input[0] if div is not None and div.op_type in ("Div", "Mul") else None
        add = self.consumers.get(n.output[0], [])
        chain = []
        if x is not None and len(add) == 1 and add[0].op_type == "Add":
            nxt = self.consumers.get(add[0].output[0], [])
            while len(nxt) == 1 and nxt[0].op_type == "Mul" and len(chain) < 2:
                chain.append(nxt[0])
                nxt = self.consumers.get(nxt[0].output[0], [])
        if x is None or len(chain) != 2 or x not in [*chain[0].input, *chain[1].input]:
            raise BadInput(f"the tflite route lowers Erf only inside GELU's erf form (node '{n.name}')")
        self._gelu(self.name(x), self.out(chain[1].output[0]), n.name)
        self.skip.update(m.name for m in (add[0], *chain))

    def _MatMul(self, n):
        a, b = n.input
        w = self.const_of(b)
        y = n.output[0]
        if w is None:
            self.p.op("BATCH_MATMUL", [self.name(a), self.name(b)], [self.out(y)], n.name, adj_x=False,
                      adj_y=b in self.adj_y)
            return
        if w.ndim != 2:
            raise BadInput(f"the tflite route lowers a MatMul with 2-D constant weights only (node '{n.name}')")
        bias, y = self._bias_after(n, w.shape[1])
        self.p.op("FULLY_CONNECTED", [self.name(a), self.p.const(w.T, n.name + "_w"), bias], [self.out(y)], n.name,
                  keep_num_dims=True)

    def _bias_after(self, n, width: int) -> tuple[str | None, str]:
        """The bias of an ``Add(const [N], MatMul)`` that alone reads the MatMul: folded into the FC."""
        users = self.consumers.get(n.output[0], [])
        if len(users) == 1 and users[0].op_type == "Add":
            other = [i for i in users[0].input if i != n.output[0]]
            c = self.const_of(other[0]) if other else None
            if c is not None and c.size == width and c.ndim <= 1:
                self.skip.add(users[0].name)
                return self.p.const(c.reshape(width), n.name + "_b"), users[0].output[0]
        return None, n.output[0]

    def _Gemm(self, n):
        at = self.attrs(n)
        if at.get("transA", 0) or at.get("alpha", 1.0) != 1.0 or at.get("beta", 1.0) != 1.0:
            raise BadInput(f"the tflite route lowers Gemm with transA=0, alpha=beta=1 only (node '{n.name}')")
        w = self.const_of(n.input[1])
        if w is None:
            raise BadInput(f"the tflite route lowers a Gemm with constant weights only (node '{n.name}')")
        w = w if at.get("transB", 0) else w.T
        c = self.const_of(n.input[2]) if len(n.input) > 2 and n.input[2] else None
        bias = self.p.const(np.broadcast_to(c, (w.shape[0],)), n.name + "_b") if c is not None else None
        self.p.op("FULLY_CONNECTED", [self.name(n.input[0]), self.p.const(w, n.name + "_w"), bias],
                  [self.out(n.output[0])], n.name, keep_num_dims=True)

    def _Conv(self, n):
        at = self.attrs(n)
        w = self.const_of(n.input[1])
        shape = self.shapes_of(n.input[0])
        if w is None or w.ndim != 4 or len(shape) != 4:
            raise BadInput(f"the tflite route lowers 2-D convolutions with constant weights only (node '{n.name}')")
        if any(d != 1 for d in at.get("dilations", [1, 1])):
            raise BadInput(f"the tflite route lowers undilated convolutions only (node '{n.name}')")
        group = at.get("group", 1)
        cin, cout = shape[1], w.shape[0]
        b = self.const_of(n.input[2]) if len(n.input) > 2 and n.input[2] else np.zeros(cout, np.float32)
        x = self._nhwc(n, self.name(n.input[0]), shape)
        pads = at.get("pads", [0, 0, 0, 0])
        if any(pads):
            padded = self.p.temp(n.name + "_pad", [shape[0], shape[2] + pads[0] + pads[2], shape[3] + pads[1] + pads[3],
                                                   cin])
            self.p.op("PAD", [x, self.p.const([[0, 0], [pads[0], pads[2]], [pads[1], pads[3]], [0, 0]], n.name + "_pads",
                                               np.int32)], [padded], n.name)
            x = padded
        oshape = self.shapes_of(n.output[0])
        y = self.p.temp(n.name + "_nhwc", [oshape[0], oshape[2], oshape[3], oshape[1]])
        sh, sw = at.get("strides", [1, 1])
        if group == 1:
            self.p.op("CONV_2D", [x, self.p.const(w.transpose(0, 2, 3, 1), n.name + "_w"), self.p.const(b, n.name + "_b")],
                      [y], n.name, padding="VALID", stride_h=sh, stride_w=sw)
        elif group == cin and w.shape[1] == 1:
            self.p.op("DEPTHWISE_CONV_2D", [x, self.p.const(w.transpose(1, 2, 3, 0), n.name + "_w"),
                                            self.p.const(b, n.name + "_b")], [y], n.name, padding="VALID", stride_h=sh,
                      stride_w=sw, depth_multiplier=cout // cin)
        else:
            raise BadInput(f"the tflite route lowers plain and depthwise convolutions only (node '{n.name}', group {group})")
        tokens = self._tokens_after(n)
        if tokens is not None:
            shape = self.shapes_of(tokens)
            self.p.op("RESHAPE", [y, self.p.const(shape, n.name + "_tokens", np.int32)], [self.out(tokens)], n.name,
                      new_shape=shape)
        else:
            self._transpose(n, y, self.p.shapes[y], [0, 3, 1, 2], self.out(n.output[0]))

    def _nhwc(self, n, x: str, shape: list[int]) -> str:
        t = self.p.temp(n.name + "_in_nhwc", [shape[0], shape[2], shape[3], shape[1]])
        self._transpose(n, x, shape, [0, 2, 3, 1], t)
        return t

    def _tokens_after(self, n) -> str | None:
        """A ViT's patch embedding: the conv's output flattened to ``[N, C, H·W]`` and transposed to
        ``[N, H·W, C]`` is the NHWC output reshaped; the ONNX value that ends the pattern, or None."""
        users = self.consumers.get(n.output[0], [])
        if len(users) != 1 or users[0].op_type not in ("Reshape", "Flatten"):
            return None
        flat = self.shapes.get(users[0].output[0], [])
        nxt = self.consumers.get(users[0].output[0], [])
        if len(flat) != 3 or len(nxt) != 1 or nxt[0].op_type != "Transpose" or \
                list(self.attrs(nxt[0]).get("perm", [])) != [0, 2, 1]:
            return None
        self.skip.update((users[0].name, nxt[0].name))
        return nxt[0].output[0]

    def _reshape_to(self, n, x: str, y: str):
        shape = self.shapes_of(y)
        self.p.op("RESHAPE", [x, self.p.const(shape, n.name + "_shape", np.int32)], [self.out(y)], n.name,
                  new_shape=shape)

    def _Reshape(self, n):
        self._reshape_to(n, self.name(n.input[0]), n.output[0])

    _Flatten = _Squeeze = _Unsqueeze = _Reshape

    def _Transpose(self, n):
        shape = self.shapes_of(n.input[0])
        rank = len(shape)
        perm = [int(a) for a in (self.attrs(n).get("perm") or reversed(range(rank)))]
        users = self.consumers.get(n.output[0], [])
        x = self.name(n.input[0])
        if (rank >= 3 and perm[-2] == rank - 1 and len(users) == 1 and users[0].op_type == "MatMul"
                and users[0].input[1] == n.output[0] and self.const_of(users[0].input[0]) is None):
            # attention's kᵀ: the matmul reads its second operand transposed (adj_y); what is left to move
            # is the permutation with the last two axes swapped back
            self.adj_y.add(n.output[0])
            perm = [*perm[:-2], perm[-1], perm[-2]]
            oshape = [shape[a] for a in perm]
            if perm == list(range(rank)):
                self.p.op("RESHAPE", [x, self.p.const(oshape, n.name + "_shape", np.int32)], [n.output[0]], n.name,
                          new_shape=oshape)
                self.p.shapes[n.output[0]] = oshape
                return
            self.p.shapes[n.output[0]] = oshape
            y = n.output[0]
        else:
            y = self.out(n.output[0])
        self._transpose(n, x, shape, perm, y)

    def _transpose(self, n, x: str, shape: list[int], perm: list[int], y: str) -> None:
        """A RESHAPE when only size-1 axes move, else slices (:meth:`_transpose_by_slices`), else a TRANSPOSE."""
        if _moves_only_ones(shape, perm):
            oshape = [shape[a] for a in perm]
            self.p.op("RESHAPE", [x, self.p.const(oshape, n.name + "_shape", np.int32)], [y], n.name, new_shape=oshape)
        elif not self._transpose_by_slices(n, x, shape, perm, y):
            self.p.op("TRANSPOSE", [x, self.p.const(perm, n.name + "_perm", np.int32)], [y], n.name)

    def _transpose_by_slices(self, n, x: str, shape: list[int], perm: list[int], y: str) -> bool:
        """A transpose of rank ≥ 5 that keeps the last axis in place, written as SLICEs and nested
        CONCATENATIONs: timm's split into heads (``[1, T, 3, H, D] → [3, 1, H, T, D]``). Vela decomposes a
        rank-5 TRANSPOSE into a long chain of its primitives (the 4-block digits ViT: 63 % of its NPU cycles,
        5.90 M → 2.56 M cycles with slices); rank-4 transposes stay (the demo's [1, T, H, D] swaps cost Vela
        30.8 k cycles as TRANSPOSEs, 79 k as slices and concatenations). False (nothing written) when the
        last axis moves, the rank is below :data:`_MIN_SLICE_RANK`, or it would take more than
        :data:`_MAX_SLICES` slices."""
        rank = len(shape)
        if perm[-1] != rank - 1 or perm == list(range(rank)) or rank < _MIN_SLICE_RANK:
            return False
        whole = max(range(rank - 1), key=lambda a: shape[a])  # the input axis each slice keeps whole
        loop = [a for a in range(rank - 1) if a != whole and shape[a] > 1]
        if int(np.prod([shape[a] for a in loop])) > _MAX_SLICES:
            return False
        oshape = [shape[a] for a in perm]
        order = sorted(perm.index(a) for a in loop)  # the output axes the concatenations rebuild, outermost first
        count = [0]
        # Vela copies a slice whose batch axis exceeds 1 one batch row at a time (65 copies per slice of a ViT's
        # [1, T, 3, H, D] squeezed to [T, 3, H, D]): the sliced tensor drops its size-1 axes, merges adjacent
        # sliced axes (3·H) and takes leading 1s, so the whole axis is never the batch
        groups: list[list[int]] = []
        for a in range(rank):
            if shape[a] == 1:
                continue
            if groups and a in loop and groups[-1][-1] in loop and groups[-1][-1] == a - 1:
                groups[-1].append(a)
            else:
                groups.append([a])
        lead = max(0, 4 - len(groups))
        sshape = [1] * lead + [int(np.prod([shape[a] for a in g])) for g in groups]
        where = {a: (lead + gi, int(np.prod([shape[b] for b in g[k + 1:]])))
                 for gi, g in enumerate(groups) for k, a in enumerate(g)}
        if sshape != list(shape):
            flat = self.p.temp(n.name + "_grouped", sshape)
            self.p.op("RESHAPE", [x, self.p.const(sshape, n.name + "_shape", np.int32)], [flat], n.name,
                      new_shape=sshape)
            x = flat

        def build(fixed: dict[int, int], depth: int, target: str | None) -> str:
            # at depth d the output axes order[d:] are whole, order[:d] fixed by the enclosing loops
            out_shape = [1 if i in order[:depth] else oshape[i] for i in range(rank)]
            if depth == len(order):
                begin, size = [0] * len(sshape), list(sshape)
                for a, i in fixed.items():  # a loop group's members are all fixed here: one index into it
                    axis, stride = where[a]
                    begin[axis] += i * stride
                    size[axis] = 1
                count[0] += 1
                t = self.p.temp(f"{n.name}_part{count[0]}", size)
                self.p.op("SLICE", [x, self.p.const(begin, n.name + "_begin", np.int32),
                                    self.p.const(size, n.name + "_size", np.int32)], [t], n.name)
                r = target or self.p.temp(f"{n.name}_part{count[0]}_moved", out_shape)
                self.p.op("RESHAPE", [t, self.p.const(out_shape, n.name + "_shape", np.int32)], [r], n.name,
                          new_shape=out_shape)
                return r
            axis = order[depth]
            parts = [build({**fixed, perm[axis]: i}, depth + 1, None) for i in range(shape[perm[axis]])]
            r = target or self.p.temp(f"{n.name}_cat{depth}", out_shape)
            self.p.op("CONCATENATION", parts, [r], n.name, axis=axis)
            return r

        build({}, 0, y)
        return True

    def _Concat(self, n):
        axis = self.attrs(n)["axis"]
        rank = len(self.shapes_of(n.output[0]))
        self.p.op("CONCATENATION", [self.name(i) for i in n.input], [self.out(n.output[0])], n.name,
                  axis=axis % rank)

    def _Split(self, n):
        shape = self.shapes_of(n.input[0])
        axis = self.attrs(n).get("axis", 0) % len(shape)
        sizes = [self.shapes_of(o)[axis] for o in n.output]
        outs = [self.out(o) for o in n.output]
        ax = self.p.const(axis, n.name + "_axis", np.int32)
        if len(set(sizes)) == 1:
            self.p.op("SPLIT", [ax, self.name(n.input[0])], outs, n.name, num_splits=len(outs))
        else:
            self.p.op("SPLIT_V", [self.name(n.input[0]), self.p.const(sizes, n.name + "_sizes", np.int32), ax], outs,
                      n.name, num_splits=len(outs))

    def _slice(self, n, x: str, begin: list[int], size: list[int], y: str):
        """SLICE then a RESHAPE to the ONNX output's shape (the sliced axis dropped by Gather)."""
        t = self.p.temp(n.name + "_slice", size)
        self.p.op("SLICE", [x, self.p.const(begin, n.name + "_begin", np.int32),
                            self.p.const(size, n.name + "_size", np.int32)], [t], n.name)
        self._reshape_to(n, t, y)

    def _Gather(self, n):
        idx = self.const_of(n.input[1])
        shape = self.shapes_of(n.input[0])
        if idx is None or idx.size != 1:
            raise BadInput(f"the tflite route lowers a Gather of one constant index only (node '{n.name}')")
        axis = self.attrs(n).get("axis", 0) % len(shape)
        i = int(idx.reshape(-1)[0]) % shape[axis]
        begin, size = [0] * len(shape), list(shape)
        begin[axis], size[axis] = i, 1
        self._slice(n, self.name(n.input[0]), begin, size, n.output[0])

    def _Slice(self, n):
        shape = self.shapes_of(n.input[0])
        starts, ends = self.const_of(n.input[1]), self.const_of(n.input[2])
        axes = self.const_of(n.input[3]) if len(n.input) > 3 and n.input[3] else np.arange(len(starts))
        steps = self.const_of(n.input[4]) if len(n.input) > 4 and n.input[4] else np.ones(len(starts), np.int64)
        if starts is None or ends is None or axes is None or steps is None or np.any(steps != 1):
            raise BadInput(f"the tflite route lowers a Slice with constant bounds and step 1 only (node '{n.name}')")
        begin, size = [0] * len(shape), list(shape)
        for s, e, a in zip(starts, ends, axes):
            a = int(a) % len(shape)
            s0 = int(np.clip(s if s >= 0 else s + shape[a], 0, shape[a]))
            e0 = int(np.clip(e if e >= 0 else e + shape[a], 0, shape[a]))
            begin[a], size[a] = s0, e0 - s0
        self._slice(n, self.name(n.input[0]), begin, size, n.output[0])

    def _ReduceMean(self, n):
        at = self.attrs(n)
        axes = at.get("axes")
        if axes is None and len(n.input) > 1:
            axes = [int(a) for a in self.const_of(n.input[1])]
        shape = self.shapes_of(n.input[0])
        rank = len(shape)
        axes = sorted(a % rank for a in (axes if axes is not None else range(rank)))
        if axes == list(range(rank - len(axes), rank)):
            self._mean_last(n, self.name(n.input[0]), shape, len(axes), self.out(n.output[0]))
            return
        self.p.op("MEAN", [self.name(n.input[0]), self.p.const(axes, n.name + "_axes", np.int32)],
                  [self.out(n.output[0])], n.name, keep_dims=bool(at.get("keepdims", 1)))

    def _GlobalAveragePool(self, n):
        self._mean_last(n, self.name(n.input[0]), self.shapes_of(n.input[0]), 2, self.out(n.output[0]))

    def _mean_last(self, n, x: str, shape: list[int], k: int, y: str) -> None:
        """The mean over the last ``k`` axes as a MEAN over the last axis of ``[1, rest, reduced]``: Vela reduces
        over depth only when one of h, w, c is 1 (a MobileViT's LayerNorm over ``[1, 4, 16, 64]`` and its
        global pool over an NCHW ``[1, 320, 2, 2]`` went to the CPU)."""
        flat = [1, int(np.prod(shape[:-k])), int(np.prod(shape[-k:]))]
        t, m = self.p.temp(n.name + "_flat", flat), self.p.temp(n.name + "_mean", flat[:2] + [1])
        self.p.op("RESHAPE", [x, self.p.const(flat, n.name + "_shape", np.int32)], [t], n.name, new_shape=flat)
        self.p.op("MEAN", [t, self.p.const([2], n.name + "_axes", np.int32)], [m], n.name, keep_dims=True)
        out = self.p.shapes[y]
        self.p.op("RESHAPE", [m, self.p.const(out, n.name + "_shape", np.int32)], [y], n.name, new_shape=out)

    def _LayerNormalization(self, n):
        """MEAN, SUB, MUL, MEAN, ADD ε, RSQRT, MUL (then γ, β unless 1 and 0): TFLite has no LayerNorm op."""
        at = self.attrs(n)
        shape = self.shapes_of(n.input[0])
        if at.get("axis", -1) % len(shape) != len(shape) - 1:
            raise BadInput(f"the tflite route lowers LayerNormalization over the last axis only (node '{n.name}')")
        x = self.name(n.input[0])
        y = self.out(n.output[0])
        flat = [1, int(np.prod(shape[:-1])), shape[-1]]
        if shape != flat:  # Vela reduces over depth only when one of h, w, c is 1: normalise [1, tokens, C]
            t = self.p.temp(n.name + "_tokens", flat)
            self.p.op("RESHAPE", [x, self.p.const(flat, n.name + "_shape", np.int32)], [t], n.name, new_shape=flat)
            x, shape, final, y = t, flat, y, self.p.temp(n.name + "_normed", flat)
        else:
            final = None
        red = shape[:-1] + [1]
        axes = self.p.const([len(shape) - 1], n.name + "_axes", np.int32)
        mean, d, sq, var, ve, r = (self.p.temp(n.name + s, sh) for s, sh in
                                   (("_mean", red), ("_centred", shape), ("_sq", shape), ("_var", red), ("_var_eps", red),
                                    ("_rstd", red)))
        self.p.op("MEAN", [x, axes], [mean], n.name, keep_dims=True)
        self.p.op("SUB", [x, mean], [d], n.name)
        self.p.op("MUL", [d, d], [sq], n.name)
        self.p.op("MEAN", [sq, axes], [var], n.name, keep_dims=True)
        self.p.op("ADD", [var, self.p.const(np.float32(at.get("epsilon", 1e-5)), n.name + "_eps")], [ve], n.name)
        self.p.op("RSQRT", [ve], [r], n.name)
        gamma = self.const_of(n.input[1]) if len(n.input) > 1 and n.input[1] else None
        beta = self.const_of(n.input[2]) if len(n.input) > 2 and n.input[2] else None
        steps: list[tuple[str, str]] = []
        if gamma is not None and not np.all(gamma == 1):
            steps.append(("MUL", self.name(n.input[1])))
        if beta is not None and np.any(beta != 0):
            steps.append(("ADD", self.name(n.input[2])))
        cur = self.p.temp(n.name + "_norm", shape) if steps else y
        self.p.op("MUL", [d, r], [cur], n.name)
        for i, (op, c) in enumerate(steps):
            nxt = y if i == len(steps) - 1 else self.p.temp(n.name + "_affine", shape)
            self.p.op(op, [cur, c], [nxt], n.name)
            cur = nxt
        if final is not None:
            out = self.p.shapes[final]
            self.p.op("RESHAPE", [y, self.p.const(out, n.name + "_shape", np.int32)], [final], n.name, new_shape=out)

    def _Where(self, n):
        """``where(const mask, x, fill)`` → ``x + bias`` (bias 0 where kept, the calibrated fill elsewhere)."""
        cond, a, b = n.input
        c = self.const_of(cond)
        ca, cb = self.const_of(a), self.const_of(b)
        if c is None or (ca is None) == (cb is None):
            raise BadInput(f"the tflite route lowers a Where with a constant condition and one constant branch only "
                           f"(node '{n.name}')")
        keep = c.astype(bool) if cb is not None else ~c.astype(bool)
        x, fill = (a, cb) if cb is not None else (b, ca)
        shape = self.shapes_of(n.output[0])
        fill = np.broadcast_to(np.asarray(fill, np.float32), shape)
        if np.any(fill <= _MASK_FLOOR):
            value = self.mask_fill(x)
            fill = np.where(fill <= _MASK_FLOOR, value, fill)
            self.p.mask_fill.append({"node": n.name, "fill": round(float(value), 3)})
        keep = np.broadcast_to(keep, shape)
        kept = self.p.temp(n.name + "_kept", shape)
        self.p.op("MUL", [self.name(x), self.p.const(keep.astype(np.float32), n.name + "_keep")], [kept], n.name)
        self.p.op("ADD", [kept, self.p.const(np.where(keep, 0.0, fill), n.name + "_fill")], [self.out(n.output[0])],
                  n.name)

    def _Clip(self, n):
        lo = self.const_of(n.input[1]) if len(n.input) > 1 and n.input[1] else None
        hi = self.const_of(n.input[2]) if len(n.input) > 2 and n.input[2] else None
        if lo is not None and hi is not None and float(lo) == 0.0 and float(hi) == 6.0:
            self._unary(n, "RELU6")
        elif lo is not None and float(lo) == 0.0 and hi is None:
            self._unary(n, "RELU")
        else:
            raise BadInput(f"the tflite route lowers Clip as ReLU or ReLU6 only (node '{n.name}')")

    def _HardSwish(self, n):
        self._unary(n, "HARD_SWISH")


def lower_onnx(path: Path, mask_fill: Callable[[str], float] | None = None) -> Program:
    """Lower the fixed-shape ONNX at ``path`` to a float TFLite program.

    Args:
        path: an ONNX file with fixed shapes (``model.fp32.onnx`` after ``simplify``).
        mask_fill: the fill of an attention mask's minus infinity, given the masked tensor's ONNX name
            (default: -1e4 is kept as it is).
    Raises:
        BadInput: an op (or a form of one) the route has no rule for, naming the node.
    """
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)), data_prop=True)
    return _Lowering(model, mask_fill or (lambda _name: _MASK_FLOOR)).run()


def calibrated_mask_fill(path: Path, feeds: list[dict[str, np.ndarray]]) -> Callable[[str], float]:
    """A mask fill from data: the smallest value the masked tensor takes on ``feeds`` minus
    :data:`MASK_MARGIN` (computed with ONNX Runtime on the FP32 file)."""
    import onnxruntime as ort

    cache: dict[str, float] = {}

    def fill(name: str) -> float:
        if name not in cache:
            model = onnx.load(str(path))
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
            sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            lows = [float(sess.run([name], f)[0].min()) for f in feeds]
            cache[name] = min(lows) - MASK_MARGIN
        return cache[name]

    return fill


