"""Quantization in pt2e's shape: a target annotates (:mod:`.targets` → :mod:`.spec`), calibration
measures (:mod:`.calibrate`, with smoothing from :mod:`.smooth`), conversion writes Q/DQ
(:mod:`.convert`), the fallback keeps the fewest layers in float (:mod:`.fallback`) judged by the
gate's predicted figures (:mod:`.judge`, :mod:`.tail`);
:mod:`.quantizer` runs them; :mod:`.engine` writes the Orin engine script."""
from .bench import latency_ms, latency_ratio, measure_calibration_memory
from .engine import build_engine, trtexec_command, write_engine_script
from .quantizer import QuantReport, quantize_int8
from .tail import GateInfo, Prediction
from .spec import ActSpec, Encoding, NodeKind, NodeSpec, QuantPlan, WeightSpec
from .targets import TARGETS, CpuTarget, NpuTarget, OrinTarget, QuantTarget, check_placement, get_target

__all__ = [
    "quantize_int8",
    "QuantReport",
    "GateInfo",
    "Prediction",
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
    "NodeSpec",
    "NodeKind",
    "ActSpec",
    "WeightSpec",
    "Encoding",
    "TARGETS",
    "get_target",
]
