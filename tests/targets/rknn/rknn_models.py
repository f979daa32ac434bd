"""Tiny ONNX graphs for the RKNN tests, written with onnx.helper (seconds to compile with RKNN)."""
from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper as nh
from onnx import TensorProto, helper

__all__ = ["masked_attention", "qdq_linear", "qdq_patch_conv", "qdq_attention", "patch_merging", "qdq_convs", "CONV_MACS",
           "qdq_hybrid_block", "qdq_strided_conv", "qdq_unhalved_gelu",
           "TOKENS", "DIM", "HEADS"]

TOKENS, DIM, HEADS = 8, 16, 2


def _model(nodes, inits, out_shape, in_shape=(1, 1, TOKENS, DIM), extra_inputs=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape)), *extra_inputs],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def masked_attention(seed: int = 0, pad: int = 3, fill: float = -3.4e38, runtime_mask: bool = False) -> onnx.ModelProto:
    """x[1,1,T,D] → Linear → softmax(x·xᵀ masked) · x: the last ``pad`` keys masked with a broadcast
    ``bool[1,1,1,T]`` condition, as vitexport's mask_to_where writes it; ``runtime_mask``: the condition
    is a second input ``keep`` (a padding mask that arrives with the data)."""
    rs = np.random.RandomState(seed)
    keep = np.ones((1, 1, 1, TOKENS), bool)
    keep[..., TOKENS - pad:] = False
    inits = [nh.from_array((rs.randn(DIM, DIM) * 0.3).astype(np.float32), "w"),
             nh.from_array(keep, "keep"), nh.from_array(np.array(fill, np.float32), "fill"),
             nh.from_array(np.array(DIM ** -0.5, np.float32), "scale")]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="linear"),
        helper.make_node("Transpose", ["h"], ["ht"], perm=[0, 1, 3, 2], name="kt"),
        helper.make_node("MatMul", ["h", "ht"], ["s0"], name="qk"),
        helper.make_node("Mul", ["s0", "scale"], ["s"], name="scale_mul"),
        helper.make_node("Where", ["keep", "s", "fill"], ["sm"], name="mask_where"),
        helper.make_node("Softmax", ["sm"], ["p"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["p", "h"], ["y"], name="pv"),
    ]
    if not runtime_mask:
        return _model(nodes, inits, (1, 1, TOKENS, DIM))
    keep_input = helper.make_tensor_value_info("keep", TensorProto.BOOL, [1, 1, 1, TOKENS])
    return _model(nodes, [i for i in inits if i.name != "keep"], (1, 1, TOKENS, DIM), extra_inputs=[keep_input])


def _qdq(nodes, inits, x: str, scale: float, tag: str) -> str:
    inits += [nh.from_array(np.array(scale, np.float32), f"{tag}_s"), nh.from_array(np.array(0, np.int8), f"{tag}_z")]
    nodes.append(helper.make_node("QuantizeLinear", [x, f"{tag}_s", f"{tag}_z"], [f"{tag}_q"], name=f"{tag}_Q"))
    nodes.append(helper.make_node("DequantizeLinear", [f"{tag}_q", f"{tag}_s", f"{tag}_z"], [f"{tag}_dq"], name=f"{tag}_DQ"))
    return f"{tag}_dq"


def qdq_linear(seed: int = 0, cout: int = 32, qmax: int = 127) -> onnx.ModelProto:
    """x[1,T,D] → Q/DQ → MatMul(DQ(int8 W[D,cout]) per output channel, |q| <= qmax) → + bias → Relu: the
    layout vitexport's quantizer writes for a Linear."""
    rs = np.random.RandomState(seed)
    w = (rs.randn(DIM, cout) * 0.2).astype(np.float32)
    ws = np.abs(w).max(axis=0) / qmax
    nodes: list = []
    inits = [nh.from_array(np.round(w / ws).astype(np.int8), "wq"), nh.from_array(ws.astype(np.float32), "ws"),
             nh.from_array(np.zeros(cout, np.int8), "wz"), nh.from_array((rs.randn(cout) * 0.1).astype(np.float32), "b")]
    xin = _qdq(nodes, inits, "x", 4.0 / 127, "x")
    nodes += [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=1, name="w_DQ"),
              helper.make_node("MatMul", [xin, "w"], ["mm"], name="linear"),
              helper.make_node("Add", ["mm", "b"], ["lin"], name="bias"),
              helper.make_node("Relu", ["lin"], ["y"], name="relu")]
    return _model(nodes, inits, (1, TOKENS, cout), in_shape=(1, TOKENS, DIM))


def qdq_patch_conv(seed: int = 0, chans: int = 3, size: int = 16, patch: int = 4, dim: int = 24) -> onnx.ModelProto:
    """x[1,C,H,W] → Q/DQ → Conv p x p stride p (int8 weights per output channel, bias) → Relu: a
    patch embedding as vitexport's quantizer writes it."""
    rs = np.random.RandomState(seed)
    w = (rs.randn(dim, chans, patch, patch) * 0.2).astype(np.float32)
    ws = np.abs(w).reshape(dim, -1).max(axis=1) / 127
    nodes: list = []
    inits = [nh.from_array(np.round(w / ws[:, None, None, None]).astype(np.int8), "wq"),
             nh.from_array(ws.astype(np.float32), "ws"), nh.from_array(np.zeros(dim, np.int8), "wz"),
             nh.from_array((rs.randn(dim) * 0.1).astype(np.float32), "b")]
    xin = _qdq(nodes, inits, "x", 4.0 / 127, "x")
    nodes += [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0, name="w_DQ"),
              helper.make_node("Conv", [xin, "w", "b"], ["c"], kernel_shape=[patch, patch], strides=[patch, patch],
                               name="patch"),
              helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return _model(nodes, inits, (1, dim, size // patch, size // patch), in_shape=(1, chans, size, size))


def qdq_attention(seed: int = 0, batch: int = 1) -> onnx.ModelProto:
    """q, k, v [batch, H, T, D] → softmax((q·s) Kᵀ) · v as vitexport's quantizer writes timm's attention:
    the 1/√d scale on q before its Q/DQ, Kᵀ and v Q/DQ'd right before their MatMuls, the scores
    unquantized straight into Softmax, the probabilities Q/DQ'd into attn·V, whose output is Q/DQ'd after
    the heads' Transpose (the next Linear's input). ``batch`` > 1: Swin's windows, one batch row each."""
    del seed  # the inputs carry the data
    nodes: list = []
    inits = [nh.from_array(np.array(DIM ** -0.5, np.float32), "scale")]
    nodes.append(helper.make_node("Mul", ["q", "scale"], ["qs"], name="q_scale"))
    nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2], name="kt"))
    qq, kq, vq = _qdq(nodes, inits, "qs", 1.0 / 127, "qa"), _qdq(nodes, inits, "kt", 4.0 / 127, "ka"), _qdq(nodes, inits, "v", 4.0 / 127, "va")
    nodes += [helper.make_node("MatMul", [qq, kq], ["scores"], name="qk"),
              helper.make_node("Softmax", ["scores"], ["p"], axis=-1, name="softmax")]
    pq = _qdq(nodes, inits, "p", 1.0 / 127, "pa")
    nodes += [helper.make_node("MatMul", [pq, vq], ["o"], name="pv"),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3], name="heads_back")]
    _qdq(nodes, inits, "ot", 4.0 / 127, "y")  # the next Linear's input Q/DQ
    nodes[-1].output[0] = "y"
    shape = [batch, HEADS, TOKENS, DIM]
    extra = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("k", "v")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("q", TensorProto.FLOAT, shape), *extra],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, TOKENS, HEADS, DIM])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def patch_merging(grid: int = 4, dim: int = 8) -> onnx.ModelProto:
    """Swin's patch merging as timm exports it: x[1, grid², C] → [1, g/2, 2, g/2, 2, C] → Transpose(0,1,3,4,2,5)
    → [1, g/2, g/2, 4C] → Linear."""
    rs = np.random.RandomState(0)
    h = grid // 2
    inits = [nh.from_array(np.array([1, h, 2, h, 2, dim], np.int64), "s6"), nh.from_array(np.array([1, h, h, 4 * dim], np.int64), "s4"),
             nh.from_array((rs.randn(4 * dim, dim) * 0.2).astype(np.float32), "w")]
    nodes = [helper.make_node("Reshape", ["x", "s6"], ["r6"], name="r6"),
             helper.make_node("Transpose", ["r6"], ["t"], perm=[0, 1, 3, 4, 2, 5], name="merge"),
             helper.make_node("Reshape", ["t", "s4"], ["r4"], name="r4"),
             helper.make_node("MatMul", ["r4", "w"], ["y"], name="reduction")]
    return _model(nodes, inits, (1, h, h, dim), in_shape=(1, grid * grid, dim))


#: the convolutions of :func:`qdq_convs`: name → (groups, C_in, C_out, kernel, stride, MACs counted by
#: hand: output positions × C_out × C_in/groups × k²)
CONV_MACS = {
    "patch": (1, 3, 16, 4, 4, 4 * 4 * 16 * 3 * 4 * 4),  # 16x16 input, 4x4 stride 4: a 4x4 grid
    "depthwise": (16, 16, 16, 3, 1, 4 * 4 * 16 * 1 * 3 * 3),
    "grouped": (4, 16, 16, 3, 1, 4 * 4 * 16 * 4 * 3 * 3),
    "pointwise": (1, 16, 32, 1, 1, 4 * 4 * 32 * 16 * 1 * 1),
}


def qdq_convs(seed: int = 0) -> onnx.ModelProto:
    """x[1,3,16,16] → a 4x4 stride-4 patch conv → a 3x3 depthwise conv → a 3x3 conv in 4 groups → a 1x1
    conv to 32 channels (each Q/DQ'd as vitexport's quantizer writes it, a Relu after each): the
    convolutions of a hybrid ViT (MobileViT, EfficientFormer), whose MACs :data:`CONV_MACS` counts."""
    rs = np.random.RandomState(seed)
    nodes: list = []
    inits: list = []
    x = "x"
    for name, (groups, cin, cout, k, stride, _) in CONV_MACS.items():
        w = (rs.randn(cout, cin // groups, k, k) * 0.3).astype(np.float32)
        ws = np.abs(w).reshape(cout, -1).max(axis=1) / 127
        inits += [nh.from_array(np.round(w / ws[:, None, None, None]).astype(np.int8), f"{name}_wq"),
                  nh.from_array(ws.astype(np.float32), f"{name}_ws"), nh.from_array(np.zeros(cout, np.int8), f"{name}_wz"),
                  nh.from_array((rs.randn(cout) * 0.1).astype(np.float32), f"{name}_b")]
        xin = _qdq(nodes, inits, x, 4.0 / 127, f"{name}_x")
        pad = (k - 1) // 2 if stride == 1 else 0
        nodes += [helper.make_node("DequantizeLinear", [f"{name}_wq", f"{name}_ws", f"{name}_wz"], [f"{name}_w"], axis=0,
                                   name=f"{name}_w_DQ"),
                  helper.make_node("Conv", [xin, f"{name}_w", f"{name}_b"], [f"{name}_c"], kernel_shape=[k, k],
                                   strides=[stride, stride], pads=[pad] * 4, group=groups, name=name),
                  helper.make_node("Relu", [f"{name}_c"], [f"{name}_r"], name=f"{name}_relu")]
        x = f"{name}_r"
    nodes[-1].output[0] = "y"
    return _model(nodes, inits, (1, 32, 4, 4), in_shape=(1, 3, 16, 16))


def _act(nodes, inits, x: str, act: str, tag: str) -> str:
    """``x`` through an activation as timm exports it at opset 13 (SiLU: x·sigmoid(x); HardSwish: x·hardsigmoid(x))."""
    if act == "relu":
        nodes.append(helper.make_node("Relu", [x], [f"{tag}_a"], name=f"{tag}_relu"))
    elif act == "clip":
        inits += [nh.from_array(np.array(0, np.float32), f"{tag}_lo"), nh.from_array(np.array(6, np.float32), f"{tag}_hi")]
        nodes.append(helper.make_node("Clip", [x, f"{tag}_lo", f"{tag}_hi"], [f"{tag}_a"], name=f"{tag}_clip"))
    else:
        gate = helper.make_node("Sigmoid", [x], [f"{tag}_g"], name=f"{tag}_sigmoid") if act == "silu" else \
            helper.make_node("HardSigmoid", [x], [f"{tag}_g"], alpha=1 / 6, beta=0.5, name=f"{tag}_hardsigmoid")
        nodes += [gate, helper.make_node("Mul", [x, f"{tag}_g"], [f"{tag}_a"], name=f"{tag}_{act}")]
    return f"{tag}_a"


def _qconv(nodes, inits, rs, x: str, name: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
           pad: int | None = None, bias: bool = True) -> str:
    """A Conv reading ``x`` (already DQ'd) with int8 weights per output channel, as vitexport's quantizer writes it."""
    w = (rs.randn(cout, cin // groups, k, k) * (1.5 / np.sqrt(cin // groups * k * k))).astype(np.float32)
    ws = np.abs(w).reshape(cout, -1).max(axis=1) / 127
    inits += [nh.from_array(np.round(w / ws[:, None, None, None]).astype(np.int8), f"{name}_wq"),
              nh.from_array(ws.astype(np.float32), f"{name}_ws"), nh.from_array(np.zeros(cout, np.int8), f"{name}_wz")]
    ins = [x, f"{name}_w"]
    if bias:
        inits.append(nh.from_array((rs.randn(cout) * 0.1).astype(np.float32), f"{name}_b"))
        ins.append(f"{name}_b")
    p = (k - 1) // 2 if pad is None else pad
    nodes += [helper.make_node("DequantizeLinear", [f"{name}_wq", f"{name}_ws", f"{name}_wz"], [f"{name}_w"], axis=0, name=f"{name}_w_DQ"),
              helper.make_node("Conv", ins, [f"{name}_c"], kernel_shape=[k, k], strides=[stride, stride], pads=[p] * 4,
                               group=groups, name=name)]
    return f"{name}_c"


def qdq_hybrid_block(seed: int = 0, act: str = "relu", chans: int = 16, size: int = 16) -> onnx.ModelProto:
    """A hybrid's conv block as vitexport's quantizer writes it (each op's *input* Q/DQ'd, no output
    Q/DQ): x → 3x3 conv (bias) → act → depthwise 3x3 (no bias) → act → PoolFormer's token mixer
    (AveragePool 3x3 stride 1 pad 1 without the padding in its count, minus its input) → 1x1 conv →
    + the block's input (a residual) → GlobalAveragePool. ``act``: relu, clip, silu, hardswish."""
    rs = np.random.RandomState(seed)
    nodes: list = []
    inits: list = []
    x0 = _qdq(nodes, inits, "x", 3.0 / 127, "x")
    h = _act(nodes, inits, _qconv(nodes, inits, rs, x0, "conv3x3", chans, chans, 3), act, "a1")
    h = _qdq(nodes, inits, h, 3.0 / 127, "h1")
    h = _act(nodes, inits, _qconv(nodes, inits, rs, h, "depthwise", chans, chans, 3, groups=chans, bias=False), act, "a2")
    h = _qdq(nodes, inits, h, 3.0 / 127, "h2")
    nodes += [helper.make_node("AveragePool", [h], ["pool"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], name="pool"),
              helper.make_node("Sub", ["pool", h], ["mixed"], name="pool_minus_x")]
    h = _qdq(nodes, inits, "mixed", 3.0 / 127, "h3")
    h = _qconv(nodes, inits, rs, h, "pointwise", chans, chans, 1)
    nodes += [helper.make_node("Add", [h, "x"], ["res"], name="residual"),
              helper.make_node("GlobalAveragePool", ["res"], ["y"], name="gap")]
    return _model(nodes, inits, (1, chans, 1, 1), in_shape=(1, chans, size, size))


def qdq_strided_conv(seed: int = 0, size: int = 32, kernel: int = 16, stride: int = 8, dim: int = 24) -> onnx.ModelProto:
    """PiT's patch embedding: x[1,3,H,W] → Q/DQ → Conv k x k stride s (k ≠ s, unpadded) → Q/DQ (the next
    op's input)."""
    rs = np.random.RandomState(seed)
    nodes: list = []
    inits: list = []
    x = _qdq(nodes, inits, "x", 4.0 / 127, "x")
    c = _qconv(nodes, inits, rs, x, "patch", 3, dim, kernel, stride=stride, pad=0)
    _qdq(nodes, inits, c, 4.0 / 127, "y")
    nodes[-1].output[0] = "y"
    out = (size - kernel) // stride + 1
    return _model(nodes, inits, (1, dim, out, out), in_shape=(1, 3, size, size))


def qdq_unhalved_gelu(seed: int = 0, chans: int = 16, size: int = 8) -> onnx.ModelProto:
    """EfficientFormerV2's MLP as it reaches RKNN: 1x1 conv (Q/DQ'd) → x · (1 + erf(x / √2)) (the GELU's
    0.5 folded into the next conv's weights) → a float 3x3 depthwise conv."""
    rs = np.random.RandomState(seed)
    nodes: list = []
    inits: list = [nh.from_array(np.array(np.sqrt(2.0), np.float32), "sqrt2"), nh.from_array(np.array(1.0, np.float32), "one"),
                   nh.from_array((rs.randn(chans, 1, 3, 3) * 0.15).astype(np.float32), "mid_w")]
    x = _qdq(nodes, inits, "x", 3.0 / 127, "x")
    h = _qdq(nodes, inits, _qconv(nodes, inits, rs, x, "fc1", chans, chans, 1), 3.0 / 127, "h")
    nodes += [helper.make_node("Div", [h, "sqrt2"], ["d"], name="gelu_div"), helper.make_node("Erf", ["d"], ["e"], name="gelu_erf"),
              helper.make_node("Add", ["e", "one"], ["a"], name="gelu_add"), helper.make_node("Mul", [h, "a"], ["g"], name="gelu_mul"),
              helper.make_node("Conv", ["g", "mid_w"], ["y"], group=chans, kernel_shape=[3, 3], pads=[1] * 4, name="mid")]
    return _model(nodes, inits, (1, chans, size, size), in_shape=(1, chans, size, size))
