"""``simplify_onnx``: onnxsim (constant folding, shape inference), then the target contract and rules.

The contract is checked on the simplified graph *before* anything is written, so a violation leaves
no artifact behind. onnxsim never sees the weights it cannot change: a weight read only as the
weight input of MatMul / Gemm / Conv is lifted out as a typed graph input while onnxsim runs
(:func:`vitexport.graph.weights_as_inputs`), which on ViT-B/16 keeps 350 MB out of two protobuf
round trips; the simplified graph gets the very same tensors back, then is saved with onnx-ir.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import field
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from ..graph.files import load_model, save_model
from ..graph.query import const_array, static_shape
from ..graph.weights import LIFT_MIN_BYTES, reattach, weights_as_inputs
from ..quiet import captured_output
from ..recipe import Recipe
from ..check import CheckTarget, model_violations, run_checker
from ..results import Data, result
from .contract import raise_violations
from .op_lowering import GRAPH_LOWERABLE, lower_to_allowed_ops
from .resize import align_corners_as_asymmetric
from .resize_matmul import fractional_resize_as_matmul
from .scatter import slice_scatter_as_concat

__all__ = ["SimplifyReport", "simplify_onnx", "SKIPPED_OPTIMIZERS"]

# onnxsim passes left off, and why:
# - fuse_matmul_add_bias_into_gemm turns a 3-D MatMul + Add into Reshape/Gemm/Reshape: more nodes
#   on the activations, TensorRT fuses the bias itself, and the quantizer's patterns expect MatMul;
# - fuse_qkv merges q/k/v projections: that is the ``fuse_qkv`` pass's job, gated by its own parity.
SKIPPED_OPTIMIZERS = ["fuse_matmul_add_bias_into_gemm", "fuse_qkv"]
# (op, input index) pairs through which a weight is only read, never folded with something else.
_OPAQUE_USES = {("MatMul", 1), ("Gemm", 1), ("Conv", 1), ("ConvTranspose", 1)}


@result
class SimplifyReport(Data):
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



def _opaque(value: ir.Value) -> bool:
    """A large weight only read as the weight of MatMul/Gemm/Conv (a Conv feeding a
    BatchNormalization is not opaque: onnxsim folds the BN into it)."""
    t = value.const_value
    if t is None or t.nbytes < LIFT_MIN_BYTES or value.is_graph_output() or value.is_graph_input():
        return False
    uses = value.uses()
    return bool(uses) and all(
        (u.node.op_type, u.idx) in _OPAQUE_USES
        and not (u.node.op_type == "Conv" and any(c.node.op_type == "BatchNormalization" for c in u.node.outputs[0].uses()))
        for u in uses
    )


def _lift_folded_weights(model: ir.Model) -> int:
    """Make each ``Constant`` node read only as the weight of a Conv/MatMul/Gemm an initializer again.

    onnxsim writes what it folded (a BatchNorm folded into its conv, a scale into a 1x1 conv) as
    ``Constant`` nodes; the quantizer writes Q/DQ weights only for initializers, so those convs stayed
    float (EfficientFormerV2's depthwise ``mlp.mid`` convs and ``talking_head1``: 14 convs, 3.6 % of
    its MACs). Returns how many were lifted."""
    lifted = 0
    for node in list(model.graph):
        out = node.outputs[0] if node.op_type == "Constant" and node.outputs else None
        attr = node.attributes.get("value") if out is not None else None
        if attr is None or out.is_graph_output() or not out.uses() or \
                not all((u.node.op_type, u.idx) in _OPAQUE_USES for u in out.uses()):
            continue
        tensor = attr.value
        value = ir.Value(name=out.name, shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype), const_value=tensor)
        out.replace_all_uses_with(value)
        model.graph.remove(node, safe=True)
        model.graph.register_initializer(value)
        lifted += 1
    return lifted


def _fold_constant_where(model: ir.Model) -> int:
    """Replace each ``Where`` whose condition is a constant, all true or all false, by the branch it
    always takes (when that branch already has the output's shape).

    A detector's ``pixel_mask`` is a fixed all-ones input here, so DETR-style attention masks export as
    ``Where(true, scores, -inf)``: a no-op that onnxsim keeps (the scores are not constant) and
    rknn-toolkit2's where/softmax quantization pass crashes on (Conditional DETR: IndexError). Exact.
    Returns how many were folded."""
    folded = 0
    for node in list(model.graph):
        if node.op_type != "Where" or node.outputs[0].is_graph_output():
            continue
        cond = const_array(node.inputs[0])
        if cond is None or cond.dtype != np.bool_ or not (cond.all() or not cond.any()):
            continue
        taken = node.inputs[1] if cond.all() else node.inputs[2]
        if taken is None or static_shape(taken) is None or static_shape(taken) != static_shape(node.outputs[0]):
            continue
        node.outputs[0].replace_all_uses_with(taken)
        model.graph.remove(node, safe=True)
        folded += 1
    return folded


#: comparisons :func:`_fold_compare_of_select` folds, as numpy reads them
_COMPARES = {"Greater": np.greater, "Less": np.less, "GreaterOrEqual": np.greater_equal,
             "LessOrEqual": np.less_equal, "Equal": np.equal}


def _uniform(value: ir.Value | None) -> np.ndarray | None:
    """A constant whose elements are all one value, as a 0-d array, else None."""
    a = const_array(value)
    if a is None or a.size == 0 or not (a == a.flat[0]).all():
        return None
    return a.reshape(-1)[:1].reshape(())


def _fold_compare_of_select(model: ir.Model) -> int:
    """Replace a comparison of ``Where(c, a, b)`` with a constant, ``a``/``b``/the constant each one
    value, by ``c`` itself (or ``Not(c)``) when the comparison tells ``a`` from ``b``.

    An additive padding mask built from ``attention_mask`` (``Where(keep, 0, -inf)``) that
    ``mask_to_where`` turns back into a condition arrives as ``Greater(Where(keep, 0, -inf), t)``: a
    float compare that the integer prefix (``vitexport.graph.split``) cannot take and rknn-toolkit2 runs
    on its CPU (all-mpnet-base-v2: one ``Greater`` feeding every layer's mask). Folded, every layer reads
    the boolean ``keep`` directly. Exact. Returns how many were folded."""
    folded = 0
    for node in list(model.graph):
        compare = _COMPARES.get(node.op_type)
        out = node.outputs[0] if node.outputs else None
        if compare is None or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2 or out is None \
                or out.is_graph_output():
            continue
        for side in (0, 1):
            select, bound = node.inputs[side], _uniform(node.inputs[1 - side])
            where = select.producer() if select is not None else None
            if bound is None or where is None or where.op_type != "Where" or where.domain not in ("", "ai.onnx"):
                continue
            cond, a, b = where.inputs[0], _uniform(where.inputs[1]), _uniform(where.inputs[2])
            if a is None or b is None or static_shape(cond) is None or static_shape(cond) != static_shape(out):
                continue
            ra, rb = (bool(compare(a, bound)), bool(compare(b, bound))) if side == 0 else \
                     (bool(compare(bound, a)), bool(compare(bound, b)))
            if ra == rb:  # the comparison is a constant: onnxsim's to fold, not this pass's
                continue
            if ra:
                replacement = cond
            else:
                inverse = ir.node("Not", [cond], name=f"{node.name}_not")
                model.graph.insert_before(node, inverse)
                replacement = inverse.outputs[0]
                replacement.shape, replacement.type = cond.shape, cond.type
            out.replace_all_uses_with(replacement)
            model.graph.remove(node, safe=True)
            if not where.outputs[0].uses() and not where.outputs[0].is_graph_output():
                model.graph.remove(where, safe=True)  # the float mask had no other reader
            folded += 1
            break
    return folded


def _strip_onnxsim_metadata(model: onnx.ModelProto) -> None:
    # onnxsim records its options and the names of every removed node: run-specific noise in an
    # artifact a compiler reads; the report keeps the counts.
    keep = [p for p in model.metadata_props if not p.key.startswith("onnxsim.")]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)


def _target_rewrites(simplified: ir.Model, recipe: Recipe) -> list[str]:
    """The recipe's exact rewrites of ops its target runs badly, in place; a note per kind that changed."""
    notes: list[str] = []
    lowered = lower_to_allowed_ops(simplified, recipe.contract.allowed_ops)
    if lowered:
        notes += [f"{op} written as {GRAPH_LOWERABLE[op][1]} (not in contract.allowed_ops): {k} node(s)"
                  for op, k in sorted(lowered.items())]
    resized = align_corners_as_asymmetric(simplified) if recipe.export.align_corners_resize == "asymmetric" else 0
    if resized:
        notes.append(f"{resized} align-corners Resize(s) by 2 written as an asymmetric Resize and an exact per-axis "
                     "correction (depthwise Conv, Mul, Add; export.align_corners_resize=asymmetric)")
    mixed = fractional_resize_as_matmul(simplified) if recipe.export.fractional_resize == "matmul" else 0
    if mixed:
        notes.append(f"{mixed} linear Resize(s) by a fractional factor on a small map written as a MatMul with the "
                     "constant interpolation matrix (export.fractional_resize=matmul)")
    scattered = slice_scatter_as_concat(simplified) if recipe.export.slice_scatter == "concat" else 0
    if scattered:
        notes.append(f"{scattered} ScatterND node(s) that overwrite one slice written as Slice and Concat "
                     "(export.slice_scatter=concat)")
    return notes


def simplify_onnx(
    in_path: str | Path,
    out_path: str | Path,
    target: CheckTarget,
    *,
    recipe_path: str | Path | None = None,
) -> SimplifyReport:
    """Simplify ``in_path`` with onnxsim, check the target's rules and its recipe's contract, write ``out_path``.

    ``recipe.export.simplify: false`` skips onnxsim; the contract is checked either way.

    Args:
        in_path: the exported ONNX file.
        out_path: the simplified file (``model.fp32.onnx``, with ``.data`` for a large model);
            written atomically, only after the contract holds.
        target: the run's target (its rules; its recipe's ``contract`` and ``export.simplify``).
        recipe_path: how to name the recipe in messages (default ``recipes/<name>.yaml``).
    Returns:
        A :class:`SimplifyReport`.
    Raises:
        ContractViolation: the graph breaks the contract or the target's rules (exit code 2);
            ``out_path`` is not written.
        BadInput: ``in_path`` is missing or is not an ONNX model.
    """
    t0 = time.perf_counter()
    recipe = target.recipe
    in_path, out_path = Path(in_path), Path(out_path)
    model = load_model(in_path)
    ops_before, nodes_before = Counter(n.op_type for n in model.graph), model.graph.num_nodes()
    notes: list[str] = []
    initializers = dict(model.graph.initializers)
    with weights_as_inputs(model, lift=_opaque) as (proto, weights):
        held = {name: initializers[name] for name in weights}
        if recipe.export.simplify:
            import onnxsim  # heavy import, only needed here

            # onnxsim prints a warning per node it cannot fold (396 lines on torchvision's swin_s): into the log
            with captured_output("onnxsim") as printed:
                proto, ok = onnxsim.simplify(proto, check_n=0, skipped_optimizers=list(SKIPPED_OPTIMIZERS), certify=False)
            notes += [printed.note()] if printed.lines else []
            if not ok:  # with check_n=0 this is onnxsim's own checker run
                raise RuntimeError(f"onnxsim produced an invalid model from {in_path}")
            _strip_onnxsim_metadata(proto)
        else:
            notes.append("export.simplify is false: onnxsim skipped, contract checked on the exported graph")
        simplified = reattach(proto, held)
        violations = run_checker(proto)  # the weights held aside are typed graph inputs here
    if lifted := _lift_folded_weights(simplified):
        notes.append(f"{lifted} folded weight(s) onnxsim wrote as Constant nodes made initializers (the quantizer's weights)")
    if wheres := _fold_constant_where(simplified):
        notes.append(f"{wheres} Where node(s) with a constant all-true/all-false condition replaced by their branch")
    if compares := _fold_compare_of_select(simplified):
        notes.append(f"{compares} comparison(s) of a Where(mask, a, b) with a constant replaced by the mask itself")
    rewrites = _target_rewrites(simplified, recipe)
    notes += rewrites
    if rewrites:
        # the checker again, on the rewritten graph, its large weights held aside as above: a weight
        # still in the input's .data file has no folder to be read from in a proto (swinv2_tiny, 112 MB)
        with weights_as_inputs(simplified) as (proto, _):
            violations = run_checker(proto)
    # the same rules as ``vitexport check``: the contract, then the target's (no rule reads a weight)
    violations += model_violations(simplified, target)
    raise_violations(violations, target, recipe_path, out_path.name)
    kept = [v for v in simplified.graph.initializers.values() if v.name in held]
    save_model(simplified, out_path)
    ops_after = Counter(n.op_type for n in simplified.graph)
    notes.append(f"nodes {nodes_before} -> {simplified.graph.num_nodes()}; contract of '{recipe.name}' holds")
    return SimplifyReport(
        path=str(out_path), simplified=recipe.export.simplify, nodes_before=nodes_before,
        nodes_after=simplified.graph.num_nodes(), ops_before=dict(sorted(ops_before.items())),
        ops_after=dict(sorted(ops_after.items())), held_initializers=len(kept),
        held_bytes=sum(v.const_value.nbytes for v in kept), contract="holds", seconds=time.perf_counter() - t0, notes=notes,
    )
