"""Reading an exported ONNX graph the way the parity checker needs it.

Which torch module did a node come from? The TorchScript exporter (``dynamo=False``) names nodes by
module scope, ``/model/blocks/blocks.0/attn/qkv/MatMul``; the dynamo exporter, when it keeps
metadata, writes ``pkg.torch.onnx.name_scopes`` (a list of qualified module names). Either way we
recover the module's qualified name (``model.blocks.0.attn.qkv``) from structured fields, and a
module's output tensor is the output of the last node (topological order) in its scope.

The graph is an onnx-ir model (:mod:`vitexport.graph`); intermediate tensors are observed by asking
the session for them as extra outputs (:class:`vitexport.runners.sessions.Session`), the file on
disk is never touched.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as ir_common

from ..graph.files import as_model

__all__ = [
    "OnnxGraph",
    "NodeView",
    "load_onnx",
    "node_scope",
    "block_scopes",
    "scope_matches",
]

# Nodes that never carry a module's result: constants and the exporter's parameter aliases.
_SKIP_OPS = {"Constant", "ConstantOfShape", "Identity", "Shape", "Size"}
_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}


def load_onnx(model: str | Path | bytes | onnx.ModelProto | ir.Model) -> ir.Model:
    """An ``ir.Model`` from a path, serialized bytes, a ModelProto or an ``ir.Model`` (as is)."""
    return as_model(model)


def _scope_from_name(name: str) -> str | None:
    """``/model/blocks/blocks.0/attn/qkv/MatMul`` → ``model.blocks.0.attn.qkv``.

    A ``Sequential``'s children appear as ``blocks`` then ``blocks.0`` (the child's name relative to
    the grandparent), a ``ModuleList`` that is never called as ``layer.0`` alone; both give the
    same qualified name.
    """
    if not name.startswith("/"):
        return None
    segments = [s for s in name.split("/") if s][:-1]  # the last segment is the op's own name
    path: list[str] = []
    for seg in segments:
        if path and seg.startswith(path[-1] + "."):
            path[-1] = seg
        else:
            path.append(seg)
    return ".".join(path)


def node_scope(node: ir.Node) -> str | None:
    """The qualified torch module name a node was exported from, or None when the graph does not say."""
    prop = node.metadata_props.get("pkg.torch.onnx.name_scopes")
    if prop is not None:
        try:
            scopes = ast.literal_eval(prop)
        except (ValueError, SyntaxError):
            return _scope_from_name(node.name or "")
        # [..., 'model.blocks.0.attn.qkv', 'linear'] - the last entry is the op itself
        if isinstance(scopes, (list, tuple)) and len(scopes) >= 2:
            return str(scopes[-2])
        return ""
    return _scope_from_name(node.name or "")


def scope_matches(scope: str, module_name: str) -> bool:
    """True when an ONNX scope and a torch module name denote the same module.

    The two may differ by a wrapper prefix (``model.`` from an output adapter) on either side.
    """
    if scope == module_name:
        return True
    return scope.endswith("." + module_name) or module_name.endswith("." + scope)


def _in_scope(scope: str | None, prefix: str) -> bool:
    return scope is not None and (scope == prefix or scope.startswith(prefix + "."))


_INDEXED = re.compile(r"^(?:\d+|[A-Za-z]\w*?_\d+)$")


def block_scopes(scopes: Iterable[str]) -> list[str]:
    """The repeated blocks among module scopes, in first-seen order: the outermost scopes whose last
    name is an index (``blocks.3``, ``encoder.layer.3``) or ends in one (torchvision's
    ``encoder.layers.encoder_layer_3``), when at least two siblings share the pattern."""
    seen: list[str] = []
    for scope in scopes:
        parts = scope.split(".") if scope else []
        for i, p in enumerate(parts):
            if _INDEXED.match(p):
                cand = ".".join(parts[: i + 1])
                if cand not in seen:
                    seen.append(cand)
                break
    def family(name: str) -> str:
        return re.sub(r"\d+$", "#", name)

    counts: dict[str, int] = {}
    for s in seen:
        counts[family(s)] = counts.get(family(s), 0) + 1
    return [s for s in seen if counts[family(s)] >= 2]


@dataclass(frozen=True)
class NodeView:
    """A node as the parity code reads it: op, name, input and output tensor names."""

    op_type: str
    name: str
    input: tuple[str, ...]
    output: tuple[str, ...]


@dataclass
class OnnxGraph:
    """A loaded model with inferred value types and node scopes; read-only helper."""

    model: ir.Model

    def __post_init__(self) -> None:
        ir_common.ShapeInferencePass(strict_mode=False)(self.model)  # best effort; never raises
        self.values = ir.convenience.create_value_mapping(self.model.graph)
        self.initializers = set(self.model.graph.initializers)
        self.nodes = [NodeView(n.op_type, n.name or "", tuple(v.name if v is not None else "" for v in n.inputs),
                               tuple(v.name for v in n.outputs)) for n in self.model.graph]
        self.scopes = [node_scope(n) for n in self.model.graph]
        self.consumers: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for name in n.input:
                self.consumers.setdefault(name, []).append(i)
        self.producer: dict[str, int] = {o: i for i, n in enumerate(self.nodes) for o in n.output}

    @classmethod
    def load(cls, model: str | Path | bytes | onnx.ModelProto) -> "OnnxGraph":
        return cls(load_onnx(model))

    # --- facts ----------------------------------------------------------------------------------
    @property
    def has_scopes(self) -> bool:
        return any(s for s in self.scopes)

    def module_scopes(self) -> list[str]:
        """Distinct non-empty scopes in node order."""
        out: dict[str, None] = {}
        for s in self.scopes:
            if s:
                out.setdefault(s, None)
        return list(out)

    def elem_type(self, tensor: str) -> int | None:
        v = self.values.get(tensor)
        return int(v.dtype) if v is not None and v.dtype is not None else None

    def shape(self, tensor: str) -> tuple[int, ...] | None:
        """Static dims, -1 for symbolic ones; None when unknown."""
        v = self.values.get(tensor)
        if v is None or v.shape is None:
            return None
        return tuple(d if isinstance(d, int) else -1 for d in v.shape)

    def is_float(self, tensor: str) -> bool:
        t = self.elem_type(tensor)
        return t in _FLOAT_TYPES if t is not None else True  # unknown: let the runtime tell

    # --- matching --------------------------------------------------------------------------------
    def follow_qdq(self, tensor: str) -> str:
        """The tensor downstream consumers see: through a ``QuantizeLinear → DequantizeLinear`` pair
        that is the only consumer of ``tensor`` (a quantized block output is compared after its
        rounding, where the next block reads it)."""
        cons = self.consumers.get(tensor, [])
        if len(cons) == 1 and self.nodes[cons[0]].op_type == "QuantizeLinear":
            q = self.nodes[cons[0]]
            dq = self.consumers.get(q.output[0], [])
            if len(dq) >= 1 and all(self.nodes[i].op_type == "DequantizeLinear" for i in dq):
                return self.nodes[dq[0]].output[0]
        return tensor

    def scope_output(self, module_name: str, shape: Sequence[int] | None = None) -> str | None:
        """The output tensor of the module ``module_name``: the last float output of a node in its
        scope (matching ``shape`` when given, batch and symbolic dims as wildcards)."""
        # the module's own scope may hold no node directly (only its children's do), so match on
        # scope prefixes
        prefixes = self._prefixes_for(module_name)
        if not prefixes:
            return None
        for i in range(len(self.nodes) - 1, -1, -1):
            node, sc = self.nodes[i], self.scopes[i]
            if node.op_type in _SKIP_OPS or not any(_in_scope(sc, p) for p in prefixes):
                continue
            if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
                continue  # the float tensor they wrap is the module's result; follow_qdq adds them back
            for out in node.output:
                if not out or not self.is_float(out):
                    continue
                if shape is not None and not _shape_ok(self.shape(out), shape):
                    continue
                return self.follow_qdq(out)
        return None

    def _prefixes_for(self, module_name: str) -> list[str]:
        """ONNX scope prefixes naming ``module_name`` (with or without a wrapper prefix)."""
        found: dict[str, None] = {}
        for s in self.module_scopes():
            parts = s.split(".")
            for k in range(1, len(parts) + 1):
                prefix = ".".join(parts[:k])
                if scope_matches(prefix, module_name):
                    found.setdefault(prefix, None)
        # prefer the longest match per distinct wrapper (exact first)
        return sorted(found, key=len, reverse=True)[:1] if found else []

    def topo_index(self, tensor: str) -> int:
        """Position of the tensor's producer (-1 for graph inputs and initializers)."""
        return self.producer.get(tensor, -1)


def _shape_ok(have: tuple[int, ...] | None, want: Sequence[int]) -> bool:
    if have is None:
        return True  # unknown to shape inference: the runtime comparison will tell
    if len(have) != len(want):
        return False
    return all(h < 0 or w < 0 or h == w for i, (h, w) in enumerate(zip(have, want)) if i > 0)
