"""What a target is: the :class:`Target` base class, the plug-in API every target module implements.

A *target* is where the artifact runs (a Jetson with TensorRT 10, one with TensorRT 8, an edge NPU,
ONNX Runtime on x86). Everything vitexport knows about it lives in one module under
``vitexport/targets/`` (or in a third-party package, see :mod:`vitexport.targets._registry`): how
Q/DQ is placed and encoded, which graphs its runtime accepts, which arithmetic the INT8 gate must
run to predict it, which files and stages it adds to a run, which recipes make sense for it, and
its default recipe. The rest of the pipeline (``quantize/``, ``check/``, ``stages/``) is handed one
``Target`` object, built once per run by :func:`vitexport.targets.build_target`, and asks it.
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import ClassVar

import onnx_ir as ir
from pydantic import BaseModel, ConfigDict, ValidationError

from ..check.rules import RuntimeRules
from ..check.violation import Violation
from ..errors import BadInput, did_you_mean
from ..graph.query import conv_stages
from ..quantize.annotate import annotate
from ..quantize.spec import Encoding, QuantPlan
from ..recipe import Recipe, StageName, TargetStage, with_target_stages
from ..runners.base import BaseRunner
from ..runners.host import cpu_int8_isa, int8_dot_saturates
from ..runners.sessions import LOW_MEMORY, QDQ_AS_FLOAT, SessionConfig
from ..stages.base import Contribution

__all__ = ["Target", "TargetOptions"]


class TargetOptions(BaseModel):
    """A target's own settings, the recipe's ``target_options:`` mapping (none by default).

    A target that has some subclasses this with typed fields and defaults and names it as its
    ``Options``; unknown keys are errors naming ``target_options.<key>`` and the recipe file.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


class Target:
    """One place an artifact runs. Subclass it in a module of its own and register it.

    What a target module provides (``vitexport/targets/tensorrt/orin.py`` is the worked example):

    1. **A subclass, registered by name.** ``@register_target`` on a subclass with ``name`` (the
       recipe's ``target:`` value and ``--target NAME``) and ``description`` (one line for
       ``vitexport targets``). Names are unique: the registry refuses a second class with a name it
       holds. ``class OrinTarget(Target): name = "orin"``.
    2. **Its default recipe**, ``<name>.yaml`` beside the module (:meth:`recipe_file`), listing only
       what differs from the schema's defaults (:mod:`vitexport.recipe`): ``orin.yaml`` sets
       ``target: orin`` and ``contract.max_opset: 19``.
    3. **Where Q/DQ goes and how it is written** (annotate, pt2e's first step): the class
       attributes below (``force_symmetric``, ``dedicated_pairs``...) and the hooks
       :meth:`attention_ok` and :meth:`high_precision`. Orin quantizes attention's batched MatMuls
       only where TensorRT fuses INT8 attention (head size 16/32/64, ≤ 512 tokens) and writes the
       float parts in FP16 for a strongly typed build.
    4. **What its runtime accepts** (validate): :meth:`rules` returns a
       :class:`~vitexport.check.rules.RuntimeRules` (subclass it to add rule ids); the quantizer
       validates what it wrote with it, and the export's contract step and ``vitexport check`` run
       it after the recipe's contract. Orin returns TensorRT's rules over TensorRT 10.3's parser.
    5. **The arithmetic of its INT8 gate**: ``runs_in_onnxruntime`` (ONNX Runtime's integer
       kernels are the runtime: cpu) or float Q/DQ semantics (:attr:`gate_config`).
    6. **Extra files and stages**: :meth:`write_artifacts` writes files that need the calibrated
       scales (orin: TensorRT's ``calibration.cache``); :meth:`contribution` returns files written
       beside the Q/DQ model and stages run after it (orin: ``build_engine.sh`` and the TensorRT
       engine stage, :mod:`vitexport.targets.tensorrt.engine`); each such stage is declared in
       :attr:`target_stages` (its name and contract: the keys ``stages.<name>`` and ``parity.<name>``
       of this target's recipes), and a file its runtime runs is opened for ``vitexport parity
       --compare`` by :meth:`open_artifact` (:attr:`artifact_suffixes`). A vendor's target lives
       in the vendor's folder (``targets/tensorrt/``) with everything else that names the vendor.
    7. **Recipe cross-checks and its own settings**: :meth:`check_recipe` refuses recipes the
       target cannot run, at load time, with the key to change (a target with ``forbid_float16``
       refuses ``quantization.high_precision: fp16``); settings only this target understands are a
       :class:`TargetOptions` subclass named ``Options`` (the recipe's ``target_options:``, parsed
       into :attr:`options`; rk3588's ``route``).
    8. **Its tests**: the tests parametrized over the registry run every registered target through
       the same checks (``tests/targets/``: complete, its recipe validates and matches ``recipes/``;
       ``tests/test_cli.py``: it exports the demo and its files pass ``vitexport check`` without a
       lint warning; ``tests/test_clean_artifacts.py``: a ViT-S and a BERT-style encoder export to
       clean files); add what is particular to it (orin's: ``tests/check/test_rules.py``,
       ``tests/quantize/test_targets.py``).

    Args:
        recipe: the validated recipe of the run (``recipe.target == self.name``).
    """

    #: the registry key: the recipe's ``target:`` value and ``--target NAME``
    name: ClassVar[str]
    #: one line for ``vitexport targets``
    description: ClassVar[str] = ""
    #: symmetric (int8, zero point 0) activations regardless of the recipe
    force_symmetric: ClassVar[bool] = True
    #: with asymmetric activations, attention MatMuls' two-sided inputs still int8 with zero point 0
    #: (:attr:`~vitexport.quantize.spec.Encoding.symmetric_attention`)
    symmetric_attention: ClassVar[bool] = False
    #: per-tensor weights regardless of the recipe
    force_per_tensor: ClassVar[bool] = False
    #: one Q/DQ pair per consumer (TensorRT fuses a pair into its one consumer), else one per tensor
    dedicated_pairs: ClassVar[bool] = False
    #: the runtime has no float16: no float16 tensor may reach it, and no recipe may ask for one
    forbid_float16: ClassVar[bool] = False
    #: Gemm / Conv biases as int32 (scale = activation scale × weight scale) so ONNX Runtime fuses
    #: QGemm / QLinearConv; TensorRT wants float biases
    int32_bias: ClassVar[bool] = False
    #: ONNX Runtime's fused integer kernels are this target's runtime, so parity is measured through
    #: them; other targets are measured with float Q/DQ semantics (what TensorRT / an NPU computes)
    runs_in_onnxruntime: ClassVar[bool] = False
    #: the highest rank of a tensor a smoothing Mul may be inserted on (None: any); a site whose
    #: tensor is deeper is folded where it can be, else left unsmoothed (the report says why)
    max_insert_rank: ClassVar[int | None] = None
    #: whether a smoothing Mul may be inserted on an attention output (``softmax·V`` through head
    #: transposes) whose factors cannot fold into the V projection; False: such a site is left
    #: unsmoothed, the report says why
    insert_after_attention: ClassVar[bool] = True
    #: whether a per-channel Mul may be inserted in front of a depthwise conv to equalise its input
    #: channels (the factors move into its per-channel weight); False where the runtime pays for the Mul
    #: more than its INT8 error gains: such convs keep their input as it is
    equalise_depthwise: ClassVar[bool] = True
    #: the schema of the recipe's ``target_options:`` for this target
    Options: ClassVar[type[TargetOptions]] = TargetOptions
    #: the runtime's name as a report writes it (``TensorRT``); empty: no named runtime. The report's
    #: sentences about an engine come from the run's target, so no report names another target's engine
    engine: ClassVar[str] = ""
    #: where the artifact runs, one phrase for the report's summary (the ``description`` when empty)
    runs_on: ClassVar[str] = ""
    #: why attn·V in INT8 matters to this runtime, appended to the report's attention line (empty: say nothing)
    attention_int8_why: ClassVar[str] = ""
    #: what a float attn·V costs on this runtime, appended to the report's attention line (empty: say nothing)
    attention_float_cost: ClassVar[str] = ""
    #: the stage whose backend reports what runs in INT8 (None: none does): there the INT8-share gate
    #: applies. The Q/DQ file's coverage is what TensorRT and a paper NPU contract see, so by default
    #: ``quantize_int8``; a compiler that re-decides precisions (RKNN, OpenVINO) is gated where it reports
    int8_share_stage: ClassVar[str | None] = StageName.quantize_int8
    #: the least share of GEMM/Conv multiply-accumulates that stage must report in INT8 (the recipe's
    #: ``parity.<stage>.int8_share_min`` overrides it). 0.95: a deployment buys INT8 throughput; a model
    #: with more than 5 % of its GEMM/Conv work in float is a float model to the user and must say so
    int8_share_min: ClassVar[float] = 0.95
    #: compute ops the backend may place on the CPU (``parity.<stage>.cpu_compute_ops_max``); None: it
    #: reports no placement, nothing to gate
    cpu_compute_ops_max: ClassVar[int | None] = None
    #: what a user can try on this target when the INT8 share misses, beside accepting it (recipe keys,
    #: with why); the quantize stage adds the fallback's and attention's keys where those kept layers float
    int8_share_hints: ClassVar[tuple[str, ...]] = ()
    #: the stages :meth:`contribution` adds after ``quantize_int8`` (orin: ``build_engine``): their names are
    #: keys of this target's recipes' ``stages:`` and ``parity:`` (with the declared contract's defaults),
    #: and of no other target's
    target_stages: ClassVar[tuple[TargetStage, ...]] = ()
    #: suffixes of the files this target's runtime runs that ``vitexport parity --compare`` opens with
    #: :meth:`open_artifact` (orin: TensorRT plans); empty: none
    artifact_suffixes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, recipe: Recipe):
        recipe = with_target_stages(recipe, self.target_stages)  # a recipe built in Python: the stages' defaults
        self.recipe = self._with_share_gate(recipe)
        self.spec = recipe.quantization
        #: the recipe's ``target_options`` parsed by :attr:`Options` (checked at load by :meth:`check_recipe`)
        try:
            self.options = self.Options.model_validate(recipe.target_options)
        except ValidationError:  # a recipe built in Python skipped the load-time check
            raise BadInput(f"recipe {recipe.name}: {'; '.join(self.check_recipe(recipe))}") from None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(recipe={self.recipe.name!r})"

    # --- the recipe ---------------------------------------------------------------------------------
    @classmethod
    def _with_share_gate(cls, recipe: Recipe) -> Recipe:
        """``recipe`` with this target's INT8-share gate filled in where the recipe leaves it null
        (``parity.<int8_share_stage>.int8_share_min`` / ``cpu_compute_ops_max``): the report's and the
        manifest's tolerance then show the limit that was applied."""
        stage = cls.int8_share_stage
        if stage is None:
            return recipe
        tol = recipe.tolerance(stage)
        update: dict = {}
        if tol.int8_share_min is None:
            update["int8_share_min"] = cls.int8_share_min
        if tol.cpu_compute_ops_max is None and cls.cpu_compute_ops_max is not None:
            update["cpu_compute_ops_max"] = cls.cpu_compute_ops_max
        if not update:
            return recipe
        parity = recipe.parity.model_copy(update={str(stage): tol.model_copy(update=update)})
        return recipe.model_copy(update={"parity": parity})

    @classmethod
    def recipe_file(cls) -> Path:
        """The target's default recipe: ``<name>.yaml`` beside the module that defines the class."""
        return Path(sys.modules[cls.__module__].__file__).resolve().with_name(f"{cls.name}.yaml")

    @classmethod
    def check_recipe(cls, recipe: Recipe) -> list[str]:
        """What in ``recipe`` this target cannot run, one message per problem naming the key.

        Called when a recipe is loaded (:func:`vitexport.targets.load_recipe`); the schema's own
        checks (opset within the contract...) have run already.
        """
        problems = []
        if cls.forbid_float16 and recipe.quantization.high_precision == "fp16":
            problems.append(f"quantization.high_precision: fp16 on the {cls.name} target, which runs no float16; use fp32")
        try:
            cls.Options.model_validate(recipe.target_options)
        except ValidationError as err:
            first = err.errors()[0]
            key = ".".join(["target_options", *(str(p) for p in first["loc"])])
            what = (f"unknown key (the {cls.name} target takes: {', '.join(cls.Options.model_fields) or 'none'})"
                    + did_you_mean(str(first["loc"][-1]), cls.Options.model_fields)
                    if first["type"] == "extra_forbidden" else f"{first['msg']} (got {first.get('input')!r})")
            problems.append(f"{key}: {what}")
        return problems

    # --- annotate: where Q/DQ goes, how it is written -----------------------------------------------
    def annotate(self, model: ir.Model) -> QuantPlan:
        """Decide which nodes get INT8 inputs (needs static shapes). Never modifies the graph."""
        return annotate(model, self)

    def for_model(self, model: ir.Model) -> "Target":
        """This target with ``quantization.asymmetric_activations: auto`` decided for ``model`` (itself otherwise):
        uint8 with a zero point where the graph has conv stages, int8 with zero point 0 on a transformer."""
        if self.spec.asymmetric_activations != "auto":
            return self
        spec = self.spec.model_copy(update={"asymmetric_activations": conv_stages(model)})
        decided = copy.copy(self)
        decided.spec, decided.recipe = spec, self.recipe.model_copy(update={"quantization": spec})
        return decided

    def encoding(self) -> Encoding:
        """How every Q/DQ pair of this target's plans is written."""
        symmetric = self.force_symmetric or not self.spec.asymmetric_activations
        return Encoding(symmetric, self.dedicated_pairs, self.int32_bias, 63 if self.reduce_range() else 127,
                        self.symmetric_attention)

    def reduce_range(self) -> bool:
        """7-bit weights: the recipe's choice; ``auto``: where this CPU's INT8 dot products saturate (no VNNI)."""
        rr = self.spec.reduce_range_weights
        return int8_dot_saturates() if rr == "auto" else bool(rr)

    def weight_range_note(self) -> str | None:
        """What ``quantization.reduce_range_weights: auto`` chose on this CPU and why (None: set explicitly)."""
        if self.spec.reduce_range_weights != "auto":
            return None
        isa = cpu_int8_isa()
        if self.reduce_range():
            return (f"weights: 7-bit (|q| <= 63), reduce_range_weights=auto on this CPU ({isa}): its u8 x s8 "
                    "int16 pair sums saturate on 8-bit weights; 7-bit weights run correctly on any CPU")
        return (f"weights: 8-bit, reduce_range_weights=auto on this CPU ({isa}: its INT8 kernels accumulate in int32); "
                "for a CPU without VNNI (AVX2) set quantization.reduce_range_weights=true, else its sums saturate")

    def per_channel(self) -> bool:
        """Weights quantized per output channel (the recipe's choice unless the target forces per tensor)."""
        return self.spec.per_channel_weights and not self.force_per_tensor

    def attention_ok(self, head: int, seq: int) -> tuple[bool, str]:
        """Whether an attention batched MatMul with this head size / sequence length is quantized,
        and why not."""
        if not self.spec.quantize_attention_matmuls:
            return False, "quantization.quantize_attention_matmuls is off"
        return True, ""

    def high_precision(self) -> str:
        """``fp16`` or ``fp32``: the type of the Q/DQ model's float parts (the recipe's, else the target's)."""
        return self.spec.high_precision or "fp32"

    # --- validate: what the runtime accepts ----------------------------------------------------------
    def rules(self) -> RuntimeRules:
        """The runtime's rules for a graph (``vitexport check`` runs them after the contract)."""
        return RuntimeRules()

    def validate(self, model: ir.Model) -> list[Violation]:
        """Rule violations of a Q/DQ model for this target's runtime (empty when it follows them)."""
        return self.rules().violations(model)

    # --- the INT8 gate ------------------------------------------------------------------------------
    @property
    def gate_config(self) -> SessionConfig:
        """The ONNX Runtime arithmetic that reproduces this target's (the INT8 gate and fallback run it)."""
        return LOW_MEMORY if self.runs_in_onnxruntime else QDQ_AS_FLOAT

    @property
    def arithmetic(self) -> str:
        """One line for the report: which arithmetic the INT8 gate ran."""
        if self.runs_in_onnxruntime:
            return f"INT8 parity: ONNX Runtime's fused integer kernels (the {self.name} target's runtime)"
        floats = ("float parts in FP16 as written (float16 tensors between ops, the 65504 range), FP32 islands in FP32"
                  if self.high_precision() == "fp16" else "float parts in FP32")
        return ("INT8 parity: Q/DQ evaluated as float ops in ONNX Runtime (session.disable_quant_qdq), "
                f"{floats}: the arithmetic the {self.name} runtime performs")

    def attention_note(self, summary: dict) -> str | None:
        """One line for the report: how attention's batched MatMuls run in the written file.

        Args:
            summary: :func:`vitexport.quantize.quantizer.attention_summary` of the written plan.
        Returns:
            The line, with this runtime's reason or cost when it has one; None without attn·V.
        """
        if not summary or not summary.get("pv"):
            return None
        if not summary["pv_float"]:
            line = (f"attention: Q·Kᵀ INT8 in {summary['qk_int8']}/{summary['qk']} layer(s), attn·V INT8 in all "
                    f"{summary['pv']}")
            return line + (f" ({self.attention_int8_why})" if self.attention_int8_why else "")
        line = (f"attention: attn·V kept in float in {len(summary['pv_float'])}/{summary['pv']} layer(s) "
                f"({summary['pv_float_macs_share']:.1%} of quantized MACs), as the attn·V line above decided")
        return line + (f"; {self.attention_float_cost}" if self.attention_float_cost else "")

    @property
    def where(self) -> str:
        """Where the artifact runs, for the report's summary."""
        return self.runs_on or self.description or self.name

    # --- what the target adds to a run --------------------------------------------------------------
    def write_artifacts(self, work_dir: Path, scales: dict[str, float], method: str) -> dict[str, Path]:
        """Files this target's toolchain reads that need the calibrated scales (none by default).

        Args:
            work_dir: the output folder.
            scales: activation tensor → int8 scale of the written model.
            method: the calibration method (some formats record it).
        Returns:
            Report key → written path.
        """
        return {}

    @classmethod
    def open_artifact(cls, path: Path) -> BaseRunner:
        """An inactive runner over ``path``, a file this target's runtime runs (its suffix is one of
        :attr:`artifact_suffixes`); activating it raises :class:`~vitexport.errors.BadInput` naming what
        is missing here to run it.

        Raises:
            BadInput: the target opens no such file.
        """
        raise BadInput(f"{path}: the {cls.name} target opens no {path.suffix or 'such'} file")

    def contribution(self) -> Contribution:
        """Files written beside the Q/DQ model and stages run after ``quantize_int8`` (none by default)."""
        return Contribution()

    def require_toolchain(self) -> None:
        """Raise :class:`~vitexport.errors.BadInput` naming how to install it when a tool this run's
        stages need is missing (none by default). ``vitexport export`` calls it before loading the
        model, so a run without its compiler stops in a second, not after the INT8 stage.
        """
