"""The one place ONNX Runtime sessions are made.

Every session vitexport opens — the ONNX Runtime runner, calibration, the INT8 gate's arithmetic,
the fallback's evaluations, NaN hunting, latency timing — comes from :class:`Session`, configured by
a :class:`SessionConfig`. A session on an in-memory ``ir.Model`` gets the model's large float weights
as inputs fed from the model's own arrays (:func:`vitexport.graph.weights_as_inputs`), so a ViT-B/16
calibrated with several sessions still holds its weights once.
"""
from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from ..graph.files import as_model
from ..graph.weights import weights_as_inputs
from ..memory import release_memory

__all__ = ["SessionConfig", "Session", "session_options", "ORT_TYPES", "QDQ_AS_FLOAT", "LOW_MEMORY", "CALIBRATION", "TIMING",
           "missing_kernel"]

ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
    "tensor(uint8)": np.uint8,
    "tensor(int8)": np.int8,
}

_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


@dataclass(frozen=True)
class SessionConfig:
    """How a session runs.

    Attributes:
        threads: intra-op threads (0: ONNX Runtime decides).
        optimization: graph optimisation level (``disable`` keeps every node observable).
        low_memory: no memory arena and no weight pre-packing (pre-packing copies every MatMul
            weight; an arena keeps a run's peak allocation for the session's life).
        qdq_as_float: run QuantizeLinear/DequantizeLinear as float ops (``session.disable_quant_qdq``)
            instead of fusing them into ONNX Runtime's x86 integer kernels: the fake-quantised
            arithmetic TensorRT or an NPU performs.
        spinning: let idle worker threads spin (fast for timing, wasteful on a shared machine).
        arena: ONNX Runtime's memory arena (None: none where ``low_memory``). A session that runs a model
            many times with few outputs gains by one: without it every buffer of 1 MiB or more is a fresh
            mapping on every run (:func:`~vitexport.memory.bounded_heap`), page faults and all.
        mem_pattern: ONNX Runtime's memory pattern (one block planned for a whole run's buffers; None: its
            default, on). Off beside an arena, the arena recycles buffers as they are freed instead of holding
            the planned block (the measurements at :data:`QDQ_AS_FLOAT`).
        prepack: pre-pack the MatMul/Gemm weights of an in-memory model even where ``low_memory``: the
            weights are handed to ONNX Runtime as initializers that share the model's arrays (no copy), and
            each is packed once for the GEMM kernels instead of on every run. Costs one packed copy of the
            weights for the session's life; saves ~15 % of each run (:data:`CALIBRATION`).
    """

    threads: int = 0
    optimization: str = "all"
    low_memory: bool = False
    qdq_as_float: bool = False
    spinning: bool = False
    arena: bool | None = None
    mem_pattern: bool | None = None
    prepack: bool = False


#: calibration and evaluation sessions: no arena, no pre-packing, no spinning threads
LOW_MEMORY = SessionConfig(optimization="extended", low_memory=True)
#: the float-semantics Q/DQ arithmetic of TensorRT / NPU targets, with an arena and no memory pattern: such a
#: session runs a model over many samples and hands back its outputs only. Measured, ViT-B/16's Q/DQ file with
#: FP16 float parts (ONNX Runtime converts each float16 weight to float32 on every run: 86 M values), 2 threads,
#: AMD EPYC, per run / process peak: no arena 0.55 s / 649 MB; arena 0.41 s / 1009 MB (the pattern's block,
#: grown by powers of two); arena without the pattern 0.38 s / 654 MB
QDQ_AS_FLOAT = replace(LOW_MEMORY, qdq_as_float=True, arena=True, mem_pattern=False)
#: a float model run over many samples, one session at a time (the calibration passes, the judge's float
#: reference): LOW_MEMORY with its weights pre-packed. Measured on ViT-B/16, 2 threads, AMD EPYC, per run /
#: resident memory after the first run: 0.246 s / 504 MB fed as inputs, 0.216 s / 836 MB pre-packed
CALIBRATION = replace(LOW_MEMORY, prepack=True)
#: latency measurement: every optimisation, pre-packed weights, spinning threads, as deployed
TIMING = SessionConfig(threads=2, optimization="all", spinning=True)


def session_options(config: SessionConfig) -> ort.SessionOptions:
    """ONNX Runtime options for ``config``."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = config.threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    opts.graph_optimization_level = _LEVELS[config.optimization]
    if not config.spinning:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.enable_cpu_mem_arena = config.arena if config.arena is not None else not config.low_memory
    if config.mem_pattern is not None:
        opts.enable_mem_pattern = config.mem_pattern
    if config.low_memory and not config.prepack:
        opts.add_session_config_entry("session.disable_prepacking", "1")
    if config.qdq_as_float:
        opts.add_session_config_entry("session.disable_quant_qdq", "1")
    return opts


#: an in-memory model still carrying this many bytes of constants (quantized weights: they cannot be
#: fed as inputs without losing ONNX Runtime's constant folding of their dequantization) is handed
#: over as a file: ONNX Runtime keeps a serialised model's protobuf beside its own copy of the
#: tensors, a file's external data it reads once (ViT-B/16 Q/DQ: 0.2 GB instead of 0.7 GB)
_FILE_MIN_BYTES = 16 << 20


def _from_proto(proto: onnx.ModelProto, opts: ort.SessionOptions) -> ort.InferenceSession:
    """A session on ``proto``: serialised when small, else through a temporary external-data file."""
    providers = ["CPUExecutionProvider"]
    if sum(len(t.raw_data) for t in proto.graph.initializer) < _FILE_MIN_BYTES:
        return ort.InferenceSession(proto.SerializeToString(), opts, providers=providers)
    with tempfile.TemporaryDirectory(prefix="vitexport-session-") as tmp:
        path = Path(tmp) / "model.onnx"
        # moves the tensors' bytes out of the protobuf into model.onnx.data (the proto is a throwaway)
        onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="model.onnx.data", size_threshold=1024)
        return ort.InferenceSession(str(path), opts, providers=providers)


def _share_initializers(proto: onnx.ModelProto, weights: dict[str, np.ndarray],
                        opts: ort.SessionOptions) -> list[ort.OrtValue]:
    """Turn ``proto``'s lifted weight inputs back into initializers whose bytes ONNX Runtime takes from
    ``weights`` (``add_external_initializers``: no copy), so its kernels may pre-pack them. Returns the
    values ONNX Runtime reads from: they must outlive the session."""
    kept = [i for i in proto.graph.input if i.name not in weights]
    del proto.graph.input[:]
    proto.graph.input.extend(kept)
    values = []
    for name, array in weights.items():
        t = onnx.TensorProto(name=name, data_type=onnx.TensorProto.FLOAT, dims=list(array.shape),
                             data_location=onnx.TensorProto.EXTERNAL)
        t.external_data.add(key="location", value="vitexport-shared-weights")  # never read: supplied below
        proto.graph.initializer.append(t)
        values.append(ort.OrtValue.ortvalue_from_numpy(array))
    opts.add_external_initializers(list(weights), values)
    return values


class Session:
    """An ONNX Runtime CPU session with ``run(names, feed)`` like ``InferenceSession``.

    Args:
        model: an ``ir.Model`` (large float weights fed as inputs, no copy), a path (ONNX Runtime
            reads the file and its external data itself), serialised bytes or a ``ModelProto``.
        config: how it runs.
        outputs: graph outputs to expose instead of the model's own (intermediate tensors, for
            calibration or per-layer comparison); names only, ONNX Runtime infers their types.
    """

    def __init__(self, model: ir.Model | str | Path | bytes | onnx.ModelProto, config: SessionConfig = LOW_MEMORY,
                 outputs: Sequence[str] | None = None):
        self.config = config
        self.weights: dict[str, np.ndarray] = {}
        opts = session_options(config)
        if outputs is not None and not isinstance(model, ir.Model):
            model = as_model(model)
        if isinstance(model, ir.Model):
            with weights_as_inputs(model) as (proto, weights):
                self.weights = {k: np.ascontiguousarray(t.numpy(), dtype=np.float32) for k, t in weights.items()}
                if outputs is not None:
                    del proto.graph.output[:]
                    proto.graph.output.extend(onnx.ValueInfoProto(name=n) for n in outputs)
                if config.prepack and self.weights:
                    # the arrays and ONNX Runtime's views of them live as long as the session
                    self._shared = (self.weights, _share_initializers(proto, self.weights, opts))
                    self.weights = {}
                self.session = _from_proto(proto, opts)
            release_memory()  # the serialised model is gone: hand its pages back (glibc keeps them)
        else:
            if isinstance(model, onnx.ModelProto):
                model = model.SerializeToString()
            self.session = ort.InferenceSession(str(model) if isinstance(model, Path) else model, opts,
                                                providers=["CPUExecutionProvider"])
        self.inputs = [i for i in self.session.get_inputs() if i.name not in self.weights]
        self.input_names = [i.name for i in self.inputs]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def input_types(self) -> dict[str, np.dtype]:
        """Data input name → numpy dtype."""
        return {i.name: np.dtype(ORT_TYPES.get(i.type, np.float32)) for i in self.inputs}

    def run(self, names: Sequence[str] | None, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run one batch; ``feed`` may hold extra arrays (ignored) and needs no weights."""
        full = {k: v for k, v in feed.items() if k in self.input_names}
        full.update(self.weights)
        return self.session.run(list(names) if names is not None else None, full)


_NO_KERNEL = re.compile(r"Could not find an implementation for (\w+)\((\d+)\) node with name '([^']*)'")


def missing_kernel(exc: BaseException, model: str | Path) -> str | None:
    """What a session's failure says ONNX Runtime lacks: ``"node 'X' (GridSample-16 on double inputs)"``,
    or None when ``exc`` is another failure.

    An exported model may use an op at a type the CPU provider has no kernel for (Mask2Former's
    deformable attention samples in float64): that is the model's limit, not a bug of vitexport's.
    """
    found = _NO_KERNEL.search(str(exc))
    if found is None:
        return None
    op, version, node = found.groups()
    types: list[str] = []
    try:
        proto = onnx.shape_inference.infer_shapes(onnx.load(str(model), load_external_data=False))
        known = {v.name: v.type.tensor_type.elem_type for v in (*proto.graph.value_info, *proto.graph.input)}
        known.update({t.name: t.data_type for t in proto.graph.initializer})
        nd = next((n for n in proto.graph.node if n.name == node), None)
        for name in (nd.input if nd is not None else []):
            if known.get(name):
                types.append(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(known[name])).name)
    except Exception:  # noqa: BLE001 - the types only enrich the message; the node and op are known
        types = []
    shown = sorted(set(types), key=types.index)
    on = f" on {'/'.join(shown)} inputs" if shown else ""
    return f"node '{node}' ({op}-{version}{on})"
