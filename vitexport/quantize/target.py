"""What the quantizer reads of the target it is handed: a protocol, so that ``quantize/`` never imports
``vitexport.targets`` (whose base class imports :mod:`.annotate`); ``vitexport.targets.Target`` is the
class that satisfies it."""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import onnx_ir as ir

from ..check.violation import Violation
from ..recipe import Recipe
from ..runners.sessions import SessionConfig
from .annotate import AnnotateTarget
from .spec import QuantPlan

__all__ = ["QuantizeTarget"]


class QuantizeTarget(AnnotateTarget, Protocol):
    """Where Q/DQ goes (:class:`AnnotateTarget`), the float type, the arithmetic of the INT8 gate, the
    rules of what is written and the files the target writes from the scales."""

    @property
    def recipe(self) -> Recipe: ...

    #: the runtime has no float16
    forbid_float16: bool
    #: deepest tensor a smoothing Mul may be inserted on (None: any)
    max_insert_rank: int | None
    #: a smoothing Mul may go on an attention output that cannot fold into V
    insert_after_attention: bool
    #: a per-channel Mul may go in front of a depthwise conv (its input channels equalised)
    equalise_depthwise: bool
    #: the stage whose backend reports the INT8 share (None: none)
    int8_share_stage: str | None

    @property
    def gate_config(self) -> SessionConfig: ...

    def annotate(self, model: ir.Model) -> QuantPlan: ...

    def high_precision(self) -> str: ...

    def validate(self, model: ir.Model) -> list[Violation]: ...

    def write_artifacts(self, work_dir: Path, scales: dict[str, float], method: str) -> dict[str, Path]: ...
