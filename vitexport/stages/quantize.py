"""INT8 as a stage: ``quantize_int8`` → ``model.int8.onnx`` (+ the calibration table and cache, and
the files the target contributes), gated in the arithmetic the target's runtime performs."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..parity import localize_layers
from ..parity.share import SHARE_KEY, SHARE_METRICS, FloatLayer, Int8Share
from ..quantize import GateInfo, quantize_int8
from ..quantize.judge import TASK_JUDGED
from ..recipe import Recipe, StageName
from ..runners import OnnxRuntimeRunner
from .base import FP32_ONNX, INT8_ONNX, ArtifactWriter, RunContext, StageOutput, content_key, model_files, model_hash

__all__ = ["QuantizeStage"]


@dataclass(frozen=True)
class QuantizeStage:
    """Calibrated Q/DQ INT8 (``vitexport.quantize.quantize_int8``): the model, its scale table, the
    files the target writes from the scales, and those its contribution writes beside the model.

    Attributes:
        artifacts: the target's writers of files beside the Q/DQ model (``Contribution.artifacts``).
    """

    artifacts: tuple[ArtifactWriter, ...] = ()
    name: ClassVar[StageName] = StageName.quantize_int8
    needs_torch: ClassVar[bool] = False

    def enabled(self, recipe: Recipe) -> bool:
        return recipe.stages.quantize_int8.enabled

    def key(self, ctx: RunContext) -> str:
        # the budget steers the fallback; the INT8-share limits judge the file only: a changed limit
        # resumes the stage and gates it again (pipeline._regate) instead of quantizing anew
        r = ctx.recipe
        return content_key(ctx.key, model_hash(ctx.files[FP32_ONNX]), ctx.calib.fingerprint(),
                           r.calibration.model_dump(mode="json"), r.quantization.model_dump(mode="json"),
                           r.target, r.tolerance(self.name).model_dump(mode="json", exclude=set(SHARE_METRICS.values())))

    def run(self, ctx: RunContext) -> StageOutput:
        fp32, int8 = ctx.files[FP32_ONNX], ctx.out_dir / INT8_ONNX
        meta = ctx.reference.meta
        gate = GateInfo.from_reference(ctx.reference.output, ctx.reference.class_labels, meta.get("task"),
                                       meta.get("detect_scores", "softmax"))
        q = quantize_int8(fp32, int8, ctx.calib, ctx.target, ctx.out_dir, gate)
        attention = ctx.target.attention_note(q.attention)
        notes = [*q.notes, *_predicted(q), *([attention] if attention else []), *_precision(q, int8, ctx.target),
                 ctx.target.arithmetic]
        if len(ctx.reference.outputs) > 1:
            task = f" and the {meta['task']} task's gates on every output it reads" if meta.get("task") in TASK_JUDGED else ""
            notes.append(f"the calibration judge and fallback steer by the primary output '{ctx.reference.primary}'{task}; "
                         "this stage's gate checks every output")
        # the scale table and what the target wrote from the scales (orin: calibration.cache) are
        # kept, hashed and resumed with the model
        written = [Path(p) for key, p in q.artifacts.items() if key != "model"]
        files = {**model_files(int8), **{p.name: p for p in written if p.is_file()}}
        for write in self.artifacts:
            path = Path(write(int8, ctx.target))
            files[path.name] = path
        # where the artifact runs, for the report's summary (the report reads parity.json, not the target)
        where = {"name": ctx.target.name, "engine": ctx.target.engine, "runs_on": ctx.target.where}
        # the file's coverage, every float GEMM/Conv with why: gated here where the runtime runs the file as
        # written (the target's int8_share_stage); said only where a compiler re-decides (its stage gates)
        details = {"quantize": q.to_dict(), "target": where, SHARE_KEY: file_share(q, ctx.target, int8.name).to_dict()}
        return StageOutput(files=files, notes=notes, details=details,
                           layers=_layers(ctx, fp32, int8) if ctx.layers else None)

    def runner(self, ctx: RunContext, out: StageOutput):
        # The gate measures what the target computes: ONNX Runtime's fused integer kernels for
        # cpu, float Q/DQ semantics (fake quantization) for TensorRT and NPU targets - the same
        # session configuration the fallback chose its float layers with.
        return OnnxRuntimeRunner(out.files[INT8_ONNX], name=self.name, config=ctx.target.gate_config)


def _size(n: int) -> str:
    if n < 2**10:
        return f"{n} B"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def file_share(q, target, file: str) -> Int8Share:
    """The INT8 share of the written file's GEMM/Conv MACs (its Q/DQ coverage), every float GEMM/Conv
    named with why the quantizer left it float (annotate's rule, the fallback's parity reason)."""
    p, why = q.precision, dict(q.skipped_nodes)
    for f in q.float_fallback:  # the fallback's pick (its figures per node are in the quantize details)
        why[f["node"]] = (f"{why.get(f['node'], 'kept in float (fallback)')}: among the most sensitive to INT8, "
                          "picked to meet the parity budget")
    runs = p.get("high_precision", "fp32").upper()
    layers = [FloatLayer(f["node"], f["op"], int(f["macs"]), runs,
                         why.get(f["node"], "no Q/DQ written on its inputs (annotate found no INT8 pattern for it)"))
              for f in p.get("float_gemms") or []]
    total = int(p.get("int8_gemm_macs", 0)) + int(p.get("float_gemm_macs", 0))
    engine, stage = target.engine or "the runtime", target.int8_share_stage
    source = (f"the Q/DQ coverage of {file}, which {engine} runs as written" if stage in (None, StageName.quantize_int8)
              else f"the Q/DQ coverage of {file} only: {engine} re-decides precisions, its own figure is {stage}'s")
    return Int8Share(float(p.get("int8_gemm_macs_share", 0.0)), source, total, layers, hints=share_hints(q, target))


def share_hints(q, target) -> list[str]:
    """What may put more of the model in INT8: the target's settings, and the recipe keys that kept
    layers float in this run (the fallback's pick, attention left float by the recipe)."""
    hints = list(target.int8_share_hints)
    if q.float_fallback:
        cap = target.recipe.quantization.fallback.max_float_layers
        hints.append(f"quantization.fallback.max_float_layers={max(len(q.float_fallback) - 1, 0)} "
                     f"(now {'no cap' if cap is None else cap}; the fallback kept {len(q.float_fallback)} float) or "
                     "quantization.fallback.enabled=false: fewer float layers, at the parity the fallback measured")
    if any("quantize_attention_matmuls is off" in w for w in q.skipped_nodes.values()):
        hints.append("quantization.quantize_attention_matmuls=true")
    return hints


def _precision(q, int8: Path, target) -> list[str]:
    """What the engine will run and what the file holds, read off the written file (no GPU needed).

    The file's Q/DQ coverage is what the engine runs only where the engine honours it as written; a
    compiler that re-decides precisions (its ``int8_share_stage`` is later) has its own figure there."""
    p = q.precision
    if not p:
        return []
    later = target.int8_share_stage not in (None, StageName.quantize_int8)
    share = (f"; the file's Q/DQ covers {p['int8_gemm_macs_share']:.1%} of GEMM/Conv multiply-accumulates "
             f"({target.engine or 'the runtime'} re-decides precisions: what it runs in INT8 is the "
             f"{target.int8_share_stage} stage's figure)" if later else
             f"; the engine will run {p['int8_gemm_macs_share']:.1%} of GEMM/Conv multiply-accumulates in INT8 "
             "(the INT8 share)")
    on_disk = sum(f.stat().st_size for f in model_files(int8).values())
    weights = sorted((p.get("weight_bytes") or {}).items(), key=lambda kv: -kv[1])
    names = {"FLOAT": "FP32", "FLOAT16": "FP16"}
    line = (f"{int8.name}: {_size(on_disk)} on disk"
            + (f" (constants: {', '.join(f'{_size(b)} {names.get(k, k)}' for k, b in weights if b)}; the rest is the graph)"
               if weights else "")
            + share + f"; float parts written in {p['high_precision'].upper()}")
    islands = p.get("fp32_islands") or {}
    if islands:
        line += f"; {len(islands)} node(s) kept in FP32 ({'; '.join(f'{k}: {v}' for k, v in list(islands.items())[:3])})"
    return [line]


def _predicted(q) -> list[str]:
    """What the quantizer predicted from its own data, to read beside what the gate measures."""
    if q.parity is None or q.selection is None:
        return []
    p, m = q.parity["prediction"], q.parity["selection"]["metrics"]
    top1 = m.get("top1_agreement_gated", m.get("top1_agreement"))
    line = (f"predicted from {q.selection}: the gate's worst cosine over {p['gate_samples']} sample(s) "
            f"≥ {p['cosine_min']:.6f} (the selection samples' own minimum {m['cosine_min']:.6f}"
            + (f", gated top-1 {top1:.4f}" if top1 is not None else "")
            + (f", task {q.parity['selection']['task']}" if q.parity["selection"].get("task") else "")
            + (f"; expected top-1 flips {p['flip_rate'] * p['gate_samples']:.2f} of {p['gate_samples']} "
               f"(upper {(p.get('flip_rate_upper') or 0.0) * p['gate_samples']:.2f})" if p.get("flip_rate") is not None else "")
            + f"); {'passes' if q.parity['passed'] else 'misses'} the budget by this prediction; the gate then measures "
            "the written file on the parity data (this stage's checks)")
    if q.float_fallback:
        line += (f"; float layers (each with its share of the GEMM/Conv MACs taken out of INT8): "
                 + ", ".join(f"{f['node']} {f.get('int8_share_cost', f['macs_share']):.1%}" for f in q.float_fallback)
                 + f" ({q.float_macs_share:.1%} of the quantized MACs)")
    return [line]


def _layers(ctx: RunContext, fp32: Path, int8: Path):
    """Per-layer localisation of the INT8 error against the untouched model (FP32 beside INT8)."""
    return localize_layers(ctx.model.module, ctx.reference.feeds, {"fp32": fp32, "int8": int8},
                           budget=ctx.recipe.tolerance(StageName.quantize_int8), reference_layers=ctx.reference.layers)
