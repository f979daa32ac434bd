"""``simplify_onnx``: onnxsim (constant folding, shape inference), then the target contract.

The contract is checked on the simplified graph *before* anything is written, so a violation leaves
no artifact behind. Weights are held aside during simplification (see :mod:`.wire`): onnxsim only
sees the graph, which on ViT-B/16 cuts the stage from about 5 s to about 1 s, most of it disk.
"""
from __future__ import annotations

import contextlib
import mmap
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import onnx
from onnx import helper

from ..errors import BadInput
from ..io import atomic_path
from ..recipe import Recipe
from .contract import contract_violations, raise_violations, run_checker
from .wire import HeldTensor, split_initializers, tensor_bytes, write_joined

__all__ = ["SimplifyReport", "simplify_onnx", "SKIPPED_OPTIMIZERS"]

# onnxsim passes left off, and why:
# - fuse_matmul_add_bias_into_gemm turns a 3-D MatMul + Add into Reshape/Gemm/Reshape: more nodes
#   on the activations, TensorRT fuses the bias itself, and the quantizer's patterns expect MatMul;
# - fuse_qkv merges q/k/v projections: that is the ``fuse_qkv`` pass's job, gated by its own parity.
SKIPPED_OPTIMIZERS = ["fuse_matmul_add_bias_into_gemm", "fuse_qkv"]
# (op, input index) pairs through which a weight is only read, never folded with something else.
_OPAQUE_USES = {("MatMul", 1), ("Gemm", 1), ("Conv", 1), ("ConvTranspose", 1)}


@dataclass
class SimplifyReport:
    """Node counts before and after, what was held aside, and the contract verdict."""

    path: str
    simplified: bool
    nodes_before: int
    nodes_after: int
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    held_initializers: int
    held_bytes: int
    contract: str
    seconds: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _opaque(model: onnx.ModelProto, held: list[HeldTensor]) -> tuple[list[HeldTensor], list[HeldTensor]]:
    """Split ``held`` into weights only read by MatMul/Gemm/Conv and the others.

    A Conv whose output feeds BatchNormalization is not opaque: onnxsim folds the BN into it.
    """
    uses: dict[str, list[tuple[str, int, onnx.NodeProto]]] = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            uses.setdefault(name, []).append((node.op_type, i, node))
    bn_inputs = {n.input[0] for n in model.graph.node if n.op_type == "BatchNormalization" and n.input}
    # An initializer also listed as a graph input (old IR style) or output keeps its place.
    interface = {o.name for o in model.graph.output} | {i.name for i in model.graph.input}
    keep, give_back = [], []
    for h in held:
        u = uses.get(h.name, [])
        ok = bool(u) and h.name not in interface and all(
            (op, i) in _OPAQUE_USES and not (op == "Conv" and node.output[0] in bn_inputs) for op, i, node in u
        )
        (keep if ok else give_back).append(h)
    return keep, give_back


def _strip_onnxsim_metadata(model: onnx.ModelProto) -> None:
    # onnxsim records its options and the names of every removed node: run-specific noise in an
    # artifact a compiler reads; the report keeps the counts.
    keep = [p for p in model.metadata_props if not p.key.startswith("onnxsim.")]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)


def simplify_onnx(
    in_path: str | Path,
    out_path: str | Path,
    recipe: Recipe,
    *,
    recipe_path: str | Path | None = None,
) -> SimplifyReport:
    """Simplify ``in_path`` with onnxsim, check ``recipe``'s contract, write ``out_path``.

    ``recipe.export.simplify: false`` skips onnxsim; the contract is checked either way.

    Args:
        in_path: the exported ONNX file.
        out_path: the simplified file (``model.fp32.onnx``); written atomically, only after the
            contract holds.
        recipe: the target recipe (``contract`` rules, ``export.simplify``).
        recipe_path: how to name the recipe in messages (default ``recipes/<name>.yaml``).
    Returns:
        A :class:`SimplifyReport`.
    Raises:
        ContractViolation: the graph breaks the contract (exit code 2); ``out_path`` is not written.
        BadInput: ``in_path`` is missing or is not an ONNX model.
    """
    t0 = time.perf_counter()
    in_path, out_path = Path(in_path), Path(out_path)
    try:
        fh = open(in_path, "rb")
    except OSError as exc:
        raise BadInput(f"{in_path}: cannot read an ONNX model: {exc.strerror or exc}") from None
    # A read-only map: splitting reads the tensors' headers only, and their data goes from this
    # file to the output in the kernel without ever passing through Python.
    with fh, _mapped(fh, in_path) as source:
        return _simplify(source, fh.fileno(), in_path, out_path, recipe, recipe_path, t0)


@contextlib.contextmanager
def _mapped(fh, path: Path) -> Iterator[mmap.mmap]:
    try:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (ValueError, OSError) as exc:  # an empty file cannot be mapped
        raise BadInput(f"{path}: cannot read an ONNX model: {exc}") from None
    try:
        yield mm
    finally:
        mm.close()


def _simplify(source: mmap.mmap, src_fd: int, in_path: Path, out_path: Path, recipe: Recipe,
              recipe_path: str | Path | None, t0: float) -> SimplifyReport:
    try:
        stub_bytes, held = split_initializers(source, 0)
        model = onnx.ModelProto.FromString(stub_bytes)
    except Exception as exc:  # ValueError from the wire reader, protobuf's DecodeError
        raise BadInput(f"{in_path}: not an ONNX model ({type(exc).__name__}: {exc})") from None
    ops_before = Counter(n.op_type for n in model.graph.node)
    nodes_before = len(model.graph.node)

    held, give_back = _opaque(model, held)
    model.graph.initializer.extend(onnx.TensorProto.FromString(tensor_bytes(source, h)) for h in give_back)
    held_names = {h.name for h in held}
    # Held weights become graph inputs with their exact type and shape: shape inference still sees
    # them, constant folding does not.
    model.graph.input.extend(helper.make_tensor_value_info(h.name, h.data_type, list(h.dims)) for h in held)

    notes: list[str] = []
    if recipe.export.simplify:
        import onnxsim  # heavy import, only needed here

        simplified, ok = onnxsim.simplify(
            model, check_n=0, skipped_optimizers=list(SKIPPED_OPTIMIZERS), certify=False,
        )
        if not ok:  # with check_n=0 this is onnxsim's own checker run
            raise RuntimeError(f"onnxsim produced an invalid model from {in_path}")
        _strip_onnxsim_metadata(simplified)
    else:
        simplified = model
        notes.append("export.simplify is false: onnxsim skipped, contract checked on the exported graph")

    used = {name for n in simplified.graph.node for name in n.input}
    held = [h for h in held if h.name in used]  # a weight whose consumer was folded away goes too
    violations = run_checker(simplified)
    inputs = [onnx.ValueInfoProto.FromString(i.SerializeToString()) for i in simplified.graph.input
              if i.name not in held_names]
    del simplified.graph.input[:]
    simplified.graph.input.extend(inputs)
    violations += contract_violations(simplified, recipe, [(h.name, h.data_type) for h in held])
    raise_violations(violations, recipe, recipe_path, out_path.name)

    with atomic_path(out_path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            write_joined(fd, simplified.SerializeToString(), held, src_fd, source)
        finally:
            os.close(fd)
    ops_after = Counter(n.op_type for n in simplified.graph.node)
    notes.append(f"nodes {nodes_before} -> {len(simplified.graph.node)}; contract of '{recipe.name}' holds")
    return SimplifyReport(
        path=str(out_path), simplified=recipe.export.simplify, nodes_before=nodes_before,
        nodes_after=len(simplified.graph.node), ops_before=dict(sorted(ops_before.items())),
        ops_after=dict(sorted(ops_after.items())), held_initializers=len(held),
        held_bytes=sum(h.nbytes for h in held), contract="holds", seconds=time.perf_counter() - t0, notes=notes,
    )
