"""Lower a model's default-domain opset (the dynamo exporter writes opset 18 at least).

``onnx.version_converter`` does most of the work, with two gaps this module fills:
- converting ``ReduceX`` below 18 it keeps ``noop_with_empty_axes``, which the older ops do not
  have; the attribute's default (0) means nothing, so it is dropped first;
- it has no 14 → 13 adapter for ``Reshape``. Opset 14 changed few ops, mostly by adding types or an
  attribute whose default keeps the opset-13 meaning, so those nodes are relabelled when the new
  attribute is absent or default, and anything else is refused by name.
"""
from __future__ import annotations

import numpy
import onnx
import onnx.version_converter
from onnx import numpy_helper

__all__ = ["default_opset", "convert_opset"]

# Ops whose opset-14 version only added input types that a float model never uses.
_TYPES_ONLY_AT_14 = {"Add", "Sub", "Mul", "Div", "Relu", "Identity", "CumSum"}
# Ops whose opset-14 version added an attribute whose default (0) is the opset-13 behaviour.
_NEW_ATTRIBUTE_AT_14 = {"Reshape": "allowzero", "BatchNormalization": "training_mode",
                        "GRU": "layout", "LSTM": "layout", "RNN": "layout"}


def default_opset(model: onnx.ModelProto) -> int:
    """The model's ``ai.onnx`` opset version (0 when it imports none)."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _drop_default_reduce_attributes(model: onnx.ModelProto) -> None:
    for node in model.graph.node:
        if node.op_type.startswith("Reduce"):
            keep = [a for a in node.attribute if not (a.name == "noop_with_empty_axes" and a.i == 0)]
            if len(keep) != len(node.attribute):
                del node.attribute[:]
                node.attribute.extend(keep)


def _constant_values(model: onnx.ModelProto) -> dict[str, numpy.ndarray]:
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            for a in node.attribute:
                if a.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(a.t)
    return values


def _reshape_allowzero_is_moot(node: onnx.NodeProto, constants: dict) -> bool:
    """``allowzero=1`` only differs from 0 when the target shape holds a 0 (dynamo sets it always)."""
    shape = constants.get(node.input[1]) if len(node.input) > 1 else None
    return shape is not None and bool((shape != 0).all())


def _relabel_14_as_13(model: onnx.ModelProto) -> onnx.ModelProto:
    constants = _constant_values(model)
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if onnx.defs.get_schema(node.op_type, 14, "").since_version != 14:
            continue  # unchanged between 13 and 14
        name = f"node '{node.name}' ({node.op_type})"
        if node.op_type in _TYPES_ONLY_AT_14:
            continue
        attr = _NEW_ATTRIBUTE_AT_14.get(node.op_type)
        if attr is None:
            raise ValueError(f"{name} has no opset-13 form")
        if any(a.name == attr and a.i != 0 for a in node.attribute):
            if not (node.op_type == "Reshape" and _reshape_allowzero_is_moot(node, constants)):
                raise ValueError(f"{name} sets {attr}, which opset 13 does not have")
        keep = [a for a in node.attribute if a.name != attr]
        del node.attribute[:]
        node.attribute.extend(keep)
        if node.op_type == "BatchNormalization" and len(node.output) > 1:
            raise ValueError(f"{name} has training outputs")
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            imp.version = 13
    return model


def convert_opset(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """Return ``model`` at default-domain opset ``target`` (a new proto unless nothing changes).

    Raises:
        ValueError: an op has no form at the target opset; the message names the node.
    """
    current = default_opset(model)
    if current == target:
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())  # never edit the caller's proto
    if current > target:
        _drop_default_reduce_attributes(model)
    # onnx's converter has no 14 -> 13 Reshape adapter: go to 14 with it, relabel the last step.
    step = 14 if target == 13 and current > 13 else target
    if step != current:
        try:
            model = onnx.version_converter.convert_version(model, step)
        except Exception as exc:  # the converter raises RuntimeError/ValueError with C++ text
            raise ValueError(f"onnx version converter {current} -> {step}: {str(exc).splitlines()[0]}") from None
    if step != target:
        model = _relabel_14_as_13(model)
    onnx.checker.check_model(model)
    return model
