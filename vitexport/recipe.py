"""The recipe schema: what a target wants, validated before anything runs.

A recipe is a YAML file: a target's default recipe (``vitexport/targets/<name>.yaml``, copied to the
repository's ``recipes/`` for reading), or any path. Defaults live only here, in the schema;
unknown keys are errors that name the key path and the file (pydantic ``extra="forbid"``).
:func:`read_recipe` reads and validates a file; :func:`vitexport.targets.load_recipe` resolves a
target name first and checks the ``target`` against the registry (which this module never imports:
the registry is handed in as validation context).
``--set key.path=value`` overrides are applied to the raw mapping before validation, so they go
through exactly the same checks as the file; an error in a key a ``--set`` wrote names that
``--set``, not the file, and an unknown key comes with the nearest one the schema takes
(``--set quantization.smoth=0.5: unknown key 'smoth' in quantization; did you mean 'smooth'?``).

The pipeline's own stages are a :class:`StageName` (a ``str`` enum, so ``"simplify"`` and
``StageName.simplify`` are equal and hash alike). A target adds stages after ``quantize_int8`` (an engine
build, a simulator) and declares them itself (:class:`TargetStage`, ``Target.target_stages``): the recipe
validated for that target (:func:`recipe_schema`) takes their keys in ``stages:`` and ``parity:``, and
no other recipe does, so a plug-in adds a stage without editing this module and an unknown key is still
an error. Each stage's parity contract is one typed field of :class:`ParitySpec` with that stage's own
defaults; a recipe (or ``--set parity.quantize_int8.cosine_min=0.95``) that gives only some of its keys
keeps the stage's other gates.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Mapping, Sequence

import yaml
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, create_model, field_validator,
                      model_validator)

from .errors import BadInput, did_you_mean

__all__ = [
    "StageName",
    "TargetStage",
    "Task",
    "TASK_GATES",
    "OutputTolerance",
    "PASS_STAGES",
    "CalibrationMethod",
    "LayerNormMode",
    "Exporter",
    "Tolerance",
    "EngineTolerance",
    "ParitySpec",
    "Recipe",
    "STAGE_NAMES",
    "read_recipe",
    "recipe_schema",
    "with_target_stages",
    "parse_override",
    "parse_stage",
]

class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


class StageName(enum.StrEnum):
    """The pipeline's own stages, in order (a target's follow ``quantize_int8``: :class:`TargetStage`).
    A ``str``: it compares and hashes like its value."""

    reparameterize = "reparameterize"
    freeze_layernorm = "freeze_layernorm"
    mask_to_where = "mask_to_where"
    fuse_qkv = "fuse_qkv"
    export_onnx = "export_onnx"
    simplify = "simplify"
    quantize_int8 = "quantize_int8"


class Task(enum.StrEnum):
    """What the model's outputs mean, and so which metric parity gates beside cosine (see
    :mod:`vitexport.parity.tasks`): the source says it (a Hugging Face ``...ForObjectDetection`` detects),
    ``--task`` overrides it."""

    classify = "classify"
    detect = "detect"
    segment = "segment"
    depth = "depth"
    embed = "embed"


#: the task gates the INT8 stages (``quantize_int8`` and the engine built from its file) apply when the
#: recipe leaves them null, each measured against the FP32 model's own outputs on the parity samples
#: (which score 1.0 / 0.0 by construction, so a limit is the loss allowed); the reasons are in
#: :class:`Tolerance`'s field descriptions. The float stages report these metrics ungated: their
#: ``max_abs`` gate is far tighter.
TASK_GATES: dict[str, float] = {
    "map_min": 0.995,
    "miou_min": 0.995,
    "pixel_agreement_min": 0.99,
    "miou_labels_drop_max": 0.005,
    "map_labels_drop_max": 0.005,
    "abs_rel_max": 0.01,
    "delta1_min": 0.995,
}

#: the torch passes, in the order the pipeline runs them. ``reparameterize`` first, as timm deploys: a
#: model's own fold reads the modules it was built with (NextViT merges its BatchNorms into q/k/v, which
#: fuse_qkv would have replaced: 0.11 off when it ran last)
PASS_STAGES: tuple[StageName, ...] = (StageName.reparameterize, StageName.freeze_layernorm, StageName.mask_to_where,
                                      StageName.fuse_qkv)
#: the pipeline's own stage names, in order (the values of :class:`StageName`; a recipe's
#: :meth:`Recipe.stage_names` adds its target's)
STAGE_NAMES: tuple[str, ...] = tuple(s.value for s in StageName)


class CalibrationMethod(str, enum.Enum):
    """How an activation's range is chosen. ``auto`` scores the histogram's candidates (min/max,
    percentiles, MSE-optimal) by each Linear's output error on sampled activations, per tensor."""

    auto = "auto"
    minmax = "minmax"
    percentile = "percentile"
    entropy = "entropy"
    mse = "mse"


class LayerNormMode(str, enum.Enum):
    constants = "constants"
    fold = "fold"


class Exporter(str, enum.Enum):
    auto = "auto"
    torchscript = "torchscript"
    dynamo = "dynamo"


class OutputTolerance(_Spec):
    """One output's own distance gates (``parity.<stage>.outputs.pred_boxes.cosine_min=0.99``): they
    replace the stage's for that output; null keeps the stage's."""

    cosine_min: float | None = Field(default=None, ge=-1.0, le=1.0)
    max_abs: float | None = Field(default=None, ge=0.0)


class Tolerance(_Spec):
    """A stage's parity contract. ``None`` means the metric is reported but not gated.

    ``max_abs`` is divided by the reference's largest magnitude when ``relative`` is true, so one
    number fits logits of any scale. ``top1_agreement`` gates the *margin-gated* top-1 agreement
    (see :func:`vitexport.parity.compute_metrics`): a sample whose top-1 flips counts as a
    disagreement only when the reference's top-1/top-2 margin exceeds ``top1_margin_z`` times the
    spread the measured error gives that margin; ``top1_margin_z=0`` gates the raw agreement.
    """

    max_abs: float | None = None
    relative: bool = True
    cosine_min: float | None = None
    top1_agreement: float | None = None
    top1_margin_z: float = Field(
        default=3.0, ge=0.0,
        description="a top-1 flip counts only when the reference's top-1/top-2 margin is above "
                    "z * sqrt(2) * (the sample's RMS output error); 0: every flip counts",
    )
    accuracy_drop: float | None = Field(
        default=None, description="largest allowed drop of accuracy (fraction) vs the untouched model"
    )
    exact_unmasked: bool = False
    # The INT8-share gate sits beside the output gates (not in target_options): it is a verdict on what
    # a stage's backend reports, so a failure takes the same path (exit 1, REJECTED, rejected/), a
    # resumed stage is gated again when it changes, and --set parity.<stage>.int8_share_min=... accepts
    # a model as every other gate's key does. None: the target's declaration (Target.int8_share_min, filled
    # in for the stage where its backend reports the figure when the target is built), else not gated.
    int8_share_min: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="least share of GEMM/Conv multiply-accumulates the stage's backend must report in INT8 "
                    "(0 turns the gate off); null: the target's own")
    cpu_compute_ops_max: int | None = Field(
        default=None, ge=0,
        description="most compute ops (not Reshape/Transpose-like data movement) the backend may place on the "
                    "CPU; null: the target's own (a backend that reports no placement is not gated)")
    outputs: dict[str, OutputTolerance] | None = Field(
        default=None,
        description="per-output distance gates by output name (a detector's pred_boxes may need another cosine "
                    "than its logits); an output not named keeps the stage's")
    # Task gates (vitexport.parity.tasks): null means TASK_GATES' default on the INT8 stages and ungated
    # elsewhere, as int8_share_min's null means the target's own, so a classifier's tolerance and
    # report read as before and a resumed stage's recorded tolerance still equals the recipe's.
    map_min: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="detect: least COCO mAP@[.5:.95] (pycocotools) of the stage's detections scored against the "
                    "FP32 model's confident detections as ground truth; null: 0.995 on the INT8 stages, the "
                    "0.5-point mAP loss a deployment accepts for INT8 (FP32 scores 1.0 against itself), and not "
                    "gated where the parity data carries box labels (map_labels_drop_max gates then: against FP32 "
                    "at IoU 0.95, a box that moved a pixel counts as lost, right or wrong); 0: off")
    detect_score_min: float | None = Field(
        default=None, gt=0.0, lt=1.0,
        description="detect: a query is a detection when its best class probability (softmax, the last class "
                    "being 'no object') reaches this; null: 0.5, DETR's and YOLOS's own post-processing threshold")
    miou_min: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="segment: least mean IoU over classes of the stage's argmax map against the FP32 argmax, a "
                    "pixel's flip excused where FP32's top-1/top-2 margin is within top1_margin_z's bound (the "
                    "top-1 gate's rule); null: 0.995 on the INT8 stages (a 0.5-point mIoU loss); 0: off")
    pixel_agreement_min: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="segment: least share of pixels whose argmax class is the FP32 one (near ties excused as for "
                    "miou_min); null: 0.99 on the INT8 stages (mIoU is the strict gate, small classes weighing as "
                    "much as large ones; this one catches a map that is wrong everywhere a little); 0: off")
    miou_labels_drop_max: float | None = Field(
        default=None, ge=0.0,
        description="segment, when the parity data carries label maps 'y' [N, H, W]: largest drop of mIoU against "
                    "the labels from the FP32 model's to the stage's; null: 0.005 on the INT8 stages (the 0.5-point "
                    "loss a deployment accepts, as miou_min against FP32); .inf: off")
    map_labels_drop_max: float | None = Field(
        default=None, ge=0.0,
        description="detect, when the parity data carries box labels ('y' [N, M] beside 'y_boxes' [N, M, 4], or an "
                    "image folder's COCO json): largest drop of COCO mAP@[.5:.95] against the labels from the FP32 "
                    "model's to the stage's; null: 0.005 on the INT8 stages (the 0.5-point loss a deployment "
                    "accepts); .inf: off")
    abs_rel_max: float | None = Field(
        default=None, ge=0.0,
        description="depth: largest mean |d - d_fp32| / d_fp32 over pixels with a positive FP32 depth; null: 0.01 on "
                    "the INT8 stages (1 %, a tenth of what good monocular models score against labels, so the "
                    "FP32 model's error dominates); .inf: off")
    delta1_min: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="depth: least share of pixels with max(d/d_fp32, d_fp32/d) < 1.25; null: 0.995 on the INT8 "
                    "stages (at most 0.5 % of pixels grossly wrong); 0: off")
    recall_at_k_min: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="embed: least mean share of each parity sample's k=5 nearest neighbours (cosine, among the "
                    "parity samples) by FP32 embeddings that the stage's embeddings also rank in their k nearest; "
                    "null: reported, not gated (neighbours of near-equal similarity swap on noise; the per-sample "
                    "cosine gate bounds the embedding's error)")

    #: the task gates' values where the recipe leaves them null (EngineTolerance: TASK_GATES)
    task_defaults: ClassVar[Mapping[str, float]] = {}

    def task_limit(self, key: str) -> float | None:
        """A task gate's limit: the recipe's value, else this stage's default (None: not gated)."""
        value = getattr(self, key)
        return value if value is not None else self.task_defaults.get(key)

    def for_output(self, name: str) -> "Tolerance":
        """The tolerance one output is gated with: the stage's, with that output's own ``outputs`` entry."""
        own = (self.outputs or {}).get(name)
        if own is None:
            return self
        return self.model_copy(update={k: v for k, v in own.model_dump().items() if v is not None})


# Each stage's contract, with that stage's defaults. A partial mapping in a recipe validates against
# the stage's own class, so the keys it does not give keep the stage's defaults (never Tolerance's
# blanket None): ``parity: {quantize_int8: {cosine_min: 0.95}}`` keeps the top-1 and accuracy gates.
class FoldTolerance(Tolerance):
    """Folds and fusions (``freeze_layernorm``, ``fuse_qkv``): float32 rounding only."""

    max_abs: float | None = 1e-5


class ReparamTolerance(Tolerance):
    """``reparameterize``: folding BatchNorms and parallel branches re-rounds every weight in float32 and
    a deep model compounds it (timm's LeViT-128S with trained-looking weights: up to 3.9e-5 of its largest
    output), so an export's 1e-4 rather than a single fold's 1e-5. The passes after it are gated against
    the untouched model too: their limits sit on the error it left (``RunContext.tolerance``; the zoo's
    LeViT: 2e-5 left, so a fold that changed nothing failed its 1e-5 before)."""

    max_abs: float | None = 1e-4


class MaskTolerance(FoldTolerance):
    """``mask_to_where``: real-token positions must match within ``max_abs``."""

    exact_unmasked: bool = True


class OnnxTolerance(Tolerance):
    """``export_onnx`` / ``simplify``: the same float32 function, another op order."""

    max_abs: float | None = 1e-4


class EngineTolerance(Tolerance):
    """INT8 on the target's runtime (the stages a target adds: its engine, a simulator): direction and
    decisions, not digits."""

    cosine_min: float | None = 0.98
    top1_agreement: float | None = 0.9
    task_defaults: ClassVar[Mapping[str, float]] = TASK_GATES


class Int8Tolerance(EngineTolerance):
    """``quantize_int8``: as the engine, and labelled data may lose at most 0.3 points of accuracy.

    0.3 points is what a deployment team accepts for INT8 (issue 23: the 2 points this was before let a
    trained model that lost 0.76 points pass). It is exact arithmetic on the labelled parity set: with
    fewer than 334 labelled samples, one sample lost fails the gate.
    """

    accuracy_drop: float | None = 0.003


class ParitySpec(_Spec):
    """One :class:`Tolerance` per stage (``recipe.parity.quantize_int8``), each with its own defaults."""

    reparameterize: ReparamTolerance = ReparamTolerance()
    freeze_layernorm: FoldTolerance = FoldTolerance()
    mask_to_where: MaskTolerance = MaskTolerance()
    fuse_qkv: FoldTolerance = FoldTolerance()
    export_onnx: OnnxTolerance = OnnxTolerance()
    simplify: OnnxTolerance = OnnxTolerance()
    quantize_int8: Int8Tolerance = Int8Tolerance()

    @field_validator("*", mode="before")
    @classmethod
    def _merge_instances(cls, value: Any) -> Any:
        # A Tolerance built in Python counts with the keys it was given, like a partial mapping.
        return value.model_dump(exclude_unset=True) if isinstance(value, Tolerance) else value


class FreezeLayerNormSpec(_Spec):
    enabled: bool = True
    mode: LayerNormMode = LayerNormMode.fold


class StageToggle(_Spec):
    enabled: bool = True


class StagesSpec(_Spec):
    """Switches for the optional stages (export and simplify always run), and one for each stage the
    target declares (:class:`TargetStage`: an engine build, a simulator; other targets have none to
    switch). ``reparameterize`` folds training-time branches (FastViT, MobileOne, RepViT, RepVGG) into
    the convs a deployed model runs, before the other passes and the export, on every target."""

    reparameterize: StageToggle = StageToggle()
    freeze_layernorm: FreezeLayerNormSpec = FreezeLayerNormSpec()
    mask_to_where: StageToggle = StageToggle()
    fuse_qkv: StageToggle = StageToggle()
    quantize_int8: StageToggle = StageToggle()


@dataclass(frozen=True)
class TargetStage:
    """A stage a target runs after ``quantize_int8``, declared by the target (``Target.target_stages``).

    Its name is a key of the recipe's ``stages:`` (a :class:`StageToggle`) and ``parity:`` (a ``tolerance``
    with that class's defaults) for that target's recipes only (:func:`recipe_schema`).

    Args:
        name: the stage's name (its ``Stage.name``, the key in ``stages:`` and ``parity:``).
        tolerance: its parity contract's class (INT8 on the target's runtime by default).
    """

    name: str
    tolerance: type[Tolerance] = EngineTolerance


class ExportSpec(_Spec):
    """How the model becomes ONNX (``vitexport.export.export_onnx``). Shapes are always static.

    ``decompose_layernorm`` writes LayerNorm as ReduceMean/Sub/Mul/Sqrt/Div (no ``LayerNormalization``
    op, no ``Pow``) for compilers that cannot parse the opset-17 op. ``fp16_safe_layernorm`` also
    divides by the largest ``|x - mean|`` before squaring, so no intermediate overflows float16
    (adds Abs/ReduceMax/Max; a target that runs no float16 can turn it off). ``explicit_attention``
    writes ``scaled_dot_product_attention`` as MatMul/Softmax/MatMul at every opset, and
    ``einsum_as_matmul`` two-operand einsums as Transpose/Reshape/MatMul. ``gelu_approximation:
    tanh`` replaces exact GELU (``Erf``) by its tanh form; GELU itself moves by up to 5e-4, so the
    model's outputs change slightly and ``parity.export_onnx`` may need loosening. ``align_corners_resize:
    asymmetric`` rewrites align-corners upsampling by 2 exactly (:mod:`vitexport.export.resize`), after onnxsim;
    ``fractional_resize: matmul`` rewrites a small linear Resize by a fractional factor as a MatMul
    (:mod:`vitexport.export.resize_matmul`), after onnxsim; ``slice_scatter: concat`` rewrites a ScatterND that overwrites one slice as Slice/Concat
    (:mod:`vitexport.export.scatter`), after onnxsim.
    """

    opset: int = Field(default=17, ge=11, le=23)
    exporter: Exporter = Exporter.auto
    decompose_layernorm: bool = False
    fp16_safe_layernorm: bool = True
    explicit_attention: bool = True
    einsum_as_matmul: bool = True
    gelu_approximation: Literal["none", "tanh"] = "none"
    align_corners_resize: Literal["keep", "asymmetric"] = Field(
        default="keep", description="asymmetric: an align-corners linear Resize by 2 is written as an asymmetric "
                                    "Resize and an exact per-axis correction (depthwise Conv, Mul, Add), for an NPU "
                                    "that runs the align-corners form on its CPU (the target's recipe says which)")
    fractional_resize: Literal["keep", "matmul"] = Field(
        default="keep", description="matmul: a linear Resize by a factor that is neither an integer nor the inverse of "
                                    "one, on a small map, is written as a MatMul with its constant interpolation "
                                    "matrix, for an NPU that runs such a Resize on its CPU (UperNet's pyramid pooling)")
    slice_scatter: Literal["keep", "concat"] = Field(
        default="keep", description="concat: a ScatterND that overwrites one contiguous slice (an in-place slice "
                                    "assignment such as Conditional DETR's box update) is written as Slice and Concat, "
                                    "for a compiler that runs scatters on its CPU or stalls on them")
    batch_size: int = Field(default=1, ge=1)
    simplify: bool = True


class ContractSpec(_Spec):
    """What the target's compiler accepts. ``allowed_ops`` of ``None`` means any standard op."""

    max_opset: int = Field(default=17, ge=11, le=23)
    allowed_ops: list[str] | None = None
    forbidden_ops: list[str] = []
    forbid_float16: bool = Field(
        default=False, description="no float16 or bfloat16 tensor, initializer, Cast or constant anywhere"
    )
    static_shapes: bool = True
    allowed_domains: list[str] = Field(
        default=[], description="operator domains besides the standard ONNX one (e.g. com.microsoft)"
    )


class PreprocessSpec(_Spec):
    """How images are turned into the model's input when the model does not say."""

    resize: int | None = None
    crop: int | None = None
    interpolation: Literal["bilinear", "bicubic", "nearest"] = "bilinear"
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None


class CalibrationSpec(_Spec):
    method: CalibrationMethod = CalibrationMethod.auto
    num_samples: int = Field(default=128, ge=1)
    batch_size: int = Field(default=8, ge=1)
    percentile: float = Field(default=99.99, gt=50.0, le=100.0)
    num_bins: int = Field(default=2048, ge=128)
    seed: int = 0
    reuse: bool = True
    preprocess: PreprocessSpec = PreprocessSpec()
    memory_budget_mb: int = Field(
        default=384, ge=16, description="most MB of observed tensors fetched per inference run (chunked above)"
    )


class FallbackSpec(_Spec):
    enabled: bool = True
    max_float_layers: int | None = Field(
        default=None, ge=0,
        description="most layers the fallback keeps in float (none: no cap; the search stops when more float stops "
                    "helping, and the target's INT8-share gate judges what the float layers cost; 0: no fallback)")
    eval_samples: int = Field(
        default=32, ge=1,
        description="calibration samples held out (never calibrated on, at most a quarter of them) on which the "
                    "fallback chooses its float layers; the parity data the gate scores is never used for that",
    )
    sensitivity_samples: int = Field(default=4, ge=1, description="samples used to rank layers by sensitivity")
    ranking: Literal["auto", "node", "output"] = Field(
        default="auto",
        description="how the fallback orders the layers it may keep float: node (the error each adds to its own "
                    "output, one-node models), output (the error each alone adds to the model's outputs: one model "
                    "run per layer and sensitivity sample), auto (output on a network with conv stages, where "
                    "trained MobileViT-XXS and EfficientViT-B0 measured it, while that costs at most 500 G "
                    "multiply-accumulates; node on transformers)")
    screen_samples: int = Field(
        default=64, ge=0,
        description="calibration samples screened besides the held-out ones, so that the prediction of the gate's "
                    "worst case over its many samples rests on more than the held-out few (0: held-out only)")


class QuantizationSpec(_Spec):
    high_precision: Literal["fp16", "fp32"] | None = Field(
        default=None,
        description="type of the Q/DQ model's float parts (LayerNorm, Softmax, GELU, residual Adds): fp16 writes "
                    "them in float16, FP32 islands kept where calibrated ranges pass float16's; default: the "
                    "target's (fp16 where the runtime builds what the file says, fp32 otherwise)")
    fp16_samples: int = Field(
        default=16, ge=1, description="calibration samples whose ranges decide the FP32 islands of an fp16 model")
    smooth: bool = Field(
        default=True, description="smooth outlier channels into the weights (SmoothQuant), folded into LayerNorms "
                                  "or as an inserted Mul")
    smooth_alpha: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="migration strength α; none: searched per site on calibration data (the Linear's output error)")
    smooth_insert: bool = Field(
        default=True, description="smooth Linear inputs no LayerNorm can absorb (GELU outputs, attention outputs) "
                                  "with an inserted Mul")
    bias_correction: bool = Field(
        default=True, description="fold each Linear's mean INT8 output error into its float bias")
    weight_rounding: Literal["auto", "nearest", "gptq"] = Field(
        default="auto",
        description="integer weights: round to nearest, or GPTQ (each Linear's output error on its input rows "
                    "decides the rounding; the scales stay the same); auto: GPTQ on the Linears with at least 2.5 rows "
                    "per input channel while that arithmetic (Hessians and their inverses) costs at most 250 G "
                    "multiply-accumulates (a MiniLM-L6 92 G, where it raised the held-out mean cosine 0.9977 -> 0.9985; "
                    "a BERT-base or ViT-B 103 G on its 768-wide Linears), nearest for the others")
    gptq_rows: int = Field(
        default=4096, ge=16,
        description="activation rows, spread over the statistics pass's, whose X^T X is GPTQ's Hessian of a Linear "
                    "input: on MiniLM-L6 512 rows over-fit (held-out worst cosine 0.9840), 2048 0.9931, 4096 0.9954")
    gptq_damp: float = Field(
        default=0.1, gt=0.0,
        description="the share of the mean Hessian diagonal GPTQ adds to it: on MiniLM-L6 the paper's 0.01 over-fit "
                    "the rows (held-out worst cosine 0.9511 vs 0.9938 rounding to nearest), 0.1 0.9954, 0.3 0.9960, "
                    "1.0 0.9942 (mean 0.9985, 0.9984, 0.9982)")
    search_rows: int = Field(
        default=512, ge=16, description="activation rows per Linear input sampled for the searches (α, ranges, bias)")
    smooth_samples: int = Field(
        default=64, ge=1,
        description="calibration samples whose per-channel maxima set the smoothing factors (the first of the "
                    "seeded draw; the factors only balance channels, so a subset serves and saves a pass over the set); "
                    "above 8 G multiply-accumulates a sample fewer, down to 32 (ViT-B/16 at 224: 32)",
    )
    asymmetric_activations: bool | Literal["auto"] = Field(
        default=False,
        description="uint8 activations with a zero point (true) or int8 with zero point 0 (false); auto: uint8 where "
                    "the graph has conv stages (a conv whose kernel is not its stride), int8 on a transformer")
    per_channel_weights: bool = True
    quantize_attention_matmuls: bool = True
    quantize_attention_pv: bool = Field(
        default=True, description="attn·V in INT8 too (the Softmax output and V quantized; a GPU's fused INT8 "
                                  "attention needs it); false: only Q·Kᵀ is INT8, attn·V runs in the float type")
    fallback: FallbackSpec = FallbackSpec()
    measure_latency: bool = Field(
        default=False, description="time FP32 vs INT8 in ONNX Runtime (2 threads, batch 1) and report the ratio; "
                                   "off by default: two more sessions and seconds per run, and host latency says "
                                   "little about the target (make bench compares carefully)")
    reduce_range_weights: bool | Literal["auto"] = Field(
        default=False,
        description="7-bit weights (-63..63): x86 CPUs without VNNI saturate int16 sums of u8 x s8 products otherwise "
                    "(x86 integer kernels); auto: 7-bit where the CPU that runs "
                    "this export's parity lacks VNNI/AMX, so what it measures is what such a CPU computes",
    )


class ParityDataSpec(_Spec):
    """Which parity samples every stage is compared on (a seeded subset when the data is larger)."""

    num_samples: int = Field(default=512, ge=1)
    seed: int = 0
    synthetic_samples: int = Field(default=16, ge=1, description="used only when no data is given")


class Recipe(_Spec):
    """A validated recipe. ``name`` is the recipe's name (file stem), ``target`` the registered target
    whose rules it follows (``vitexport targets`` lists them).

    Validated with ``context={"targets": {name: Target class}}`` (what :func:`read_recipe` is given),
    ``target`` must be one of them and the target's :meth:`~vitexport.targets.Target.check_recipe`
    must accept the recipe; without a context (a recipe built in Python) the target is checked when
    the run builds it.
    """

    name: str
    target: str = Field(min_length=1)
    description: str = ""
    stages: StagesSpec = StagesSpec()
    export: ExportSpec = ExportSpec()
    contract: ContractSpec = ContractSpec()
    calibration: CalibrationSpec = CalibrationSpec()
    quantization: QuantizationSpec = QuantizationSpec()
    parity: ParitySpec = ParitySpec()
    parity_data: ParityDataSpec = ParityDataSpec()
    target_options: dict[str, Any] = Field(
        default={}, description="settings only the target understands (its ``Options`` schema validates them when "
                                "the recipe is loaded: unknown keys are errors there too)")

    @field_validator("target")
    @classmethod
    def _registered(cls, value: str, info: ValidationInfo) -> str:
        known = _context_targets(info)
        if known is not None and value not in known:
            raise ValueError(f"unknown target '{value}'; known targets: {', '.join(known)}")
        return value

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> "Recipe":
        if self.export.opset > self.contract.max_opset:
            raise ValueError(
                f"export.opset {self.export.opset} is above contract.max_opset {self.contract.max_opset}"
            )
        if self.quantization.high_precision == "fp16" and self.contract.forbid_float16:
            raise ValueError("quantization.high_precision: fp16 with contract.forbid_float16 (the target runs no "
                             "float16); use fp32")
        known = _context_targets(info)
        problems = known[self.target].check_recipe(self) if known and self.target in known else []
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def stage_names(self) -> tuple[str, ...]:
        """Every stage this recipe has a contract for, in pipeline order: the pipeline's own, then its
        target's (:class:`TargetStage`)."""
        return tuple(type(self.parity).model_fields)

    def tolerance(self, stage: StageName | str) -> Tolerance:
        """The stage's parity contract (``recipe.parity.<stage>``).

        Raises:
            ValueError: the recipe has no such stage (neither the pipeline's nor its target's).
        """
        if str(stage) not in type(self.parity).model_fields:
            raise ValueError(f"unknown stage {str(stage)!r}; this recipe's stages: {', '.join(self.stage_names())}")
        return getattr(self.parity, str(stage))

    def toggle(self, stage: StageName | str) -> StageToggle | FreezeLayerNormSpec | None:
        """The stage's switch in ``stages`` (None for stages that always run: export, simplify)."""
        return getattr(self.stages, str(stage)) if str(stage) in type(self.stages).model_fields else None


def _context_targets(info: ValidationInfo) -> Mapping[str, Any] | None:
    """The registered targets handed in as validation context, or None."""
    return (info.context or {}).get("targets") if isinstance(info.context, dict) else None


@functools.cache
def recipe_schema(stages: tuple[TargetStage, ...] = ()) -> type[Recipe]:
    """The recipe schema of a target that declares ``stages``: :class:`Recipe` with one more key per
    stage in ``stages:`` and ``parity:`` (still ``extra="forbid"``); :class:`Recipe` itself for none.

    Raises:
        ValueError: two stages share a name, or one takes the name of a pipeline stage.
    """
    if not stages:
        return Recipe
    names = [s.name for s in stages]
    taken = [n for n in names if n in STAGE_NAMES or names.count(n) > 1]
    if taken:
        raise ValueError(f"target stage name(s) {sorted(set(taken))} taken (pipeline stages: {', '.join(STAGE_NAMES)})")
    parity = create_model("ParitySpec", __base__=ParitySpec, **{s.name: (s.tolerance, s.tolerance()) for s in stages})
    toggles = create_model("StagesSpec", __base__=StagesSpec, **{s.name: (StageToggle, StageToggle()) for s in stages})
    return create_model("Recipe", __base__=Recipe, stages=(toggles, toggles()), parity=(parity, parity()))


def _declared(targets: Mapping[str, Any] | None, data: Mapping[str, Any]) -> tuple[TargetStage, ...]:
    """The stages the recipe's target declares (none for an unknown target: validation names it)."""
    cls = (targets or {}).get(data.get("target")) if isinstance(data.get("target"), str) else None
    return tuple(getattr(cls, "target_stages", ()))


def with_target_stages(recipe: Recipe, stages: Sequence[TargetStage]) -> Recipe:
    """``recipe`` under the schema that takes ``stages`` (itself when it does already): a recipe built
    in Python without its target gets the target's stages, with their defaults, when the target is built."""
    schema = recipe_schema(tuple(stages))
    if isinstance(recipe, schema):
        return recipe
    return schema.model_validate(recipe.model_dump())


def parse_stage(text: str, recipe: Recipe | None = None) -> StageName | str:
    """``'quantize_int8'`` → ``StageName.quantize_int8``; a stage ``recipe``'s target declares → its name.

    Raises:
        BadInput: not a stage name (the message lists them).
    """
    names = recipe.stage_names() if recipe is not None else STAGE_NAMES
    if text in STAGE_NAMES:
        return StageName(text)
    if text in names:
        return text
    raise BadInput(f"unknown stage '{text}'{did_you_mean(text, names)} (stages are {', '.join(names)})")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``'calibration.method=minmax'`` → (['calibration', 'method'], 'minmax'); the value is YAML."""
    if "=" not in text:
        raise BadInput(f"--set expects KEY=VALUE, got '{text}'")
    key, _, raw = text.partition("=")
    path = [k for k in key.strip().split(".") if k]
    if not path:
        raise BadInput(f"--set has an empty key in '{text}'")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return path, value


def _apply_override(data: dict, path: list[str], value: Any, text: str) -> None:
    node = data
    for i, key in enumerate(path[:-1]):
        nxt = node.get(key)
        if nxt is None:
            nxt = node[key] = {}
        if not isinstance(nxt, dict):
            raise BadInput(f"--set {text}: '{'.'.join(path[: i + 1])}' is not a mapping")
        node = nxt
    node[path[-1]] = value


#: keys a recipe no longer takes, and what says it now (the schema stays strict: the old name is an
#: error, this only tells the user where it went)
RENAMED_KEYS = {
    "quantization.equalize": "quantization.smooth",
    "quantization.equalize_alpha": "quantization.smooth_alpha",
    "quantization.equalize_samples": "quantization.smooth_samples",
    "quantization.strongly_typed": "the target: each target builds one way, see vitexport targets",
}


def _fields_at(loc: Sequence[str | int], cls: type[BaseModel] = Recipe) -> list[str]:
    """The keys the schema takes at ``loc`` (``('quantization', 'fallback')`` → FallbackSpec's)."""
    for key in loc:
        field = cls.model_fields.get(str(key))
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        cls = annotation
    return list(cls.model_fields)


def _unknown_key(loc: Sequence[str | int], schema: type[BaseModel] = Recipe) -> str:
    """``unknown key 'smoth' in quantization; did you mean 'smooth'?`` (or where a renamed key went)."""
    dotted = ".".join(str(p) for p in loc)
    key, parent = str(loc[-1]), ".".join(str(p) for p in loc[:-1])
    where = f" in {parent}" if parent else ""
    if dotted in RENAMED_KEYS:
        return f"unknown key '{key}'{where} (now {RENAMED_KEYS[dotted]})"
    return f"unknown key '{key}'{where}{did_you_mean(key, _fields_at(loc[:-1], schema))}"


def _blamed(loc: Sequence[str | int], msg: str, file: str, overrides: Sequence[tuple[list[str], str]]) -> str:
    """Who wrote the failing key: the last ``--set`` on its path (``--set quantization.smoth=0.5``),
    else the recipe file. A whole-recipe check (empty ``loc``) blames the ``--set`` its message names."""
    at = [str(p) for p in loc]
    for keys, text in reversed(overrides):
        n = min(len(keys), len(at))
        if (at and keys[:n] == at[:n]) or (not at and ".".join(keys) in msg):
            return f"--set {text}"
    return file


def _format_error(err: ValidationError, source: str, overrides: Sequence[tuple[list[str], str]] = (),
                  schema: type[BaseModel] = Recipe) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "<root>"
    kind = first["type"]
    more = f" (+{len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    blamed = _blamed(first["loc"], first["msg"], source, overrides)
    if kind == "value_error" and not first["loc"]:  # a whole-recipe check: its message names the keys
        return f"{blamed}: {first['msg'].removeprefix('Value error, ')}"
    if kind == "extra_forbidden":
        return f"{blamed}: {_unknown_key(first['loc'], schema)}{more}"
    if kind == "enum":
        msg = f"{first['msg'].lower()} (got {first.get('input')!r})"
    elif kind == "value_error":  # a field's own check: its message says what it got
        msg = first["msg"].removeprefix("Value error, ")
    else:
        msg = f"{first['msg']} (got {first.get('input')!r})" if "input" in first and kind != "missing" else first["msg"]
    return f"{blamed}: {loc}: {msg}{more}"


def read_recipe(path: str | Path, overrides: Sequence[str] = (), *,
                targets: Mapping[str, Any] | None = None) -> Recipe:
    """Read, override and validate the recipe file ``path``.

    Args:
        path: the YAML file; the recipe's ``name`` defaults to its stem.
        overrides: ``key.path=value`` strings applied before validation.
        targets: the registered targets (name → Target class): ``target`` must be one of them and
            its ``check_recipe`` must accept the recipe; the stages it declares (``target_stages``) are
            keys the recipe may set. :func:`vitexport.targets.load_recipe` gives them.
    Returns:
        The frozen, validated :class:`Recipe`.
    Raises:
        BadInput: unreadable YAML, unknown key (with the nearest known one), wrong type, unknown
            target; the message names the key path and the file, or the ``--set`` that wrote the key.
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise BadInput(f"{path}: cannot read recipe: {exc}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: a recipe must be a mapping, got {type(data).__name__}")
    data.setdefault("name", path.stem)
    applied = []
    for text in overrides:
        keys, value = parse_override(text)
        _apply_override(data, keys, value, text)
        applied.append((keys, text))
    schema = recipe_schema(_declared(targets, data))
    try:
        return schema.model_validate(data, context={"targets": targets} if targets is not None else None)
    except ValidationError as err:
        raise BadInput(_format_error(err, str(path), applied, schema)) from None
