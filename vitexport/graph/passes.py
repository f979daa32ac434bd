"""vitexport's ONNX passes are onnx-ir passes that also say what they did.

onnx-ir's pass manager gives ``requires`` / ``ensures`` checks and a ``PassResult(model, modified)``;
a :class:`GraphPass` adds a :class:`GraphPassReport` (sites changed, sites declined and why), the
report every vitexport pass returns beside its model.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir

__all__ = ["GraphPassReport", "GraphPassResult", "GraphPass"]


@dataclass
class GraphPassReport:
    """What one pass did. ``changed`` counts sites rewritten; 0 is a true statement, not a default."""

    name: str
    changed: int = 0
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class GraphPassResult(ir.passes.PassResult):
    """onnx-ir's result plus the report."""

    report: GraphPassReport = field(default_factory=lambda: GraphPassReport(""))


class GraphPass(ir.passes.InPlacePass):
    """An in-place onnx-ir pass with a report; subclasses implement :meth:`run`.

    In place by design: the quantizer owns the model it rewrites (loaded from the stage's input
    file), and a copy of ViT-B/16's weights is what the memory budget cannot afford.
    """

    name: str = "graph_pass"

    def run(self, model: ir.Model, report: GraphPassReport) -> None:
        raise NotImplementedError

    def call(self, model: ir.Model) -> GraphPassResult:
        report = GraphPassReport(self.name)
        self.run(model, report)
        return GraphPassResult(model, report.changed > 0, report)
