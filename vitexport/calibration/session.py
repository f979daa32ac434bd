"""Float models with their large weights held once, as numpy arrays, outside the protobuf.

A ViT-B ONNX file is 330 MB of weights. Holding it as a ``ModelProto`` *and* handing ONNX Runtime a
serialized copy *and* letting ONNX Runtime keep its own copy triples that. Here the proto keeps
only placeholders (name, dims, type; data marked external) and ONNX Runtime receives the weights
as extra graph inputs, fed from the same numpy arrays on every run (zero copy), so the weights
exist once in the process whatever the number of sessions.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "SPLIT_MIN_BYTES", "load_split", "split_weights", "placeholder", "is_placeholder", "materialize", "FloatSession",
    "session_options",
    "release_memory",
    "spill_to_disk",
]

SPLIT_MIN_BYTES = 16 << 10
_LOCATION = "vitexport:in-memory"


def split_weights(model: onnx.ModelProto, min_bytes: int = SPLIT_MIN_BYTES) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A skeleton of ``model`` (float initializers ≥ ``min_bytes`` replaced by placeholders) and the arrays."""
    sk = onnx.ModelProto()
    sk.ir_version = model.ir_version
    sk.producer_name = model.producer_name
    sk.producer_version = model.producer_version
    sk.domain = model.domain
    sk.model_version = model.model_version
    sk.doc_string = model.doc_string
    sk.opset_import.extend(model.opset_import)
    sk.metadata_props.extend(model.metadata_props)
    g, src = sk.graph, model.graph
    g.name = src.name
    g.node.extend(src.node)
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    arrays: dict[str, np.ndarray] = {}
    for init in src.initializer:
        if init.data_type == TensorProto.FLOAT and init.raw_data and len(init.raw_data) >= min_bytes:
            arrays[init.name] = numpy_helper.to_array(init).copy()
            g.initializer.append(placeholder(init.name, init.dims))
        else:
            g.initializer.append(init)
    return sk, arrays


def placeholder(name: str, dims) -> TensorProto:
    t = TensorProto()
    t.name = name
    t.data_type = TensorProto.FLOAT
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    e = t.external_data.add()
    e.key, e.value = "location", _LOCATION
    return t


def is_placeholder(t: TensorProto) -> bool:
    return t.data_location == TensorProto.EXTERNAL and any(e.value == _LOCATION for e in t.external_data)


def load_split(path: str | Path, min_bytes: int = SPLIT_MIN_BYTES) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """``onnx.load`` then :func:`split_weights`; the full proto is released before returning."""
    full = onnx.load(str(path))
    sk, arrays = split_weights(full, min_bytes)
    del full
    return sk, arrays


def materialize(t: TensorProto, arrays: dict[str, np.ndarray]) -> TensorProto:
    """A real initializer for a placeholder (others are returned as they are)."""
    if is_placeholder(t):
        return numpy_helper.from_array(np.ascontiguousarray(arrays[t.name], dtype=np.float32), t.name)
    return t


def session_options(threads: int = 0, low_memory: bool = True,
                    level: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    opts.graph_optimization_level = level
    # no busy-waiting worker threads: calibration runs many small graphs, often on shared machines
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if low_memory:
        opts.enable_cpu_mem_arena = False
        opts.add_session_config_entry("session.disable_prepacking", "1")
    return opts


class FloatSession:
    """An ONNX Runtime session over a skeleton + arrays; ``run(names, feed)`` like ``InferenceSession``.

    Args:
        skeleton: the model with placeholders (or a complete model: then nothing is fed).
        arrays: the placeholders' values.
        outputs: the graph outputs to expose (default: the model's own).
    """

    def __init__(self, skeleton: onnx.ModelProto, arrays: dict[str, np.ndarray], outputs: list[str] | None = None,
                 threads: int = 0, low_memory: bool = True):
        g = skeleton.graph
        light = onnx.ModelProto()
        light.ir_version = skeleton.ir_version
        light.opset_import.extend(skeleton.opset_import)
        lg = light.graph
        lg.name = g.name
        lg.node.extend(g.node)
        lg.input.extend(g.input)
        self.weight_feed: dict[str, np.ndarray] = {}
        declared = {i.name for i in g.input}
        for init in g.initializer:
            if is_placeholder(init):
                if init.name not in declared:
                    lg.input.append(helper.make_tensor_value_info(init.name, TensorProto.FLOAT, list(init.dims)))
                self.weight_feed[init.name] = np.ascontiguousarray(arrays[init.name], dtype=np.float32)
            else:
                lg.initializer.append(init)
        if outputs is None:
            lg.output.extend(g.output)
        else:
            lg.output.extend(onnx.ValueInfoProto(name=n) for n in outputs)
        data = light.SerializeToString()
        del light
        self.session = ort.InferenceSession(data, session_options(threads, low_memory), providers=["CPUExecutionProvider"])
        self.data_inputs = [i.name for i in self.session.get_inputs() if i.name not in self.weight_feed]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, names: list[str] | None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        full = {k: v for k, v in feed.items() if k in self.data_inputs}
        full.update(self.weight_feed)
        return self.session.run(names, full)


def release_memory() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them after large frees); no-op elsewhere."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def spill_to_disk(arrays: dict[str, np.ndarray], path: str | Path, min_total: int = 64 << 20) -> bool:
    """Move ``arrays`` into one file and replace them, in place, by read-only memory maps.

    Pages are read back only when something touches them, so a phase that does not need the float
    weights (evaluating the INT8 model) runs without them resident. Nothing is done below
    ``min_total`` bytes. The caller deletes ``path`` when done (an open map survives the unlink).

    Returns:
        Whether the arrays were spilled.
    """
    if sum(a.nbytes for a in arrays.values()) < min_total:
        return False
    path = Path(path)
    layout: dict[str, tuple[int, tuple[int, ...]]] = {}
    with open(path, "wb") as fh:
        offset = 0
        for name, a in arrays.items():
            a = np.ascontiguousarray(a, dtype=np.float32)
            a.tofile(fh)
            layout[name] = (offset, a.shape)
            offset += a.nbytes
    for name, (offset, shape) in layout.items():
        arrays[name] = np.memmap(path, dtype=np.float32, mode="r", offset=offset, shape=shape)
    release_memory()
    return True
