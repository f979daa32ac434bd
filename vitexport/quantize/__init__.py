"""Quantization in pt2e's shape: a target annotates (:mod:`.targets` → :mod:`.spec`), calibration
measures (:mod:`.calibrate`, with smoothing from :mod:`.smooth`), conversion writes Q/DQ
(:mod:`.convert`), the fallback keeps the fewest layers in float (:mod:`.fallback`);
:mod:`.quantizer` runs them; :mod:`.engine` writes the Orin engine script."""
from .engine import build_engine, trtexec_command, write_engine_script
from .quantizer import QuantReport, quantize_int8
from .spec import ActSpec, Encoding, NodeKind, NodeSpec, QuantPlan, WeightSpec
from .targets import TARGETS, CpuTarget, NpuTarget, OrinTarget, QuantTarget, check_placement, get_target

__all__ = [
    "quantize_int8",
    "QuantReport",
    "check_placement",
    "write_engine_script",
    "build_engine",
    "trtexec_command",
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
