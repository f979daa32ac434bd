"""Quantization in pt2e's shape: the run's target annotates (:mod:`.annotate` → :mod:`.spec`),
calibration measures (:mod:`.calibrate`, with smoothing from :mod:`.smooth`), conversion writes Q/DQ
(:mod:`.convert`), the fallback keeps the fewest layers in float (:mod:`.fallback`);
:mod:`.quantizer` runs them. What differs per target comes from the
:class:`~vitexport.targets.Target` it is handed: this package names no target."""
from .annotate import annotate, attention_role
from .quantizer import QuantReport, quantize_int8
from .spec import ActSpec, Encoding, NodeKind, NodeSpec, QuantPlan, WeightSpec

__all__ = [
    "quantize_int8",
    "QuantReport",
    "annotate",
    "attention_role",
    "QuantPlan",
    "NodeSpec",
    "NodeKind",
    "ActSpec",
    "WeightSpec",
    "Encoding",
]
