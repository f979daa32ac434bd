"""The ``tflite`` route inside the Ethos-U worker (``.venv-ethos``; imported by ``worker.py`` only).

A program lowered by :mod:`vitexport.targets.ethos_u.tflite_lower` (``program.json`` + ``program.npz``)
becomes a float ``.tflite`` (LiteRT's own flatbuffer schema, object API), which LiteRT's post-training
quantizer calibrates on vitexport's calibration samples and quantizes (int16 activations with per-channel
int8 weights and int64 biases: TFLite's 16x8 mode; or int8 activations). The LiteRT interpreter runs the
quantized file on the parity inputs: that is the program Vela reads, so its outputs are the ones gated.
Vela compiles it (``--output-format tflite``: the optimized file TFLite Micro runs, NPU parts as one
``ethos-u`` custom op each); the ops left outside are the CPU's.

Only numpy, flatbuffers, ai_edge_litert and Vela are imported here.
"""
from __future__ import annotations

import csv
import glob
import json
import os
import shutil

import numpy as np

__all__ = ["write_float", "quantize", "int8_matmuls", "interpret", "compile_vela", "placement", "MOVES"]

#: TFLite ops that move data without arithmetic (reported, not gated, when left on the CPU)
MOVES = ("QUANTIZE", "DEQUANTIZE", "RESHAPE", "TRANSPOSE", "CONCATENATION", "SPLIT", "SPLIT_V", "SLICE",
         "STRIDED_SLICE", "PAD", "GATHER", "SQUEEZE", "EXPAND_DIMS", "PACK", "UNPACK")


#: each op's builtin options table and its fields: TFLite's name → (the program's option key, default)
_OPTIONS: dict[str, tuple[str, dict[str, tuple[str, object]]]] = {
    "FULLY_CONNECTED": ("FullyConnectedOptions", {"keepNumDims": ("keep_num_dims", False)}),
    "BATCH_MATMUL": ("BatchMatMulOptions", {"adjX": ("adj_x", False), "adjY": ("adj_y", False)}),
    "CONV_2D": ("Conv2DOptions", {"strideH": ("stride_h", 1), "strideW": ("stride_w", 1)}),
    "DEPTHWISE_CONV_2D": ("DepthwiseConv2DOptions", {"strideH": ("stride_h", 1), "strideW": ("stride_w", 1),
                                                     "depthMultiplier": ("depth_multiplier", 1)}),
    "RESHAPE": ("ReshapeOptions", {"newShape": ("new_shape", None)}),
    "CONCATENATION": ("ConcatenationOptions", {"axis": ("axis", 0)}),
    "SPLIT": ("SplitOptions", {"numSplits": ("num_splits", 1)}),
    "SPLIT_V": ("SplitVOptions", {"numSplits": ("num_splits", 1)}),
    "MEAN": ("ReducerOptions", {"keepDims": ("keep_dims", True)}),
    "SOFTMAX": ("SoftmaxOptions", {"beta": ("beta", 1.0)}),
    "GELU": ("GeluOptions", {"approximate": ("approximate", False)}),
    **{op: (table, {}) for op, table in (("ADD", "AddOptions"), ("SUB", "SubOptions"), ("MUL", "MulOptions"),
                                         ("DIV", "DivOptions"), ("TRANSPOSE", "TransposeOptions"),
                                         ("SLICE", "SliceOptions"), ("PAD", "PadOptions"),
                                         ("HARD_SWISH", "HardSwishOptions"))},
}


def _options(s, op: str, o: dict):
    """The builtin options type and table of one op (``NONE`` for ops without options: RSQRT, TANH, ...)."""
    if op not in _OPTIONS:
        return s.BuiltinOptions.NONE, None
    table, fields = _OPTIONS[op]
    t = getattr(s, table + "T")()
    for name, (key, default) in fields.items():
        value = o.get(key, default)
        setattr(t, name, list(value) if isinstance(value, (list, tuple)) else value)
    if op in ("CONV_2D", "DEPTHWISE_CONV_2D"):  # the lowering pads explicitly: VALID, undilated
        t.padding, t.dilationHFactor, t.dilationWFactor = s.Padding.VALID, 1, 1
    return getattr(s.BuiltinOptions, table), t


def write_float(program_json: str, program_npz: str, path: str) -> None:
    """The lowered program as a float32 ``.tflite`` at ``path``."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as s

    with open(program_json) as f:
        prog = json.load(f)
    data = np.load(program_npz)
    consts = {name: data[key] for name, key in prog["const_keys"].items()}
    model = s.ModelT()
    model.version, model.description = 3, "vitexport tflite route"
    model.buffers = [s.BufferT()]  # buffer 0: the empty sentinel every tensor without data points at
    index: dict[str, int] = {}
    sub = s.SubGraphT()
    sub.tensors, sub.operators = [], []

    def tensor(name: str) -> int:
        if name in index:
            return index[name]
        t = s.TensorT()
        t.name, t.shape = name, list(prog["shapes"][name])
        t.buffer = 0
        t.type = s.TensorType.FLOAT32
        if name in consts:
            arr = consts[name]
            t.type = s.TensorType.INT32 if arr.dtype.kind in "iu" else s.TensorType.FLOAT32
            arr = arr.astype(np.int32 if arr.dtype.kind in "iu" else np.float32)
            buf = s.BufferT()
            buf.data = np.frombuffer(arr.tobytes(), dtype=np.uint8)
            model.buffers.append(buf)
            t.buffer = len(model.buffers) - 1
        index[name] = len(sub.tensors)
        sub.tensors.append(t)
        return index[name]

    sub.inputs = [tensor(n) for n in prog["inputs"]]
    codes: dict[str, int] = {}
    model.operatorCodes = []
    for op in prog["ops"]:
        name = op["op"]
        if name not in codes:
            code = s.OperatorCodeT()
            code.builtinCode = getattr(s.BuiltinOperator, name)
            code.deprecatedBuiltinCode = min(code.builtinCode, 127)
            code.version = 1
            codes[name] = len(model.operatorCodes)
            model.operatorCodes.append(code)
        o = s.OperatorT()
        o.opcodeIndex = codes[name]
        o.inputs = [-1 if i is None else tensor(i) for i in op["inputs"]]
        o.outputs = [tensor(x) for x in op["outputs"]]
        o.builtinOptionsType, o.builtinOptions = _options(s, name, op["options"])
        sub.operators.append(o)
    sub.outputs = [tensor(n) for n in prog["outputs"]]
    sub.name = "main"
    model.subgraphs = [sub]
    b = flatbuffers.Builder(1024)
    b.Finish(model.Pack(b), file_identifier=b"TFL3")
    with open(path, "wb") as f:
        f.write(b.Output())


def quantize(float_path: str, calibration: list[list[np.ndarray]], activations: str, path: str,
             per_channel: bool = True) -> None:
    """LiteRT's post-training quantizer: calibrate on ``calibration`` and write the integer file at ``path``
    (float inputs and outputs, every op integer: no float fallback)."""
    from ai_edge_litert import _pywrap_tensorflow_lite_calibration_wrapper as cw

    with open(float_path, "rb") as f:
        content = f.read()  # the wrapper reads this buffer, never copies it: it must outlive the wrapper
    wrapper = cw.CalibrationWrapper(content, [], [])
    wrapper.Prepare([list(a.shape) for a in calibration[0]])
    for row in calibration:
        wrapper.FeedTensor([np.ascontiguousarray(a, dtype=np.float32) for a in row])
    act = np.dtype(np.int16 if activations == "int16" else np.int8).num
    bias = np.dtype(np.int64 if activations == "int16" else np.int32).num
    f32 = np.dtype(np.float32).num
    out = wrapper.QuantizeModel(f32, f32, False, act, bias, not per_channel, False)
    with open(path, "wb") as f:
        f.write(out)
    del wrapper, content


def int8_matmuls(path: str) -> int:
    """Rewrite the file at ``path`` so every int16 BATCH_MATMUL multiplies int8 operands: a QUANTIZE to int8
    (the same range: scale · 32767/127) before each input, the product in int8, a QUANTIZE back to the int16
    tensor after. Ethos-U55 multiplies two activations in int8 only (its 16x8 BATCH_MATMUL runs on the CPU).
    Returns how many matmuls were rewritten."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as s

    with open(path, "rb") as f:
        model = s.ModelT.InitFromPackedBuf(f.read(), 0)
    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in model.operatorCodes]
    if s.BuiltinOperator.QUANTIZE not in codes:
        code = s.OperatorCodeT()
        code.builtinCode = code.deprecatedBuiltinCode = s.BuiltinOperator.QUANTIZE
        code.version = 1
        model.operatorCodes.append(code)
        codes.append(s.BuiltinOperator.QUANTIZE)
    quantize = codes.index(s.BuiltinOperator.QUANTIZE)
    done = 0
    for sub in model.subgraphs:
        ops = []

        def narrow(i: int) -> int:
            """A new int8 tensor with the range of int16 tensor ``i``."""
            t = sub.tensors[i]
            n = s.TensorT()
            n.name = (t.name.decode() if isinstance(t.name, bytes) else t.name) + "_int8"
            n.shape, n.type, n.buffer = list(t.shape), s.TensorType.INT8, 0
            q = s.QuantizationParametersT()
            q.scale = [float(v) * 32767.0 / 127.0 for v in t.quantization.scale]
            q.zeroPoint = [0] * len(q.scale)
            n.quantization = q
            sub.tensors.append(n)
            return len(sub.tensors) - 1

        def requant(src: int, dst: int):
            op = s.OperatorT()
            op.opcodeIndex, op.inputs, op.outputs = quantize, [src], [dst]
            op.builtinOptionsType, op.builtinOptions = s.BuiltinOptions.QuantizeOptions, s.QuantizeOptionsT()
            return op

        for op in sub.operators:
            if codes[op.opcodeIndex] != s.BuiltinOperator.BATCH_MATMUL or \
                    any(sub.tensors[i].type != s.TensorType.INT16 for i in [*op.inputs, *op.outputs]):
                ops.append(op)
                continue
            inputs = []
            for i in op.inputs:
                j = narrow(i)
                ops.append(requant(i, j))
                inputs.append(j)
            out = op.outputs[0]
            op.inputs, op.outputs = inputs, [narrow(out)]
            ops.extend([op, requant(op.outputs[0], out)])
            done += 1
        sub.operators = ops
    b = flatbuffers.Builder(1024)
    b.Finish(model.Pack(b), file_identifier=b"TFL3")
    with open(path, "wb") as f:
        f.write(b.Output())
    return done


def interpret(path: str, rows: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """The file at ``path`` on the LiteRT interpreter (reference kernels), one list per output."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(model_path=path, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    ins, outs = it.get_input_details(), it.get_output_details()
    per_output: list[list[np.ndarray]] = [[] for _ in outs]
    for row in rows:
        for d, a in zip(ins, row):
            it.set_tensor(d["index"], np.ascontiguousarray(a, dtype=d["dtype"]))
        it.invoke()
        for j, d in enumerate(outs):
            per_output[j].append(np.array(it.get_tensor(d["index"]), dtype=np.float32))
    return per_output


def compile_vela(path: str, flags: list[str], out_dir: str) -> tuple[str, dict]:
    """Vela on the integer file: its optimized ``.tflite`` (NPU parts as ``ethos-u`` custom ops) and its
    summary CSV row."""
    from ethosu.vela import vela

    shutil.rmtree(out_dir, ignore_errors=True)
    keep = [f for f in flags if not f.startswith(("--output-format", "--output-dir"))]
    rc = vela.main([*keep, "--output-format=tflite", f"--output-dir={out_dir}", path])
    if rc not in (0, None):
        raise RuntimeError(f"vela exited {rc} on {os.path.basename(path)}")
    optimized = glob.glob(os.path.join(out_dir, "*_vela.tflite"))
    summary = glob.glob(os.path.join(out_dir, "*_summary_*.csv"))
    if not optimized or not summary:
        raise RuntimeError(f"vela wrote no optimized file or summary in {out_dir}")
    with open(summary[0]) as f:
        return optimized[0], next(csv.DictReader(f))


def _macs(sub, op, name: str) -> int:
    """Multiply-accumulates of a FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D / BATCH_MATMUL (else 0)."""
    if name not in ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "BATCH_MATMUL"):
        return 0
    out = int(np.prod(sub.Tensors(op.Outputs(0)).ShapeAsNumpy()))
    w = sub.Tensors(op.Inputs(1)).ShapeAsNumpy()
    if name == "FULLY_CONNECTED":
        return out * int(w[-1])
    if name == "CONV_2D":
        return out * int(np.prod(w[1:]))
    if name == "DEPTHWISE_CONV_2D":
        return out * int(w[1] * w[2])
    return out * int(sub.Tensors(op.Inputs(0)).ShapeAsNumpy()[-1])


def placement(optimized: str) -> tuple[list[dict], int]:
    """The ops Vela left outside its ``ethos-u`` custom ops (``{node, op, macs, moves}``) and how many NPU
    parts there are."""
    from ai_edge_litert import schema_py_generated as s

    with open(optimized, "rb") as f:
        buf = f.read()
    model = s.Model.GetRootAs(buf, 0)
    names = {v: k for k, v in vars(s.BuiltinOperator).items() if not k.startswith("_")}
    cpu, npu = [], 0
    for g in range(model.SubgraphsLength()):
        sub = model.Subgraphs(g)
        for i in range(sub.OperatorsLength()):
            op = sub.Operators(i)
            code = model.OperatorCodes(op.OpcodeIndex())
            builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
            name = names.get(builtin, str(builtin))
            if name == "CUSTOM":
                npu += 1
                continue
            node = sub.Tensors(op.Outputs(0)).Name().decode() if op.OutputsLength() else f"op{i}"
            cpu.append({"node": node, "op": name.lower(), "macs": _macs(sub, op, name), "moves": name in MOVES})
    return cpu, npu
