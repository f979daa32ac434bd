"""What the rk3588 target adds to a run: ``build_engine`` compiles ``model.rknn`` with rknn-toolkit2
(in its worker, :mod:`.client`), ``simulate`` gates RKNN's x86 simulator.

RKNN's simulator runs a model only inside the process that built it, so one worker call compiles the
model and runs the simulator on every parity input; the two stages split that call's results so the
pipeline loop gates (and times) each on its own: the simulator's steps of that call count as
``simulate``'s time (``StageOutput.later_work_s``), the rest as ``build_engine``'s:

- ``build_engine``: the ONNX file RKNN compiled (``model.rknn.onnx``: the route's layout of the Q/DQ or
  float file, :mod:`.routes`) is gated in ONNX Runtime (the layout keeps
  the model's function); ``model.rknn`` and what RKNN's op table says the NPU runs are recorded.
- ``simulate``: the simulator's outputs on the parity inputs, recorded by that call with a digest of
  each input (:class:`~vitexport.runners.RecordedRunner`), are gated against the golden reference.

A failed compile is a :class:`~vitexport.errors.BadInput` (exit 2) naming the node and the rule
(checked before RKNN runs, else read from RKNN's crash or refusal); a missing toolchain names
``make setup-rknn``.
"""
from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, ClassVar, Protocol

import numpy as np
import onnx_ir as ir
from pydantic import Field

from ...calibration.feeds import FeedSet
from ...errors import BadInput
from ...graph.files import artifact_files, load_model
from ...graph.macs import MAC_OPS
from ...graph.query import attr, static_shape
from ...graph.split import split_integer_prefix
from ...io import atomic_path
from ...parity.share import DATA_MOVEMENT, SHARE_KEY, FloatLayer, Int8Share
from ...quantize.precision import reads_int8
from ...recipe import Recipe, TargetStage
from ...runners import OnnxRuntimeRunner, RecordedRunner, record_outputs
from ...runners.base import feed_size
from ...runners.sessions import QDQ_AS_FLOAT
from ...stages.base import FP32_ONNX, INT8_ONNX, Contribution, RunContext, StageOutput, content_key, model_hash
from .client import RknnRequest, RknnResult, require_rknn, run_rknn
from .graph import rknn_hazards
from .log import OpRow
from .routes import Route, crash_forms, float_cpu_quantizes, rknn_input, route_quantization
from .._base import TargetOptions

__all__ = ["BUILD_ENGINE", "SIMULATE", "CompileRknnStage", "SimulateRknnStage", "Rk3588Options", "RknnTarget", "RKNN", "RKNN_MODEL", "RKNN_ONNX",
           "RKNN_OUTPUTS", "RKNN_LOG", "HOST_ONNX", "SIMULATOR_STEPS", "npu_report", "rknn_share"]


#: the stages rk3588 adds, and so declares: model.rknn compiled (gated on the layout it compiles) and run
#: on RKNN's x86 simulator
BUILD_ENGINE = TargetStage("build_engine")
SIMULATE = TargetStage("simulate")

class Rk3588Options(TargetOptions):
    """``target_options`` of the rk3588 target."""

    route: Route = Field(
        default="qdq", description="how vitexport's INT8 reaches RKNN: qdq (its Q/DQ file in RKNN's INT8 layout), "
                                   "rknn (RKNN's own quantizer on the float graph), hybrid (vitexport's ranges in "
                                   "RKNN's quantization config)")
    calibration_samples: int = Field(
        default=32, ge=1, description="calibration samples that measure the ranges of the Q/DQ the layout adds (and "
                                      "RKNN's own quantizer's dataset in the rknn / hybrid routes)")
    timeout_s: float = Field(default=3600.0, gt=0, description="rknn-toolkit2's worker is stopped after this long")


class RknnTarget(Protocol):
    """What the RKNN stages read of their target (``Rk3588Target``); a protocol rather than the class,
    so that this module, which ``rk3588`` imports, never imports ``rk3588``."""

    @property
    def platform(self) -> str: ...

    @property
    def toolkit(self) -> str: ...

    @property
    def rknn_config(self) -> dict[str, Any]: ...

    @property
    def options(self) -> Rk3588Options: ...

    @property
    def int8_share_hints(self) -> tuple[str, ...]: ...


RKNN_MODEL, RKNN_ONNX, RKNN_OUTPUTS, RKNN_LOG = "model.rknn", "model.rknn.onnx", "rknn_simulator.npz", "rknn.log"
#: the worker's steps that run the simulator (``reply["stages"]``), timed for the simulate stage
SIMULATOR_STEPS = ("init_runtime", "inference")
#: the integer-input prefix (embedding lookups, mask casts) the host runs before ``model.rknn``
HOST_ONNX = "host.onnx"


def _refuse_hazards(onnx_path: Path, route: str) -> None:
    """BadInput naming the node and the rule when RKNN would crash or hang on the file (checked before it runs)."""
    hazards = rknn_hazards(load_model(onnx_path))
    if hazards:
        raise BadInput(f"{RKNN_ONNX} (route {route}): rknn-toolkit2 cannot compile it: {hazards[0]}"
                       + (f" (and {len(hazards) - 1} more)" if len(hazards) > 1 else ""))


def _compile(req: RknnRequest, work: Path, out_dir: Path, timeout_s: float, on_step: Callable[[str], None]) -> RknnResult:
    """:func:`run_rknn`, RKNN's log copied beside the artifacts (and, when the compile fails, where it
    outlives the run's folder, which a failed run removes)."""
    log = work / RKNN_LOG
    try:
        return run_rknn(req, work, timeout_s=timeout_s, on_step=on_step)
    except BadInput as err:
        kept = Path(tempfile.gettempdir()) / f"vitexport-{out_dir.name}-{RKNN_LOG}"
        if log.is_file():
            shutil.copyfile(log, kept)
        raise BadInput(str(err).replace(str(log), str(kept))) from None
    finally:
        if log.is_file():
            shutil.copyfile(log, out_dir / RKNN_LOG)


def _calib_feeds(ctx: RunContext, n: int) -> list[dict[str, np.ndarray]]:
    """The first ``n`` calibration samples, one per feed at the export's batch."""
    batch = next(iter(ctx.reference.feeds[0].values())).shape[0]
    return list(FeedSet(ctx.calib.head(n * batch), batch=batch))


def cpu_conversions(res: RknnResult) -> set[str]:
    """The nodes whose conversion RKNN's op table placed on the CPU (``exDataConvert`` rows are named
    after the QuantizeLinear or DequantizeLinear they implement)."""
    return {r.source for r in res.ops if r.target != "NPU" and r.op_type == "exDataConvert"}


def npu_report(res: RknnResult, route: str, layout: dict) -> dict:
    """What the NPU runs, from RKNN's op table, with the compile's and the simulator's times."""
    s = res.summary
    float_macs = {k: v for k, v in s.by_dtype.items() if k != "INT8"}
    return {"route": route, "ops": s.ops, "on_npu": s.on_npu, "on_cpu": s.on_cpu,
            "int8_share": round(s.int8_share, 4), "gemm_macs": s.gemm_macs, "macs_by_dtype": s.by_dtype,
            "float16_gemms": s.float_gemms, "float_macs": float_macs, "compile_seconds": round(res.compile_s, 2),
            "simulator_ms_per_sample": round(1e3 * (res.seconds_per_sample or 0.0), 2), "layout": layout}


#: fewer layout samples than this are too few to trust (the demo's build_engine worst cosine: 0.9693 at 8
#: samples with int8 activations, 0.9856 at 16, 0.9964 at the default 32; docs/bench.md)
FEW_LAYOUT_SAMPLES = 16


def samples_note(samples: int, asked: int, route: str) -> str:
    """What the ranges the layout adds (``qdq``) or RKNN's own quantizer (``rknn`` / ``hybrid``) measured, and a
    warning when that is too few samples to trust."""
    what = "the Q/DQ pairs the layout adds took their ranges from" if route == "qdq" else "RKNN's quantizer measured"
    line = f"{what} {samples} calibration sample(s) (target_options.calibration_samples={asked})"
    if samples < FEW_LAYOUT_SAMPLES:
        line += (f"; fewer than {FEW_LAYOUT_SAMPLES} is too few to trust (the demo's worst cosine here: 0.9693 at 8, "
                 "0.9964 at the default 32): raise it, or give --calib more samples")
    return line


def _notes(report: dict) -> list[str]:
    cpu = report["on_cpu"]
    line = (f"RKNN's op table (route {report['route']}): {report['int8_share']:.1%} of GEMM/Conv multiply-accumulates "
            f"in INT8; {report['on_npu']} of {report['ops']} ops on the NPU"
            + (f", on the CPU: {', '.join(cpu[:4])}{' ...' if len(cpu) > 4 else ''}" if cpu else ", none on the CPU"))
    fp16 = report["float16_gemms"]
    if fp16:
        line += f"; GEMM/Conv in float16: {', '.join(fp16[:3])}{f' (+{len(fp16) - 3} more)' if len(fp16) > 3 else ''}"
    lines = [line, f"compiled in {report['compile_seconds']:.1f} s; the simulator ran "
                   f"{report['simulator_ms_per_sample']:.1f} ms per sample"]
    if report["layout"].get("rknn_crash_forms"):
        lines.append(f"RKNN 2.5.0 crashed on the file as laid out; compiled again with {report['layout']['rknn_crash_forms']} "
                     "node(s) in the forms it compiled where files like this one crashed it (rknn_crash_forms: a float16 "
                     "identity after a float attention's feature map, x + DWConv(x) adding the Q/DQ'd x)")
    host = report.get("host")
    if host:
        lines.append(f"{host['file']} runs the integer inputs' prefix on the host before model.rknn "
                     f"({', '.join(dict.fromkeys(host['ops']))}): model.rknn reads {', '.join(host['outputs'])}")
    return lines


def _float_why(row: OpRow, route: str, stripped: dict[str, str], quantized: set[str]) -> str:
    """Why RKNN runs a GEMM/Conv in float: a layout pass's rule, RKNN's own quantizer, the quantizer's file."""
    if row.source in stripped:
        return stripped[row.source]
    if route != "qdq":
        return f"RKNN's own quantizer (route {route}) kept it in {row.dtype.lower()}"
    if row.source in quantized:
        return (f"Q/DQ'd in {RKNN_ONNX}, yet RKNN chose {row.dtype.lower()} (it runs a GEMM/Conv in INT8 only with "
                "its output Q/DQ'd and a supported pattern)")
    return f"no Q/DQ on it in {RKNN_ONNX} (quantize_int8's INT8-share note says why the quantizer left it float)"


def _cpu_why(node: ir.Node | None) -> str:
    """Why RKNN placed a compute op on the CPU, where a known form says more than that it did."""
    if (node is not None and node.op_type == "Resize"
            and attr(node, "coordinate_transformation_mode", "half_pixel") in ("align_corners", b"align_corners")):
        return ("RKNN 2.5.0 runs an align-corners Resize on the CPU; export.align_corners_resize=asymmetric (the rk3588 "
                "recipe's) rewrites only a linear one by 2 on H and W: upsample by 2 steps, or with align_corners=False "
                "(half_pixel, which RKNN runs on the NPU), in the model")
    if node is not None and node.op_type == "Resize" and attr(node, "mode", "nearest") in ("linear", b"linear"):
        sizes = static_shape(node.inputs[0]), static_shape(node.outputs[0])
        if all(s is not None and len(s) == 4 for s in sizes) and any(
                o % i and i % o for i, o in zip(sizes[0][2:], sizes[1][2:])):
            return (f"RKNN 2.5.0 runs a linear Resize by a factor that is neither an integer nor its inverse on the CPU "
                    f"({'x'.join(map(str, sizes[0][2:]))} to {'x'.join(map(str, sizes[1][2:]))}); "
                    "export.fractional_resize=matmul (the rk3588 recipe's) writes one on a small map as a MatMul: "
                    "resize by integer factors in the model")
    return "RKNN placed it on the CPU"


def rknn_share(res: RknnResult, route: str, layout: dict, compiled: Path, hints: list[str]) -> Int8Share:
    """What RKNN's op table says about INT8: the share, every GEMM/Conv it runs in float with why, and
    the ops it placed on the CPU (compute apart from data movement, :data:`DATA_MOVEMENT`)."""
    stripped = dict(layout.get("skipped") or {})  # node → the layout pass's reason (ConvsInFloat's rule)
    nodes = {n.name: n for n in load_model(compiled).graph}
    quantized = {name for name, n in nodes.items() if n.op_type in MAC_OPS and reads_int8(n)}
    rows = [r for r in res.ops if r.op_type not in ("InputOperator", "OutputOperator")]
    floats = [FloatLayer(r.name, r.op_type, r.macs, f"{r.dtype.lower()} on the {r.target}",
                         _float_why(r, route, stripped, quantized)) for r in rows if r.is_gemm and r.dtype != "INT8"]
    cpu = [r for r in rows if r.target != "NPU"]
    compute = [FloatLayer(r.name, r.op_type, r.macs, f"{r.dtype.lower()} on the CPU", _cpu_why(nodes.get(r.source)))
               for r in cpu if r.op_type not in DATA_MOVEMENT]
    moves = [f"{r.op_type}:{r.name}" for r in cpu if r.op_type in DATA_MOVEMENT]
    return Int8Share(res.summary.int8_share, f"RKNN's op table (route {route})", res.summary.gemm_macs, floats,
                     compute, moves, hints)


def _crash_forms_once(crash: BadInput, route: str, laid_out: Path, layout: dict, say: Callable[[str], None]) -> bool:
    """After RKNN crashed on the laid-out file: True where the file was rewritten, once, in the forms RKNN compiled
    where files like it crashed (:class:`~.crash.CrashForms`), to be compiled again. A crash after them says so."""
    signal_name = re.search(r"crashed \((SIG\w+)\)", str(crash))
    if route != "qdq" or signal_name is None:
        return False
    if "rknn_crash_forms" in layout:
        if layout["rknn_crash_forms"]:
            crash.args = (f"{crash}; it crashed again after {layout['rknn_crash_forms']} node(s) were rewritten in the "
                          "forms RKNN compiled where files like this one crashed it (rknn_crash_forms)",)
        return False
    if not crash_forms(laid_out, layout):
        return False
    say(f"RKNN crashed ({signal_name.group(1)}): compiling again with {layout['rknn_crash_forms']} node(s) in the forms "
        "it compiled where files like this one crashed it")
    return True


class CompileRknnStage:
    """The route's ONNX file → ``model.rknn`` (rknn-toolkit2 in its worker), the simulator's outputs
    on the parity inputs recorded by the same call; gated on the file RKNN compiled. Where RKNN's op table
    puts a quantization on the CPU (route ``qdq``), that Q/DQ comes off and RKNN compiles once more
    (:class:`~.qdq.CpuQuantizesInFloat`): the layout learns from the compiler what no rule predicted. Where RKNN
    crashes on the file, it is rewritten once in the forms RKNN compiled where files like it crashed
    (:class:`~.crash.CrashForms`) and compiled again.

    Never resumed across toolchain changes: the key names the route, the platform and RKNN's config.
    """

    name: ClassVar[str] = BUILD_ENGINE.name
    needs_torch: ClassVar[bool] = False

    def enabled(self, recipe: Recipe) -> bool:
        return recipe.stages.quantize_int8.enabled and recipe.stages.build_engine.enabled

    def key(self, ctx: RunContext) -> str:
        t: RknnTarget = ctx.target  # type: ignore[assignment]
        return content_key(ctx.key, model_hash(ctx.files[INT8_ONNX]), model_hash(ctx.files[FP32_ONNX]), ctx.calib.fingerprint(),
                           t.platform, t.rknn_config, t.options.model_dump(mode="json"), t.toolkit)

    def run(self, ctx: RunContext) -> StageOutput:
        t: RknnTarget = ctx.target  # type: ignore[assignment]
        require_rknn()  # before any work: a missing toolchain names `make setup-rknn`
        route, calib = t.options.route, _calib_feeds(ctx, t.options.calibration_samples)
        with tempfile.TemporaryDirectory(prefix=".rknn-", dir=ctx.out_dir) as tmp:
            work = Path(tmp)
            layout = rknn_input(route, ctx.files[FP32_ONNX], ctx.files[INT8_ONNX], work / RKNN_ONNX, calib)
            while True:
                # token ids and masks: their integer prefix runs on the host (host.onnx), RKNN gets its outputs
                host = split_integer_prefix(work / RKNN_ONNX, work / "npu.onnx", work / HOST_ONNX)
                npu_onnx = work / "npu.onnx" if host else work / RKNN_ONNX
                _refuse_hazards(npu_onnx, route)
                to_npu = host.feed if host else dict
                req = RknnRequest(onnx=npu_onnx, platform=t.platform, config=t.rknn_config, rknn=work / RKNN_MODEL,
                                  quantization=route_quantization(route, [to_npu(f) for f in calib], ctx.out_dir / "calibration.json"),
                                  inputs=[to_npu(f) for f in ctx.reference.feeds])
                try:
                    res = _compile(req, work / "worker", ctx.out_dir, t.options.timeout_s, ctx.say)  # its step on the heartbeat
                except BadInput as crash:
                    if _crash_forms_once(crash, route, work / RKNN_ONNX, layout, ctx.say):
                        continue
                    raise
                # a quantization RKNN converts on the CPU: once, its Q/DQ off and compiled again
                on_cpu = cpu_conversions(res) if route == "qdq" and "rknn_cpu_quantizes_in_float" not in layout else set()
                off = float_cpu_quantizes(work / RKNN_ONNX, on_cpu, layout) if on_cpu else 0
                if not off:
                    break
                ctx.say(f"RKNN converted {off} quantization(s) on the CPU: their Q/DQ off, compiling again")
            files = self._keep(ctx, work, res, host is not None)
        report = npu_report(res, route, layout)
        share = rknn_share(res, route, layout, files[RKNN_ONNX], list(t.int8_share_hints))
        if host is not None:
            report["host"] = host.to_dict()
        # the simulator ran in this call for the simulate stage: its time is that stage's
        simulator_s = sum(res.stages.get(k, 0.0) for k in SIMULATOR_STEPS)
        notes = [*_notes(report), samples_note(sum(feed_size(f) for f in calib), t.options.calibration_samples, route)]
        return StageOutput(files=files, notes=notes, details={"runtime": report, SHARE_KEY: share.to_dict()},
                           later_work_s={SIMULATE.name: simulator_s})

    @staticmethod
    def _keep(ctx: RunContext, work: Path, res: RknnResult, host: bool) -> dict[str, Path]:
        """``model.rknn``, the laid-out model (and its host part), the simulator's outputs, RKNN's log,
        moved into the output folder."""
        files = {}
        for name in (RKNN_MODEL, RKNN_ONNX, *([HOST_ONNX] if host else [])):
            # a large model's weights sit in ``<name>.data`` beside it (the file names it): that first, then the
            # model, so a model file in the folder always finds its data
            for part in reversed(artifact_files(work / name)):
                with atomic_path(ctx.out_dir / part.name) as dst:
                    shutil.move(part, dst)
                files[part.name] = ctx.out_dir / part.name
        feeds = ctx.reference.feeds
        names = [o.name for o in load_model(files[RKNN_ONNX]).graph.outputs]
        # named as ONNX Runtime's runner names them: a single output is "output"
        names = ["output"] if len(names) == 1 else names
        per_feed = [np.split(o, len(feeds)) for o in res.outputs]  # samples stacked in feed order
        outs = [{names[j]: per_feed[j][i] for j in range(len(per_feed))} for i in range(len(feeds))]
        files[RKNN_OUTPUTS] = record_outputs(ctx.out_dir / RKNN_OUTPUTS, feeds, outs, "rknn-simulator")
        files[RKNN_LOG] = ctx.out_dir / RKNN_LOG
        return files

    def runner(self, ctx: RunContext, out: StageOutput) -> OnnxRuntimeRunner:
        # the file RKNN compiled, in float Q/DQ semantics: its layout must keep the model's function
        return OnnxRuntimeRunner(out.files[RKNN_ONNX], name=self.name, config=QDQ_AS_FLOAT)


class SimulateRknnStage:
    """RKNN's x86 simulator on the parity inputs (recorded by :class:`CompileRknnStage`'s worker call),
    gated against the golden reference."""

    name: ClassVar[str] = SIMULATE.name
    needs_torch: ClassVar[bool] = False

    def enabled(self, recipe: Recipe) -> bool:
        s = recipe.stages
        return s.quantize_int8.enabled and s.build_engine.enabled and s.simulate.enabled

    def key(self, ctx: RunContext) -> str:
        return content_key(ctx.key, "simulate")

    def run(self, ctx: RunContext) -> StageOutput:
        if RKNN_OUTPUTS not in ctx.files:
            raise BadInput(f"no {RKNN_OUTPUTS}: the simulate stage needs build_engine (stages.build_engine.enabled)")
        # the files this gate judges: a failed simulator sets model.rknn aside with the outputs it gave
        judged = {n: ctx.files[n] for n in (RKNN_MODEL, RKNN_OUTPUTS) if n in ctx.files}
        return StageOutput(files=judged, notes=["RKNN's x86 simulator (rknn-toolkit2, the model as built for the NPU), "
                                                "outputs computed in the build's worker call on these parity inputs"])

    def runner(self, ctx: RunContext, out: StageOutput) -> RecordedRunner:
        return RecordedRunner(ctx.files[RKNN_OUTPUTS], name=self.name)


#: what the rk3588 target adds to a run (``Rk3588Target.contribution()``)
RKNN = Contribution(stages=(CompileRknnStage(), SimulateRknnStage()))
