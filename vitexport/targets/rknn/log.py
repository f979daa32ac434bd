"""What rknn-toolkit2's verbose log says: the per-op table (type, precision, NPU or CPU, shapes), the
compiler pass that was running when it stopped, its error and warning lines.

The op table is the compiler's own word on what the NPU runs ("Network Layer Information Table",
printed by ``build`` with ``verbose=True``): its ``DataType`` column is the precision an op runs in.
From it :func:`op_summary` counts the INT8 share of GEMM/Conv multiply-accumulates, which no
quantized ONNX file can tell (RKNN re-decides precisions while it fuses).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

from ...graph.macs import layer_macs

__all__ = ["OpRow", "OpSummary", "parse_op_table", "op_summary", "with_groups", "last_pass", "error_lines", "log_lines", "strip_ansi",
           "GEMM_TYPES"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ROW = re.compile(
    r"RKNN: \[[0-9:.]+\] (\d+)\s+(\S+)\s+(\S+)\s+(NPU|CPU|GPU)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)")
_SHAPE = re.compile(r"\(([0-9,]*)\)")
_EXC = re.compile(r"^[A-Z]\w*(Error|Exception): ")
#: a compiler pass starting; the last ones (``OpEmit``: the code generation) carry no ``rknn::`` prefix
_PASS = re.compile(r">>>>>> start: ((?:rknn::)?\w+)")
#: op types whose multiply-accumulates count as GEMM/Conv work (RKNN fuses bias / activation into
#: ``ConvAdd``, ``ConvExGelu``, … and turns Linear layers into 1x1 convolutions)
GEMM_TYPES = ("Conv", "exMatMul", "MatMul", "Gemm", "exSDPAttention")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


@dataclass(frozen=True)
class OpRow:
    """One row of RKNN's op table."""

    id: int
    op_type: str
    dtype: str
    target: str
    inputs: tuple[tuple[int, ...], ...]
    output: tuple[int, ...]
    name: str
    #: the source ONNX Conv's ``group`` (0: not known): RKNN's table does not say it, and lists a grouped
    #: conv it expanded into a dense one (``convert_group_conv2d_to_conv2d``) with a dense weight
    groups: int = 0

    @property
    def is_gemm(self) -> bool:
        return any(self.op_type.startswith(t) for t in GEMM_TYPES)

    @property
    def source(self) -> str:
        """The ONNX node the row was built from: ``Conv:grouped#1`` → ``grouped`` (``#N``: RKNN's rewrite)."""
        return re.sub(r"#\d+$", "", self.name.partition(":")[2] or self.name)

    @property
    def macs(self) -> int:
        """Multiply-accumulates of a GEMM/Conv row (0 for other ops or unreadable shapes), as
        :func:`~vitexport.graph.macs.layer_macs` counts the source model's layer."""
        if not self.is_gemm or not self.output:
            return 0
        if self.op_type.startswith("Conv") and len(self.inputs) >= 2 and len(self.inputs[1]) == 4:
            weight, groups = self._onnx_conv_weight()
            try:
                return layer_macs("Conv", self.output, weight, groups=groups)
            except ValueError:  # a layout this reading does not know: the weight as listed, dense
                return math.prod(self.output) * math.prod(self.inputs[1][1:])
        if len(self.inputs) >= 2 and self.inputs[0] and self.inputs[1]:
            # batched A[b,M,K] x B[b,K,N] -> out[b,M,N]: |A|·|B| / |out| = b·K², b = out's first dim
            out = math.prod(self.output)
            k2 = math.prod(self.inputs[0]) * math.prod(self.inputs[1]) / (out * max(self.output[0], 1))
            return layer_macs("MatMul", self.output, (int(round(math.sqrt(max(k2, 0.0)))), self.output[-1]))
        return 0

    def _onnx_conv_weight(self) -> tuple[tuple[int, ...], int]:
        """The Conv weight in ONNX's layout [Cout, Cin/groups, kh, kw] and the group count."""
        w, cout = self.inputs[1], self.output[1] if len(self.output) > 1 else 0
        cin = self.inputs[0][1] if len(self.inputs[0]) > 1 else 0
        if w[0] == 1 and w[1] == cout == cin and cout > 1:  # RKNN lists a depthwise weight as (1, C, kh, kw)
            return (cout, 1, *w[2:]), cout
        if self.groups > 1 and w[0] == cout and w[1] == cin and cin % self.groups == 0:  # expanded to dense
            return (cout, cin // self.groups, *w[2:]), self.groups
        return w, max(cin // w[1], 1) if cin and w[1] and cin % w[1] == 0 else 1


@dataclass(frozen=True)
class OpSummary:
    """What the NPU runs, from the op table."""

    ops: int
    on_npu: int
    on_cpu: list[str]
    gemm_macs: int
    int8_macs: int
    by_dtype: dict[str, int]
    float_gemms: list[str]

    @property
    def int8_share(self) -> float:
        return self.int8_macs / self.gemm_macs if self.gemm_macs else 0.0

    def to_dict(self) -> dict:
        return {"ops": self.ops, "on_npu": self.on_npu, "on_cpu": self.on_cpu, "gemm_macs": self.gemm_macs,
                "int8_macs": self.int8_macs, "int8_share": round(self.int8_share, 4), "by_dtype": self.by_dtype,
                "float_gemms": self.float_gemms}


def _shapes(text: str) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(d) for d in m.split(",") if d) for m in _SHAPE.findall(text))


def log_lines(log: str | Path) -> list[str]:
    text = Path(log).read_text(errors="replace") if isinstance(log, Path) else log
    return strip_ansi(text).splitlines()


def parse_op_table(log: str | Path) -> list[OpRow]:
    """The last op table in an RKNN verbose log (``build`` prints one per compile).

    Args:
        log: the log's text, or its path.
    Returns:
        One :class:`OpRow` per op, in RKNN's order; empty when the log holds no table.
    """
    tables: list[list[OpRow]] = []
    for line in log_lines(log):
        if "Network Layer Information Table" in line:
            tables.append([])
            continue
        m = _ROW.search(line)
        if m and tables:
            outs = _shapes(m.group(6))
            tables[-1].append(OpRow(int(m.group(1)), m.group(2), m.group(3), m.group(4), _shapes(m.group(5)),
                                    outs[0] if outs else (), m.group(9)))
    return tables[-1] if tables else []


def with_groups(rows: list[OpRow], groups: Mapping[str, int]) -> list[OpRow]:
    """The rows, each Conv's ``groups`` set from the source ONNX's Conv it names (``groups``: node
    name → ``group``, :func:`~vitexport.graph.macs.conv_groups`): RKNN computes a grouped conv as a
    dense one, and the table would count its zero blocks as work of the model."""
    return [replace(r, groups=groups[r.source]) if r.op_type.startswith("Conv") and r.source in groups else r
            for r in rows]


def op_summary(rows: list[OpRow]) -> OpSummary:
    """Ops on the NPU vs the CPU (RKNN's input/output operators aside), GEMM/Conv MACs by precision."""
    real = [r for r in rows if r.op_type not in ("InputOperator", "OutputOperator")]
    by_dtype: dict[str, int] = {}
    for r in real:
        if r.is_gemm:
            by_dtype[r.dtype] = by_dtype.get(r.dtype, 0) + r.macs
    gemm = sum(by_dtype.values())
    return OpSummary(
        ops=len(real), on_npu=sum(r.target == "NPU" for r in real),
        on_cpu=[f"{r.op_type}:{r.name}" for r in real if r.target != "NPU"],
        gemm_macs=gemm, int8_macs=by_dtype.get("INT8", 0), by_dtype=by_dtype,
        float_gemms=[r.name for r in real if r.is_gemm and r.dtype != "INT8"])


def last_pass(log: str | Path) -> str | None:
    """The compiler pass that had started last (where a crash happened)."""
    found = None
    for line in log_lines(log):
        m = _PASS.search(line)
        if m:
            found = m.group(1)
    return found


def error_lines(log: str | Path, level: str = "E") -> list[str]:
    """RKNN's ``E`` (error) or ``W`` (warning) lines, without their prefix and colours; for errors,
    then the exception lines of the tracebacks it printed (``KeyError: 'x_dequantized_conv'``)."""
    lines = log_lines(log)
    out = [line[2:].strip() for line in lines if line.startswith(f"{level} ")]
    if level == "E":
        out += [line.strip() for line in lines if _EXC.match(line) and "Traceback" not in line]
    return out

