"""What the ethos-u targets add to a run: ``build_engine`` quantizes the torch program vitexport's passes
left with ExecuTorch's Arm backend and compiles it with Vela (``model.pte``), ``simulate`` gates the INT8
program run on the TOSA reference model.

One worker call (:mod:`.client`) does both, in ``.venv-ethos``; the two stages split its results so the
pipeline loop gates each on its own:

- ``build_engine``: the quantized program in torch (Q/DQ as float ops: what ExecuTorch's quantizer wrote
  from vitexport's calibration samples) is gated; ``model.pte`` (Vela's command stream inside), each
  partition's TOSA and Vela's summary are kept; the NPU share of the work (multiply-accumulates Vela
  compiled vs those of ops left on the CPU) is gated like every target's INT8 share, and a program that
  does not fit the memory the target names (SRAM, flash) fails (exit 1) naming what it needs.
- ``simulate``: the INT8 program on the parity inputs, every NPU partition computed by the TOSA reference
  model (tosa-tools; the arithmetic Vela compiles, bit for bit) and the CPU ops by ExecuTorch's, recorded
  by that call, gated against the golden reference.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import ClassVar, Literal, Protocol

import numpy as np
from pydantic import Field

from ...calibration.feeds import FeedSet
from ...errors import BadInput, ParityFailure
from ...io import atomic_path
from ...parity.share import SHARE_KEY, FloatLayer, Int8Share
from ...recipe import Recipe, TargetStage
from ...runners import RecordedRunner, record_outputs
from ...stages.base import FP32_ONNX, Contribution, RunContext, StageOutput, content_key, module_hash
from .._base import TargetOptions
from .client import EthosRequest, EthosResult, require_ethos, run_ethos
from .tflite_lower import calibrated_mask_fill, lower_onnx

__all__ = ["BUILD_ENGINE", "SIMULATE", "CompileEthosUStage", "ReferenceEthosUStage", "EthosUOptions", "ETHOS_U", "PTE", "TOSA", "QUANTIZED_OUTPUTS",
           "REFERENCE_OUTPUTS", "LITERT_OUTPUTS", "TFLITE", "VELA_INPUT", "ETHOS_LOG", "npu_report", "npu_share"]

PTE, TOSA, ETHOS_LOG = "model.pte", "model.tosa", "ethos.log"
#: the tflite route's artifact (Vela's optimized file: what TFLite Micro runs) and the integer file Vela read
TFLITE, VELA_INPUT = "model.tflite", "model.int.tflite"
QUANTIZED_OUTPUTS, REFERENCE_OUTPUTS = "ethos_quantized.npz", "tosa_reference.npz"
#: the tflite route's simulate outputs: Vela's input on the LiteRT interpreter
LITERT_OUTPUTS = "litert_reference.npz"
#: the worker's steps that run the reference model, timed for the simulate stage
REFERENCE_STEPS = ("reference",)
BUILD_ENGINE = TargetStage("build_engine")
SIMULATE = TargetStage("simulate")


class EthosUOptions(TargetOptions):
    """``target_options`` of the ethos-u targets."""

    system_config: str | None = Field(
        default=None, description="Vela's --system-config (None: the accelerator's default, ExecuTorch's)")
    memory_mode: str | None = Field(default=None, description="Vela's --memory-mode (None: ExecuTorch's default)")
    sram_kib: float = Field(default=2048.0, gt=0, description="the SRAM the program may use (KiB): more is exit 1")
    flash_kib: float = Field(default=8192.0, gt=0, description="the flash its weights may use (KiB): more is exit 1")
    calibration_samples: int = Field(default=32, ge=1, description="calibration samples ExecuTorch's quantizer measures")
    per_channel: bool = Field(default=True, description="per-channel int8 weights (ExecuTorch's symmetric config)")
    activations: Literal["int8", "int16"] = Field(
        default="int16", description="activation precision: int16 with int8 weights (Ethos-U's 16x8 kernels), or int8. "
                                     "On the demo ViT int16 scores reference-model worst cosine 0.998, int8 0.33 "
                                     "(ExecuTorch's own int8 quantization of the ViT, before any lowering)")
    timeout_s: float = Field(default=3600.0, gt=0, description="the Ethos-U worker is stopped after this long")
    route: Literal["auto", "executorch", "tflite"] = Field(
        default="auto",
        description="tflite: vitexport's FP32 ONNX lowered to TFLite, LiteRT's 16x8 quantizer, Vela, model.tflite "
                    "(TFLite Micro), parity on the LiteRT interpreter; executorch: ExecuTorch's Arm backend quantizes "
                    "the torch program, TOSA → Vela, model.pte, parity on the TOSA reference model; auto: the "
                    "target's measured best (ethos-u85 tflite, ethos-u55 executorch), executorch where the tflite "
                    "lowering has no rule for an op of the model")


class EthosTarget(Protocol):
    """What the Ethos-U stages read of their target; a protocol rather than the class, so that this
    module, which the target module imports, never imports it."""

    @property
    def accelerator(self) -> str: ...

    @property
    def toolkit(self) -> str: ...

    @property
    def options(self) -> EthosUOptions: ...

    @property
    def int8_share_hints(self) -> tuple[str, ...]: ...

    @property
    def auto_route(self) -> str: ...

    @property
    def vela_system(self) -> tuple[str, str]: ...


def _kib(row: dict, key: str) -> float:
    return float(row.get(key) or 0.0)


def npu_report(res: EthosResult, accelerator: str) -> dict:
    """What Vela says of each NPU partition, summed: cycles, estimated latency, SRAM and flash, and the
    ops left on the CPU."""
    parts = res.partitions
    first = parts[0] if parts else {}
    cpu = [c for c in res.cpu_ops if not c["moves"]]
    return {
        "accelerator": accelerator, "system_config": res.reply.get("system_config"),
        "memory_mode": res.reply.get("memory_mode"),
        # the tflite route's one Vela summary covers every NPU part (the ethos-u custom ops Vela wrote)
        "partitions": res.reply.get("delegates", 0) if res.reply.get("route") == "tflite" else len(parts),
        "npu_macs": sum(int(float(p.get("nn_macs") or 0)) for p in parts),
        "cpu_macs": sum(int(c["macs"]) for c in res.cpu_ops),
        "npu_cycles": sum(int(float(p.get("cycles_total") or 0)) for p in parts),
        "clock_hz": float(first.get("core_clock") or 0.0),
        "latency_ms": round(1e3 * sum(float(p.get("inference_time") or 0.0) for p in parts), 4),
        "sram_kib": round(max((_kib(p, "sram_memory_used") for p in parts), default=0.0), 2),
        "dram_kib": round(max((_kib(p, "dram_memory_used") for p in parts), default=0.0), 2),
        "flash_kib": round(sum(_kib(p, "on_chip_flash_memory_used") + _kib(p, "off_chip_flash_memory_used")
                               for p in parts), 2),
        "npu_ops": sum(int(float(p.get("passes_before_fusing") or 0)) for p in parts),
        "cpu_compute_ops": [f"{c['op']}:{c['node']}" for c in cpu],
        "cpu_moves": [f"{c['op']}:{c['node']}" for c in res.cpu_ops if c["moves"]],
        "mask_fill": res.reply.get("mask_fill", []), "activations": res.reply.get("activations", "int16"),
        "int8_ops": res.reply.get("int8_ops", []), "route": res.reply.get("route", "executorch"),
        "compile_seconds": round(sum(res.stages.get(k, 0.0) for k in ("write", "quantize", "lower", "vela")), 2),
        "reference_ms_per_sample": round(1e3 * (res.reply.get("seconds_per_sample") or 0.0), 2),
    }


def npu_share(res: EthosResult, report: dict, hints: list[str]) -> Int8Share:
    """The share of multiply-accumulates on the NPU (all of which Ethos-U runs in INT8), the compute ops
    left on the CPU, and the data movement there."""
    total = report["npu_macs"] + report["cpu_macs"]
    floats = [FloatLayer(c["node"], c["op"], int(c["macs"]), "on the CPU", "outside every NPU partition")
              for c in res.cpu_ops if c["macs"]]
    who = "Vela" if report.get("route") == "tflite" else "ExecuTorch's Ethos-U partitioner"
    compute = [FloatLayer(c["node"], c["op"], int(c["macs"]), "on the CPU", f"{who} left it out of the NPU partitions")
               for c in res.cpu_ops if not c["moves"]]
    moves = [f"{c['op']}:{c['node']}" for c in res.cpu_ops if c["moves"]]
    share = report["npu_macs"] / total if total else 1.0
    return Int8Share(share, f"Vela's partitions on {report['accelerator']}", total, floats, compute, moves, hints)


def _notes(r: dict) -> list[str]:
    lines = [f"{r['accelerator']} ({r['system_config']}, {r['memory_mode']}): Vela estimates {r['npu_cycles']:,} NPU "
             f"cycles = {r['latency_ms']:.3f} ms per inference at {r['clock_hz'] / 1e6:.0f} MHz; SRAM "
             f"{r['sram_kib']:.1f} KiB, flash {r['flash_kib']:.1f} KiB; {r['partitions']} NPU partition(s), "
             f"{r['npu_ops']} NPU ops, compute ops on the CPU: {', '.join(r['cpu_compute_ops']) or 'none'}",
             _quantized_by(r)]
    if r["mask_fill"]:
        lines.append(f"attention masks' minus infinity calibrated to the logits' range before quantization "
                     f"({', '.join(str(m['node']) + ': ' + str(m['fill']) for m in r['mask_fill'])}): a -1e9 in the softmax "
                     "input's int8 range would leave no step for the real logits")
    return lines


def _quantized_by(r: dict) -> str:
    """Who quantized the program, how, and what ran it for parity: one line per route."""
    int8 = (f"; int8 inputs for {'/'.join(r['int8_ops'])}, which this NPU multiplies in int8 only"
            if r["int8_ops"] else "")
    if r["route"] == "tflite":
        return (f"route tflite: vitexport's FP32 ONNX lowered to TFLite, quantized by LiteRT's post-training quantizer "
                f"({r['activations']} activations, int8 per-channel weights{int8}) on vitexport's calibration samples, "
                f"compiled by Vela in {r['compile_seconds']:.1f} s (model.tflite: what TFLite Micro runs); the LiteRT "
                f"interpreter ran Vela's input {r['reference_ms_per_sample']:.1f} ms per sample")
    return (f"route executorch: quantized by ExecuTorch's EthosUQuantizer ({r['activations']} activations, int8 "
            f"weights{int8}) on vitexport's calibration samples and compiled in {r['compile_seconds']:.1f} s; the TOSA "
            f"reference model ran {r['reference_ms_per_sample']:.1f} ms per sample")


def _check_fits(r: dict, o: EthosUOptions) -> None:
    """Exit 1 (a failed gate) when the program needs more SRAM or flash than the target has."""
    for what, used, limit, key in (("SRAM", r["sram_kib"], o.sram_kib, "sram_kib"),
                                   ("flash", r["flash_kib"], o.flash_kib, "flash_kib")):
        if used > limit:
            raise ParityFailure(BUILD_ENGINE.name, f"{what.lower()}_kib", used, limit, "<=",
                                f"Vela places {used:.1f} KiB in {what}, the memory configuration has {limit:.0f} KiB "
                                f"(target_options.{key}; a smaller model, or target_options.memory_mode)")


class CompileEthosUStage:
    """The torch program vitexport's passes left → ``model.pte`` (ExecuTorch's Arm backend, Vela), the
    reference model's outputs on the parity inputs recorded by the same call; gated on the quantized
    program in torch."""

    name: ClassVar[str] = BUILD_ENGINE.name
    #: ExecuTorch's quantizer reads the torch program, not the ONNX file
    needs_torch: ClassVar[bool] = True

    def enabled(self, recipe: Recipe) -> bool:
        return recipe.stages.quantize_int8.enabled and recipe.stages.build_engine.enabled

    def key(self, ctx: RunContext) -> str:
        t: EthosTarget = ctx.target  # type: ignore[assignment]
        return content_key(ctx.key, module_hash(ctx.module, ctx.model.example_inputs), ctx.calib.fingerprint(),
                           t.accelerator, t.options.model_dump(mode="json"), t.toolkit)

    def run(self, ctx: RunContext) -> StageOutput:
        t: EthosTarget = ctx.target  # type: ignore[assignment]
        require_ethos()  # before any work: a missing toolchain names `make setup-ethos`
        o = t.options
        batch = next(iter(ctx.reference.feeds[0].values())).shape[0]
        calib = list(FeedSet(ctx.calib.head(o.calibration_samples * batch), batch=batch))
        with tempfile.TemporaryDirectory(prefix=".ethos-", dir=ctx.out_dir) as tmp:
            work = Path(tmp)
            req, why = self._request(ctx, work, calib)
            log = work / "worker" / ETHOS_LOG
            try:
                res = run_ethos(req, work / "worker", timeout_s=o.timeout_s, on_step=ctx.say)
            except BadInput as err:  # the log outlives the run's folder, which a failed run removes
                kept = Path(tempfile.gettempdir()) / f"vitexport-{ctx.out_dir.name}-{ETHOS_LOG}"
                if log.is_file():
                    shutil.copyfile(log, kept)
                raise BadInput(str(err).replace(str(log), str(kept))) from None
            shutil.copyfile(log, ctx.out_dir / ETHOS_LOG)
            files = self._keep(ctx, work, res, req.route)
        report = npu_report(res, t.accelerator)
        report["route_choice"] = why
        _check_fits(report, o)
        share = npu_share(res, report, list(t.int8_share_hints))
        return StageOutput(files=files, notes=[*_notes(report), why], details={"runtime": report, SHARE_KEY: share.to_dict()},
                           later_work_s={SIMULATE.name: sum(res.stages.get(k, 0.0) for k in REFERENCE_STEPS)})

    @staticmethod
    def _request(ctx: RunContext, work: Path, calib: list[dict[str, np.ndarray]]) -> tuple[EthosRequest, str]:
        """The worker's request, the torch program (executorch route) or the lowered ONNX (tflite route), and
        a line saying which route and why."""
        t: EthosTarget = ctx.target  # type: ignore[assignment]
        o = t.options
        route = t.auto_route if o.route == "auto" else o.route
        why = f"route {route}: " + ("target_options.route" if o.route != "auto" else
                                    f"the measured best on {t.accelerator} (target_options.route=auto)")
        common = dict(accelerator=t.accelerator, system_config=o.system_config, memory_mode=o.memory_mode,
                      per_channel=o.per_channel, activations=o.activations, calibration=calib,
                      inputs=ctx.reference.feeds)
        if route == "tflite":
            fp32 = ctx.files[FP32_ONNX]
            try:
                program = lower_onnx(fp32, calibrated_mask_fill(fp32, calib[:8]))
            except BadInput as err:
                if o.route != "auto":
                    raise
                why = f"route executorch: {err} (target_options.route=auto falls back)"
            else:
                js, npz = program.save(work / "program")
                # the system named here: the worker then calls Vela without importing ExecuTorch (~10-25 s)
                common.update(system_config=o.system_config or t.vela_system[0],
                              memory_mode=o.memory_mode or t.vela_system[1])
                return EthosRequest(program=js, program_npz=npz, route="tflite", pte=work / TFLITE,
                                    vela_input=work / VELA_INPUT, mask_fill=program.mask_fill, **common), why
        import torch

        program_file = work / "model.pt2"
        torch.export.save(torch.export.export(ctx.module, (), kwargs=dict(ctx.model.example_inputs)), program_file)
        return EthosRequest(program=program_file, pte=work / PTE, **common), why

    @staticmethod
    def _keep(ctx: RunContext, work: Path, res: EthosResult, route: str) -> dict[str, Path]:
        """The artifact (``model.pte``, or ``model.tflite`` and the integer file Vela read), the first
        partition's TOSA, both recorded outputs and the log, in the output folder."""
        files = {}
        tosa = [Path(p["tosa"]) for p in res.partitions]
        kept = (((TFLITE, work / TFLITE), (VELA_INPUT, work / VELA_INPUT)) if route == "tflite" else
                ((PTE, work / PTE), *(((TOSA, tosa[0]),) if tosa else ())))
        for name, src in kept:
            with atomic_path(ctx.out_dir / name) as dst:
                shutil.move(src, dst)
            files[name] = ctx.out_dir / name
        feeds = ctx.reference.feeds
        names = list(ctx.reference.outputs)
        reference = LITERT_OUTPUTS if route == "tflite" else REFERENCE_OUTPUTS
        for name, outs in ((QUANTIZED_OUTPUTS, res.quantized), (reference, res.outputs)):
            per_feed = [np.split(o.reshape(-1, *ctx.reference.outputs[n].shape[1:]), len(feeds))
                        for n, o in zip(names, outs)]
            rows = [{n: per_feed[j][i] for j, n in enumerate(names)} for i in range(len(feeds))]
            files[name] = record_outputs(ctx.out_dir / name, feeds, rows, name.removesuffix(".npz"))
        files[ETHOS_LOG] = ctx.out_dir / ETHOS_LOG
        return files

    def runner(self, ctx: RunContext, out: StageOutput) -> RecordedRunner:
        return RecordedRunner(out.files[QUANTIZED_OUTPUTS], name=self.name)


class ReferenceEthosUStage:
    """The INT8 program on the TOSA reference model (recorded by :class:`CompileEthosUStage`'s worker call),
    gated against the golden reference."""

    name: ClassVar[str] = SIMULATE.name
    needs_torch: ClassVar[bool] = False

    def enabled(self, recipe: Recipe) -> bool:
        s = recipe.stages
        return s.quantize_int8.enabled and s.build_engine.enabled and s.simulate.enabled

    def key(self, ctx: RunContext) -> str:
        return content_key(ctx.key, "tosa-reference")

    def run(self, ctx: RunContext) -> StageOutput:
        if REFERENCE_OUTPUTS not in ctx.files and LITERT_OUTPUTS not in ctx.files:
            raise BadInput(f"no {REFERENCE_OUTPUTS}: the simulate stage needs build_engine (stages.build_engine.enabled)")
        judged = {n: ctx.files[n] for n in (PTE, TFLITE, VELA_INPUT, REFERENCE_OUTPUTS, LITERT_OUTPUTS) if n in ctx.files}
        if TFLITE in ctx.files:
            note = ("the integer program Vela compiled (model.int.tflite) on the LiteRT interpreter's reference "
                    "kernels, outputs computed in the build's worker call on these parity inputs")
        else:
            note = ("the INT8 program on the TOSA reference model (tosa-tools: every NPU partition as Vela compiles it, "
                    "CPU ops by ExecuTorch's), outputs computed in the build's worker call on these parity inputs")
        return StageOutput(files=judged, notes=[note])

    def runner(self, ctx: RunContext, out: StageOutput) -> RecordedRunner:
        return RecordedRunner(ctx.files.get(LITERT_OUTPUTS) or ctx.files[REFERENCE_OUTPUTS], name=self.name)


#: what the ethos-u targets add to a run
ETHOS_U = Contribution(stages=(CompileEthosUStage(), ReferenceEthosUStage()))
