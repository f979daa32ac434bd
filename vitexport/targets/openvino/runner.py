"""OpenVINO (CPU plugin) runner, its IR writer, and what the compiled model runs in which precision.

OpenVINO reads vitexport's Q/DQ ONNX directly; on the CPU plugin the Q/DQ around MatMul / Conv become
u8/i8 kernels (``FullyConnected u8``, ``Convolution u8`` in the runtime model). ``model.xml`` /
``model.bin`` written by :func:`save_ir` are what Intel's NPU plugin compiles too. OpenVINO is imported
on first use (as TensorRT is), so importing the runners costs nothing.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import ArtifactWriteError, BadInput
from ...graph.macs import layer_macs
from ...runners.base import BaseRunner, InputSpec

__all__ = ["OpenVinoRunner", "RuntimePrecisions", "runtime_precisions", "save_ir", "GEMM_LAYERS"]

#: runtime layer types whose multiply-accumulates count as GEMM/Conv work
GEMM_LAYERS = ("FullyConnected", "Convolution", "MatMul")
_INT8 = ("u8", "i8")


def _core():
    import openvino as ov

    return ov.Core()


class OpenVinoRunner(BaseRunner):
    """An OpenVINO compiled model on the CPU plugin, behind the runner interface.

    Args:
        model: an ONNX file or an IR ``.xml``.
        threads: ``INFERENCE_NUM_THREADS`` (0: OpenVINO's default).
        precision: ``INFERENCE_PRECISION_HINT`` for the float parts. ``f32`` by default: on CPUs with
            bf16 units OpenVINO would otherwise run them in bf16, which is not the file's arithmetic.
    """

    engine = "openvino-cpu"

    def __init__(self, model: str | Path, threads: int = 0, precision: str = "f32", name: str | None = None):
        super().__init__(name)
        self.model, self.threads, self.precision = Path(model), threads, precision
        self.compiled = None
        self._request = None

    def activate_impl(self) -> None:
        if not self.model.is_file():
            raise BadInput(f"{self.model}: no such model file")
        config: dict = {"INFERENCE_PRECISION_HINT": self.precision}
        if self.threads:
            config["INFERENCE_NUM_THREADS"] = self.threads
        core = _core()
        read = core.read_model(str(self.model))
        # the outputs' names as the file gives them: the CPU plugin may fuse an output with the op before
        # it, and get_any_name() of the compiled port then answers the op's name ("/bbox_predictor/.../Add_output_0"
        # for a YOLOS's pred_boxes), so the runner would lack the output the reference names
        self._output_names = [port.get_any_name() for port in read.outputs]
        self.compiled = core.compile_model(read, "CPU", config)
        self._request = self.compiled.create_infer_request()

    def deactivate_impl(self) -> None:
        self._request = self.compiled = None

    def input_specs_impl(self) -> list[InputSpec]:
        assert self.compiled is not None
        specs = []
        for port in self.compiled.inputs:
            shape = tuple(d.get_length() if d.is_static else -1 for d in port.get_partial_shape())
            specs.append(InputSpec(port.get_any_name(), shape, np.dtype(port.get_element_type().to_dtype())))
        return specs

    def infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert self._request is not None and self.compiled is not None
        res = self._request.infer(feed)
        outs = {name: np.array(res[port]) for name, port in zip(self._output_names, self.compiled.outputs)}
        return {"output": next(iter(outs.values()))} if len(outs) == 1 else outs

    def precisions(self) -> "RuntimePrecisions":
        assert self.compiled is not None, "activate() first"
        return runtime_precisions(self.compiled)


@dataclass
class RuntimePrecisions:
    """GEMM/Conv multiply-accumulates of the compiled model by layer type and runtime precision."""

    macs: dict[str, dict[str, int]] = field(default_factory=dict)  # layer type -> precision -> MACs
    layers: dict[str, int] = field(default_factory=dict)  # "type precision" -> count, every layer
    #: the source-model node names each GEMM/Conv layer running an integer kernel was built from
    int8_layers: list[tuple[str, ...]] = field(default_factory=list)
    #: each GEMM/Conv layer that runs no integer kernel: (its source nodes, layer type, precision, MACs)
    float_layers: list[tuple[tuple[str, ...], str, str, int]] = field(default_factory=list)

    @property
    def int8_share(self) -> float:
        total = sum(sum(p.values()) for p in self.macs.values())
        int8 = sum(v for p in self.macs.values() for k, v in p.items() if k in _INT8)
        return int8 / total if total else 0.0

    def int8_share_by_type(self) -> dict[str, float]:
        return {t: sum(v for k, v in p.items() if k in _INT8) / max(sum(p.values()), 1) for t, p in self.macs.items()}

    def to_dict(self) -> dict:
        return {"int8_share": round(self.int8_share, 4), "by_type": {k: round(v, 4) for k, v in self.int8_share_by_type().items()},
                "macs": self.macs, "layers": self.layers}


def _dims(port) -> tuple[int, ...] | None:
    shape = port.get_partial_shape()
    return tuple(d.get_length() for d in shape) if shape.is_static else None


def _layer_macs(op, layer: str) -> int:
    """The layer's MACs by :func:`~vitexport.graph.macs.layer_macs`, its layout translated to ONNX's."""
    out = _dims(op.output(0))
    ins = [_dims(op.input(i)) for i in range(op.get_input_size())]
    if out is None or len(ins) < 2 or ins[1] is None or ins[0] is None:
        return 0
    w = ins[1]
    if layer == "Convolution":
        if len(w) == len(out) + 1:  # a grouped or depthwise conv: weight [G, Cout/G, Cin/G, kh, kw]
            return layer_macs("Conv", out, (w[0] * w[1], *w[2:]), groups=w[0])
        return layer_macs("Conv", out, w)  # weight [Cout, Cin, kh, kw]
    if layer == "FullyConnected":
        return layer_macs("Gemm", out, w, trans_b=True)  # weight [Cout, Cin]
    return layer_macs("MatMul", out, (ins[0][-1], out[-1]))  # MatMul: K is the first input's last dim (no transpose on it)


def runtime_precisions(compiled) -> RuntimePrecisions:
    """Read the compiled model's runtime graph: each layer's ``layerType`` and ``runtimePrecision``.

    Attention MatMuls that OpenVINO fuses into a ``Subgraph`` (its snippets) are counted under
    ``layers`` only: their MACs are not visible from outside the subgraph.
    """
    res = RuntimePrecisions()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        layer, prec = str(info["layerType"].astype(str)), str(info["runtimePrecision"].astype(str))
        key = f"{layer} {prec}"
        res.layers[key] = res.layers.get(key, 0) + 1
        if layer in GEMM_LAYERS:
            # the activation's type decides: a Q/DQ'd weight alone gives ``runtimePrecision`` i8 too
            # (weight decompression), yet the multiply-accumulates then run in float
            act = op.input(0).get_element_type().get_type_name()
            prec = prec if act in _INT8 else act
            sources = tuple(str(info["originalLayersNames"].astype(str)).split(","))
            macs = _layer_macs(op, layer)
            if prec in _INT8:
                res.int8_layers.append(sources)
            else:
                res.float_layers.append((sources, layer, prec, macs))
            per = res.macs.setdefault(layer, {})
            per[prec] = per.get(prec, 0) + macs
    return res


def save_ir(model: str | Path, xml_path: str | Path) -> tuple[Path, Path]:
    """Write OpenVINO IR (``.xml`` + ``.bin``) of an ONNX file, atomically: both are written into a
    temporary folder beside the target and renamed into place, ``.bin`` first.

    Returns:
        (xml path, bin path).
    Raises:
        BadInput: OpenVINO cannot read the model. ArtifactWriteError: the files cannot be written.
    """
    import openvino as ov

    xml_path = Path(xml_path)
    bin_path = xml_path.with_suffix(".bin")
    try:
        ov_model = _core().read_model(str(model))
    except Exception as exc:  # OpenVINO raises RuntimeError subclasses naming the op it cannot read
        raise BadInput(f"{model}: OpenVINO cannot read it: {exc}") from None
    xml_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{xml_path.name}.", dir=xml_path.parent))
    try:
        ov.save_model(ov_model, str(tmp / xml_path.name), compress_to_fp16=False)  # the file's own precision
        os.replace(tmp / bin_path.name, bin_path)
        os.replace(tmp / xml_path.name, xml_path)
    except OSError as exc:
        raise ArtifactWriteError(f"cannot write {xml_path}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return xml_path, bin_path
