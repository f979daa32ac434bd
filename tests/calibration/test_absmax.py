"""collect_absmax: the maxima reduced inside the graph equal the fetching observers' (issue 30: the float16
evidence of ViT-B/16 in one pass of plain runs), a −inf mask falls back to the fetching path, the model is
left as it was."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

from vitexport.calibration.collect import collect, collect_absmax
from vitexport.calibration.data import NpzSamples
from vitexport.calibration.observers import MinMaxObserver


def _model() -> ir.Model:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 8], np.random.default_rng(0).standard_normal(64).astype(np.float32))
    mask = helper.make_tensor("mask", TensorProto.BOOL, [1, 4, 8], (np.arange(32) % 5 == 0).tolist())
    fill = helper.make_tensor("fill", TensorProto.FLOAT, [], [-np.inf])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Mul", ["h", "h"], ["sq"], name="sq"),
             helper.make_node("Where", ["mask", "fill", "sq"], ["masked"], name="where"),
             helper.make_node("Softmax", ["masked"], ["y"], axis=-1, name="softmax")]
    g = helper.make_graph(nodes, "g", [x], [y], [w, mask, fill],
                          value_info=[helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, 8]) for n in ("h", "sq", "masked")])
    return ir.serde.deserialize_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_in_graph_maxima_equal_the_observers_and_leave_the_model_alone():
    model = _model()
    before = onnx.printer.to_text(ir.serde.serialize_model(model))
    samples = NpzSamples({"x": np.random.default_rng(1).standard_normal((5, 4, 8)).astype(np.float32) * 3}, None, "t")
    names = ["x", "h", "sq", "masked", "y"]
    runs: list[int] = []
    got = collect_absmax(model, samples, names, on_run=runs.append)
    observers = {t: [MinMaxObserver()] for t in names}
    collect(model, samples, observers)
    want = {t: max(abs(ob.min), abs(ob.max)) for t, (ob,) in observers.items()}
    assert set(got) == set(want)
    for t in names:
        assert np.isclose(got[t], want[t], rtol=1e-6), t
    # "masked" holds −inf: its finite maximum comes from the fetching path, one more pass of 5 runs
    assert np.isfinite(got["masked"]) and len(runs) == 10
    assert onnx.printer.to_text(ir.serde.serialize_model(model)) == before
