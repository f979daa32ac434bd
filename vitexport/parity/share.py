"""The INT8-share gate: the share of GEMM/Conv multiply-accumulates a stage's backend reports in INT8, and
the compute ops it placed on the CPU, checked against ``parity.<stage>.int8_share_min`` /
``cpu_compute_ops_max``.

An NPU is bought for INT8 throughput: a run whose outputs match but whose backend runs a fifth of its
work in float16 is not what the user asked for, so exit 0 must not hide it. The figure is the backend's
own word where it has one (RKNN's op table, OpenVINO's runtime model), else the Q/DQ coverage of the
written file (what TensorRT or a paper NPU contract will see). A stage that measures it puts an
:class:`Int8Share` into its details (``details["int8_share"]``); :func:`gate_int8_share` turns it into
:class:`~.metrics.Check` s on the stage's result, so a miss fails through the same path as every gate
(exit 1, ``REJECTED``, ``rejected/``), naming every float or CPU layer, largest first, and why it stayed
float where that is known.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from ..recipe import Tolerance
from .metrics import Check

__all__ = ["FloatLayer", "Int8Share", "DATA_MOVEMENT", "SHARE_KEY", "SHARE_METRICS", "share_checks", "gate_int8_share",
           "macs_text"]

#: the stage details key a share is recorded under
SHARE_KEY = "int8_share"
#: the checks this gate adds → the tolerance key that sets each limit
SHARE_METRICS = {"int8_share": "int8_share_min", "cpu_compute_ops": "cpu_compute_ops_max"}
#: ops that only move or re-index data (ONNX's names and RKNN's ``ex`` forms): on the CPU they cost a copy
#: and a hand-over, not arithmetic, so they are reported but not gated; every other op placed on the CPU
#: (a Conv, a Softmax, an Add) is compute the NPU was bought to run
DATA_MOVEMENT = frozenset({
    "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice", "Gather", "Expand",
    "Identity", "Tile", "Pad", "DepthToSpace", "SpaceToDepth", "Cast", "Shape", "exReshape", "exTranspose",
    "exSplit", "exConcat", "exSlice", "exPermute", "Permute",
})
_SHOWN = 3  # float layers named in the one-line error; all of them are in the report and parity.json


def macs_text(n: int) -> str:
    """``1.2 G`` / ``34.5 M`` / ``6.1 k`` multiply-accumulates."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return str(n)


@dataclass(frozen=True)
class FloatLayer:
    """A GEMM/Conv the backend does not run in INT8, or a compute op it placed on the CPU.

    Attributes:
        name: the layer as the backend (or the file) names it.
        op: its op type.
        macs: its multiply-accumulates (0 for a non-GEMM op on the CPU).
        runs: how it runs (``float16 on the NPU``, ``on the CPU``, ``FP16``).
        why: why it is not INT8, where known (a fallback's parity reason, a compiler rule).
    """

    name: str
    op: str
    macs: int
    runs: str
    why: str = ""

    def __str__(self) -> str:
        return (f"{self.name} ({self.op}, {macs_text(self.macs)} MACs, {self.runs}" if self.macs else
                f"{self.name} ({self.op}, {self.runs}") + (f"; {self.why})" if self.why else ")")


@dataclass
class Int8Share:
    """What a backend reports about its INT8 work.

    Attributes:
        share: INT8 multiply-accumulates / all GEMM/Conv multiply-accumulates.
        source: whose figure it is (``RKNN's op table``).
        gemm_macs: all GEMM/Conv multiply-accumulates it counted.
        float_layers: GEMM/Conv not in INT8, largest first.
        cpu_compute: compute ops placed on the CPU (None: the backend reports no placement).
        cpu_moves: data-movement ops placed on the CPU (reported, not gated).
        hints: what the user can try to run more in INT8 (the target's settings).
    """

    share: float
    source: str
    gemm_macs: int
    float_layers: list[FloatLayer] = field(default_factory=list)
    cpu_compute: list[FloatLayer] | None = None
    cpu_moves: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.float_layers = sorted(self.float_layers, key=lambda f: -f.macs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Int8Share":
        cpu = d.get("cpu_compute")
        return cls(share=float(d["share"]), source=str(d.get("source", "")), gemm_macs=int(d.get("gemm_macs", 0)),
                   float_layers=[FloatLayer(**f) for f in d.get("float_layers") or []],
                   cpu_compute=None if cpu is None else [FloatLayer(**f) for f in cpu],
                   cpu_moves=list(d.get("cpu_moves") or []), hints=list(d.get("hints") or []))

    def note(self) -> str:
        """The report's line: the figure, whose it is, and every float or CPU layer, largest first, each
        reason once with the layers it explains."""
        line = f"INT8 share: {self.share:.1%} of GEMM/Conv multiply-accumulates in INT8 ({self.source})"
        if self.float_layers:
            line += f"; not in INT8, largest first ({len(self.float_layers)}): {_listed(self.float_layers)}"
        if self.cpu_compute:
            line += f"; compute ops on the CPU ({len(self.cpu_compute)}): {_listed(self.cpu_compute)}"
        if self.cpu_moves:
            line += (f"; data movement on the CPU ({len(self.cpu_moves)}, allowed: a copy, no arithmetic): "
                     + ", ".join(self.cpu_moves))
        return line


def _short(f: FloatLayer) -> str:
    return f"{f.name} ({f.op}, {macs_text(f.macs)} MACs, {f.runs})" if f.macs else f"{f.name} ({f.op}, {f.runs})"


def _listed(layers: list[FloatLayer]) -> str:
    """Every layer, then each reason once with the layers it explains."""
    by_why: dict[str, list[str]] = {}
    for f in layers:
        by_why.setdefault(f.why or "not known", []).append(f.name)
    return ", ".join(map(_short, layers)) + "; why: " + "; ".join(
        f"{why} ({', '.join(names) if len(names) < len(layers) else 'all'})" for why, names in by_why.items())


def _named(layers: list[FloatLayer]) -> str:
    """The first few layers with their MACs, then each distinct reason once (one line for the error)."""
    shown = layers[:_SHOWN]
    text = ", ".join(map(_short, shown))
    text += f" (+{len(layers) - _SHOWN} more in parity.md)" if len(layers) > _SHOWN else ""
    whys = list(dict.fromkeys(f.why for f in shown if f.why))
    return text + (f"; why: {'; '.join(whys)}" if whys else "")


def share_checks(share: Int8Share, tol: Tolerance) -> list[Check]:
    """The share's checks under ``tol`` (none when the tolerance gates neither figure)."""
    checks = []
    if tol.int8_share_min is not None:
        ok = share.share >= tol.int8_share_min
        checks.append(Check("int8_share", share.share, tol.int8_share_min, ">=", ok,
                            why=None if ok else f"not in INT8 by {share.source}, largest first: {_named(share.float_layers)}",
                            hints=None if ok else list(share.hints)))
    if tol.cpu_compute_ops_max is not None and share.cpu_compute is not None:
        n = len(share.cpu_compute)
        ok = n <= tol.cpu_compute_ops_max
        checks.append(Check("cpu_compute_ops", float(n), float(tol.cpu_compute_ops_max), "<=", ok,
                            why=None if ok else f"compute ops on the CPU by {share.source}: {_named(share.cpu_compute)}",
                            hints=None if ok else list(share.hints)))
    return checks


def gate_int8_share(result: Any, tol: Tolerance) -> None:
    """Add the share checks of ``result`` (a :class:`~.stage.StageResult` whose details hold
    ``int8_share``) under ``tol``, replacing any earlier ones (a resumed stage gated again), and its
    report line; nothing when the stage measured no share."""
    d = result.details.get(SHARE_KEY)
    if not d:
        return
    share = Int8Share.from_dict(d)
    result.checks = [c for c in result.checks if c.metric not in SHARE_METRICS] + share_checks(share, tol)
    result.passed = all(c.passed for c in result.checks)
    line = share.note()
    result.notes = [n for n in result.notes if not n.startswith("INT8 share: ")] + [line]
