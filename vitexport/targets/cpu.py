"""x86 CPUs through ONNX Runtime: the Q/DQ layout its fusions turn into integer kernels.

Gemm / Conv biases are int32 (scale = activation × weight scale), which ONNX Runtime requires to
fuse ``QGemm`` (an unfused Q/DQ Gemm dequantizes its weights on every run and is slower than
float). The recipe's ``asymmetric_activations`` picks uint8 activations (U8S8, ONNX Runtime's x86
fast path) and ``reduce_range_weights`` 7-bit weights, without which AVX2 / AVX-512 CPUs lacking
VNNI saturate ``vpmaddubsw``'s int16 sums (``cpu.yaml`` sets both). ONNX Runtime runs any valid
Q/DQ: the shared rules only. Its fused integer kernels are the runtime, so the INT8 gate runs them.
"""
from __future__ import annotations

from ._base import Target
from ._registry import register_target

__all__ = ["CpuTarget"]


@register_target
class CpuTarget(Target):
    """ONNX Runtime on x86: the layout its QDQ fusions turn into integer kernels."""

    name = "cpu"
    description = "x86 CPU, ONNX Runtime, QDQ INT8"
    force_symmetric = False
    dedicated_pairs = False
    int32_bias = True
    runs_in_onnxruntime = True
    engine = "ONNX Runtime"
    #: 0.90: ONNX Runtime runs a float GEMM in FP32 on the same cores at about a third of VNNI INT8's rate,
    #: so 10 % of the MACs in FP32 cost at most ~20 % over all-INT8 (orin's bound, at TensorRT's FP16 ratio)
    int8_share_min = 0.90
    runs_on = "ONNX Runtime on an x86 CPU (its fused integer kernels)"
