"""Quantization: Q/DQ placement per target, equalisation, mixed-precision fallback, Orin artifacts."""
from .bench import latency_ms, latency_ratio, measure_calibration_memory
from .engine import build_engine, trtexec_command, write_engine_script
from .int8 import QuantReport, check_placement, quantize_int8
from .targets import TARGETS, CpuTarget, NpuTarget, OrinTarget, QuantPlan, QuantTarget, get_target

__all__ = [
    "quantize_int8",
    "QuantReport",
    "check_placement",
    "write_engine_script",
    "build_engine",
    "trtexec_command",
    "latency_ms",
    "latency_ratio",
    "measure_calibration_memory",
    "QuantTarget",
    "OrinTarget",
    "NpuTarget",
    "CpuTarget",
    "QuantPlan",
    "TARGETS",
    "get_target",
]
