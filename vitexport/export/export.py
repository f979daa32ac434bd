"""``export_onnx``: one static-shape ONNX graph at the recipe's opset, written atomically.

TorchScript is tried first: on ViT-Tiny it exports in 0.9 s where the dynamo exporter takes 9 s and
only writes opset 18 and up. When the chosen exporter fails on a model the other one is tried, and
the report says which produced the file and why the first did not. Export-time rewrites (LayerNorm
decomposition, explicit attention, einsum as MatMul, tanh GELU) come from :mod:`.rewrites`.
"""
from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from ..runners.torch_runner import tensor_outputs
from ..errors import BadInput
from ..graph.files import artifact_files
from ..io import atomic_path
from ..quiet import captured_output
from ..recipe import ContractSpec, Exporter, ExportSpec
from ..results import Data, result
from .interface import finish_export
from .lowering import LOWERABLE
from .opset import convert_opset, default_opset
from .rewrites import ExportRewrites

__all__ = ["ExportAttempt", "ExportReport", "export_onnx", "OUTPUT_NAME"]

OUTPUT_NAME = "output"
# The dynamo exporter has no implementations below opset 18; lower opsets are converted after.
_DYNAMO_MIN_OPSET = 18

_REWRITE_NOTES = {
    "layernorm_decomposed": "LayerNorm decomposed into ReduceMean/Sub/Mul/Sqrt/Div{safe}: {n} call(s)",
    "attention_explicit": "attention written as MatMul/Softmax/MatMul: {n} call(s)",
    "einsum_as_matmul": "einsum written as Transpose/Reshape/MatMul: {n} call(s)",
    "einsum_kept": "einsum left as an Einsum op (not a batched matrix product): {n} call(s)",
    "gelu_tanh": "GELU written as its tanh approximation with Mul (no Pow): {n} call(s)",
    "fold_as_conv_transpose": "F.fold written as a grouped ConvTranspose (no Col2Im): {n} call(s)",
    "adaptive_pool_as_matmul": "adaptive average pooling to a size that does not divide the input's written as a "
                               "MatMul with its constant window matrix (no index gathers): {n} call(s)",
}


@result
class ExportAttempt(Data):
    """One exporter run: which, whether it produced the file, and the first line of its error."""

    exporter: str
    ok: bool
    seconds: float
    error: str | None = None
    opset: int | None = None


@result
class ExportReport(Data):
    """What :func:`export_onnx` did. ``exporter`` is the one that wrote the file."""

    path: str
    exporter: str
    opset: int
    input_shapes: dict[str, list[int]]
    rewrites: dict[str, int]
    attempts: list[ExportAttempt]
    notes: list[str]
    seconds: float
    size_bytes: int



class _Positional(nn.Module):
    """``forward(*inputs)`` → the model's tensor outputs: one tensor, or a tuple in ``names`` order.

    The TorchScript exporter binds the default values of the top-level ``forward``'s parameters as
    traced inputs: timm's Eva ``forward(x, attn_mask=None, is_causal=False)`` then receives
    ``is_causal`` as a tensor and ``scaled_dot_product_attention`` rejects it. A forward taking
    only ``*inputs`` has no defaults to bind; the wrapped model sees its own Python defaults.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor):
        out = self.model(*inputs)
        if getattr(self.model, "output_names", None) is not None:
            return out  # an OutputAdapter's: already its tensor outputs, in output_names order
        values = tuple(tensor_outputs(out)[0].values())
        return values[0] if len(values) == 1 else values

    def names(self, args: tuple) -> list[str]:
        """The graph's output names: the adapter's ``output_names`` (after one forward when it has
        not run yet), else the model's own (:func:`tensor_outputs`; one tensor is ``output``)."""
        with _eval_mode(self.model), torch.no_grad():
            out = self.model(*args) if getattr(self.model, "output_names", None) is None else None
        known = getattr(self.model, "output_names", None)
        if known is not None:
            return list(known)
        named = tensor_outputs(out)[0]
        return [OUTPUT_NAME] if len(named) == 1 else list(named)


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Export in eval mode (no dropout in the graph), then restore every module's own flag."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def _torchscript(module: nn.Module, args: tuple, names: list[str], outputs: list[str], opset: int, path: Path) -> str | None:
    with warnings.catch_warnings():
        # Shapes are static by design, so the tracer's "might not generalize" warnings hold no news;
        # the legacy-exporter notice is a deliberate choice (see the module docstring).
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*TorchScript-based ONNX export.*")
        torch.onnx.export(
            module, args, str(path), dynamo=False, opset_version=opset, input_names=names,
            output_names=outputs, do_constant_folding=True,
        )
    return None


def _dynamo(module: nn.Module, args: tuple, names: list[str], outputs: list[str], opset: int, path: Path) -> str | None:
    program = torch.onnx.export(
        module, args, dynamo=True, opset_version=max(opset, _DYNAMO_MIN_OPSET), input_names=names,
        output_names=outputs, optimize=True, verbose=False, report=False, verify=False,
    )
    model = program.model_proto
    produced = default_opset(model)
    model = convert_opset(model, opset)
    got_inputs = [i.name for i in model.graph.input]
    got_outputs = [o.name for o in model.graph.output]
    if got_inputs != names or got_outputs != outputs:
        raise RuntimeError(f"dynamo named the graph's inputs {got_inputs} and outputs {got_outputs}")
    path.write_bytes(model.SerializeToString())
    return f"dynamo wrote opset {produced}, converted to {opset}" if produced != opset else None


_EXPORTERS = {"torchscript": _torchscript, "dynamo": _dynamo}


@dataclass
class _Run:
    """The exporters tried in order at one opset, then (when none can) at a higher one the
    contract allows: Hugging Face's Dinov2WithRegisters interpolates its position embeddings with
    antialiased bicubic resizing, which only opset 18's Resize expresses."""

    wrapper: _Positional
    args: tuple
    names: list[str]
    outputs: list[str]
    spec: ExportSpec
    contract: ContractSpec | None
    tmp: Path
    attempts: list[ExportAttempt]

    def at(self, opset: int) -> tuple[int | None, dict[str, int], list[str]]:
        """(the opset written, or None when every exporter failed; rewrite counts; notes)."""
        extra: list[str] = []
        for exporter in _order(self.spec):
            rewrites = ExportRewrites(self.spec, self.contract)
            t1 = time.perf_counter()
            try:
                # torch prints its whole IR graph when a TorchScript export fails: into the log
                with captured_output(f"torch.onnx.export ({exporter})") as printed:
                    with _eval_mode(self.wrapper), torch.no_grad(), rewrites:
                        note = _EXPORTERS[exporter](self.wrapper, self.args, self.names, self.outputs, opset, self.tmp)
            except OSError:
                raise  # the disk, not the model: another exporter would fail the same way
            except Exception as exc:  # any exporter failure is a reason to try the other one
                self.attempts.append(ExportAttempt(exporter, False, time.perf_counter() - t1, _first_line(exc), opset))
                extra += [printed.note()] if printed.lines else []
                continue
            self.attempts.append(ExportAttempt(exporter, True, time.perf_counter() - t1, None, opset))
            return opset, dict(rewrites.counts), extra + ([printed.note()] if printed.lines else []) + ([note] if note else [])
        return None, {}, extra

    def higher(self) -> tuple[int, dict[str, int], list[str]]:
        """Export at the next opset the exporters know more at (dynamo starts at 18), when the
        recipe's contract allows it; else say in the error which opset would do.

        Raises:
            BadInput: no exporter exports the model at either opset, or only at one the contract forbids.
        """
        base = self.spec.opset
        tried = "; ".join(f"{a.exporter}: {a.error}" for a in self.attempts)
        higher = max(base + 1, _DYNAMO_MIN_OPSET)
        limit = self.contract.max_opset if self.contract is not None else None
        opset, counts, extra = self.at(higher)
        if opset is None:
            raise BadInput(f"cannot export the model to ONNX opset {base} ({tried}), nor at opset {higher}")
        if limit is not None and higher > limit:
            raise BadInput(f"cannot export the model to ONNX opset {base} ({tried}); opset {higher} can: "
                           f"--set export.opset={higher} --set contract.max_opset={higher} if the target's compiler "
                           f"takes opset {higher} (the recipe's contract.max_opset is {limit})")
        allows = f", which contract.max_opset {limit} allows" if limit is not None else ""
        return opset, counts, [f"opset {base} cannot export this model ({tried}); exported at opset {higher}{allows} "
                               f"(--set export.opset={higher} says so up front)", *extra]


def _order(spec: ExportSpec) -> list[str]:
    if spec.exporter == Exporter.torchscript:
        return ["torchscript"]
    if spec.exporter == Exporter.dynamo:
        return ["dynamo"]
    return ["torchscript", "dynamo"]


def _rewrite_notes(spec: ExportSpec, counts: dict[str, int]) -> list[str]:
    notes = [f"{op} written as {how} (not in contract.allowed_ops): {counts[f'lowered_{op}']} call(s)"
             for op, how in LOWERABLE.items() if counts.get(f"lowered_{op}")]
    for key, template in _REWRITE_NOTES.items():
        if counts.get(key):
            safe = " (float16-safe: scaled by max |x - mean| first)" if spec.fp16_safe_layernorm else ""
            notes.append(template.format(n=counts[key], safe=safe))
    if spec.decompose_layernorm and not counts.get("layernorm_decomposed"):
        notes.append("decompose_layernorm: the model made no F.layer_norm call; nothing decomposed")
    return notes


def export_onnx(
    model: nn.Module,
    example_inputs: dict[str, torch.Tensor],
    out_path: str | Path,
    spec: ExportSpec,
    *,
    contract: ContractSpec | None = None,
) -> ExportReport:
    """Export ``model`` to one ONNX file with static shapes at ``spec.opset``.

    Args:
        model: usually a :class:`vitexport.sources.OutputAdapter`; it is called with the inputs as
            positional arguments in ``example_inputs`` order and returns a tensor, a tuple of tensors
            (named by its ``output_names``), or a dict / Hugging Face output whose tensors become
            the graph's outputs by name (:func:`tensor_outputs`; one tensor is ``output``). It is
            not modified.
        example_inputs: input name → tensor; the names become the graph's input names and the
            shapes its static shapes (batch and image size come from here, i.e. from the recipe's
            ``batch_size`` or ``--input-shape``).
        out_path: where the file goes; written atomically (nothing is left on failure).
        spec: the recipe's ``export`` section.
        contract: the recipe's ``contract``: index ops its ``allowed_ops`` lacks (CumSum,
            GatherElements, And, Or) are written with ops it has (:mod:`.lowering`).
    Returns:
        An :class:`ExportReport`; ``report.exporter`` is ``'torchscript'`` or ``'dynamo'``.
    Returns/notes: when no exporter can write ``spec.opset`` but one can write opset 18 (or
        ``spec.opset + 1``) and ``contract.max_opset`` allows it, that opset is written and a note
        says why (``report.opset`` is the opset written).
    Raises:
        BadInput: no exporter could export the model; the message has each exporter's error,
            which names the operator it could not convert, and the opset that would export it
            when the contract forbids that one.
    """
    if not example_inputs or not all(isinstance(t, torch.Tensor) for t in example_inputs.values()):
        raise BadInput("export_onnx: example_inputs must be a non-empty dict of name -> tensor")
    t0 = time.perf_counter()
    names = list(example_inputs)
    attempts: list[ExportAttempt] = []
    # Exporters write straight into the temporary file (no in-memory copy of the weights); it is
    # renamed onto out_path only when one succeeded and removed otherwise.
    with atomic_path(out_path) as tmp:
        wrapper, args = _Positional(model), tuple(example_inputs.values())
        run = _Run(wrapper, args, names, wrapper.names(args), spec, contract, tmp, attempts)
        opset, counts, extra = run.at(spec.opset)
        if opset is None:
            opset, counts, extra = run.higher()
    # the exporter's file, rewritten through the one writer: the model's inputs, clean (graph.clean)
    extra += finish_export(Path(out_path), example_inputs)
    size = sum(p.stat().st_size for p in artifact_files(out_path))
    used = attempts[-1].exporter
    notes = ["static shapes " + ", ".join(f"{k}={list(v.shape)}" for k, v in example_inputs.items())]
    notes += [f"{a.exporter} failed ({a.error}); fell back to {used}" for a in attempts if not a.ok and a.opset == opset]
    notes += extra + _rewrite_notes(spec, counts)
    return ExportReport(
        path=str(out_path), exporter=used, opset=opset,
        input_shapes={k: list(v.shape) for k, v in example_inputs.items()}, rewrites=counts,
        attempts=attempts, notes=notes, seconds=time.perf_counter() - t0, size_bytes=size,
    )
