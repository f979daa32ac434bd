"""Which ONNX operators and opsets TensorRT's ONNX parser imports (data, not code).

Source: the operator support matrix ``docs/operators.md`` of the ONNX-TensorRT parser
(github.com/onnx/onnx-tensorrt), the operators marked supported ("Y"):

- TensorRT 10.3 (JetPack 6.1 / 6.2): the matrix as of the 10.1 GA release, "opset 9 to opset 20".
  The parser's changelog adds no operator in 10.2 (error handling, GRU / Squeeze importers) or
  10.3 (tensor ``axes`` for Slice, a new ScatterElements plugin); 10.4 adds the window functions,
  10.5 STFT, which JetPack 6's TensorRT therefore lacks.
- TensorRT 8.6 (JetPack 6.0; JetPack 5's 8.5 parses a subset of it): the 8.6 GA matrix, "up to
  opset 17": the 10.3 list without CastLike, DeformConv, Gelu, Hardmax and Mish.

Restrictions the matrix gives per operator (constant ``axes``, 2-D/3-D pooling...) are not encoded:
this answers "does the parser have an importer for this op", not "will every use of it build".
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TensorRTParser", "TENSORRT_10_3", "TENSORRT_8_6"]


@dataclass(frozen=True)
class TensorRTParser:
    """A TensorRT release's ONNX parser: its name, the opsets it reads and its operators."""

    version: str
    min_opset: int
    max_opset: int
    ops: frozenset[str]


_OPS_10_3 = frozenset({
    "Abs", "Acos", "Acosh", "Add", "And", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan", "Atanh",
    "AveragePool", "BatchNormalization", "Cast", "CastLike", "Ceil", "Celu", "Clip", "Concat", "Constant",
    "ConstantOfShape", "Conv", "ConvTranspose", "Cos", "Cosh", "CumSum", "DeformConv", "DepthToSpace",
    "DequantizeLinear", "Div", "Dropout", "Einsum", "Elu", "Equal", "Erf", "Exp", "Expand", "EyeLike",
    "Flatten", "Floor", "Gather", "GatherElements", "GatherND", "Gelu", "Gemm", "GlobalAveragePool",
    "GlobalLpPool", "GlobalMaxPool", "Greater", "GreaterOrEqual", "GridSample", "GroupNormalization", "GRU",
    "Hardmax", "HardSigmoid", "HardSwish", "Identity", "If", "ImageScaler", "InstanceNormalization", "IsInf",
    "IsNaN", "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual", "Log", "LogSoftmax", "Loop",
    "LpNormalization", "LpPool", "LRN", "LSTM", "MatMul", "Max", "MaxPool", "Mean",
    "MeanVarianceNormalization", "Min", "Mish", "Mod", "Mul", "Neg", "NonMaxSuppression", "NonZero", "Not",
    "OneHot", "Or", "Pad", "ParametricSoftplus", "Pow", "PRelu", "QuantizeLinear", "RandomNormal",
    "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Range", "Reciprocal", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum",
    "ReduceSumSquare", "Relu", "Reshape", "Resize", "ReverseSequence", "RNN", "RoiAlign", "Round",
    "ScaledTanh", "Scan", "Scatter", "ScatterElements", "ScatterND", "Selu", "Shape", "Shrink", "Sigmoid",
    "Sign", "Sin", "Sinh", "Size", "Slice", "Softmax", "Softplus", "Softsign", "SpaceToDepth", "Split",
    "Sqrt", "Squeeze", "Sub", "Sum", "Tan", "Tanh", "ThresholdedRelu", "Tile", "TopK", "Transpose", "Trilu",
    "Unsqueeze", "Upsample", "Where", "Xor",
})

#: JetPack 6.1 / 6.2 (the orin target)
TENSORRT_10_3 = TensorRTParser("TensorRT 10.3", 9, 20, _OPS_10_3)
#: JetPack 5 / 6.0 (the orin-jp5 target)
TENSORRT_8_6 = TensorRTParser("TensorRT 8.6", 1, 17, _OPS_10_3 - {"CastLike", "DeformConv", "Gelu", "Hardmax", "Mish"})

