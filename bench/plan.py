"""What one bench run measures: ``--quick`` (a few minutes) or the full benchmark (~45 min on 2 cores).

A plan is data: which models, which calibration methods and sample counts for the headline, which
extra cells of the calibration-memory grid, how many latency repeats. :mod:`bench.run` walks it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Plan", "GridCell", "quick_plan", "full_plan", "PLAIN_METHODS", "VX_METHODS", "CasePlan", "PATHS", "cases_plan", "cases_quick_plan"]

# The methods each path offers. ONNX Runtime's quantize_static has no MSE calibrator.
VX_METHODS = ("minmax", "percentile", "entropy", "mse")
PLAIN_METHODS = ("minmax", "percentile", "entropy")


@dataclass(frozen=True)
class GridCell:
    """One extra calibration-memory measurement: path (``vx`` | ``plain``), method, samples."""

    path: str
    method: str
    num_samples: int


@dataclass(frozen=True)
class Plan:
    """A bench run.

    Attributes:
        name: ``quick`` | ``full``.
        models: model keys (:data:`bench.models.MODELS`), in order.
        methods: calibration methods of the headline, run by both paths.
        num_samples: calibration samples of the headline.
        grid: model key → extra calibration-memory cells (the headline cells are not repeated).
        latency_runs: model key → timed runs (after ``warmup``); default ``default_runs``.
        heldout: at most this many held-out samples per timm model (the demo keeps its split); they
            are vitexport's parity data too, so they set much of its run time.
        timeout_s: a measurement still running after this long is killed (a hang must not eat the run).
        cpu_target: also export with vitexport's ``cpu`` recipe for latency (ONNX Runtime's own
            QDQ layout preference), beside the ``orin`` recipe every figure uses.
        max_calib: the largest calibration set any cell draws (the data written per model).
    """

    name: str
    models: tuple[str, ...]
    methods: tuple[str, ...]
    num_samples: int
    grid: dict[str, tuple[GridCell, ...]] = field(default_factory=dict)
    latency_runs: dict[str, int] = field(default_factory=dict)
    default_runs: int = 20
    warmup: int = 3
    cpu_target: bool = False
    timeout_s: float = 2400.0
    heldout: int | None = None

    @property
    def max_calib(self) -> int:
        ns = [self.num_samples, *(c.num_samples for cells in self.grid.values() for c in cells)]
        return max(ns)

    def runs(self, model: str) -> int:
        return self.latency_runs.get(model, self.default_runs)


def quick_plan() -> Plan:
    """Demo, ViT-Tiny and the outlier ViT-Tiny; 32 samples; MinMax and Percentile; few repeats."""
    return Plan(
        name="quick",
        models=("demo", "vit_tiny", "vit_tiny_outlier"),
        methods=("minmax", "percentile"),
        num_samples=32,
        latency_runs={"demo": 100},
        default_runs=10,
        warmup=2,
        timeout_s=600.0,
        heldout=32,
    )


def full_plan(complete_grid: bool = False) -> Plan:
    """Every model at 128 samples, and ViT-B/16's calibration memory at 32 / 128 / 256 samples.

    The default grid holds what the issue's claims need in ~45 min on 2 cores: every vitexport method
    at 256 samples (the "under 2.5 GB whatever the method" claim) and at 32 for percentile (memory vs
    samples), the plain path's MinMax at 32 and 256 and its Percentile / Entropy at 32 (their memory
    grows with the samples: 128 / 256 follow). ``complete_grid``: every method at 32, 128 and 256.
    The plain path's runs that a smaller sample count already pushed over the memory cap are not
    started again at a larger count.
    """
    if complete_grid:
        cells = [GridCell(path, method, n) for n in (32, 128, 256)
                 for path, methods in (("vx", VX_METHODS), ("plain", PLAIN_METHODS)) for method in methods]
    else:
        cells = [GridCell("vx", "percentile", 32), GridCell("plain", "minmax", 32), GridCell("plain", "percentile", 32),
                 GridCell("plain", "entropy", 32), GridCell("vx", "entropy", 128), GridCell("vx", "mse", 128),
                 *(GridCell("vx", m, 256) for m in VX_METHODS), GridCell("plain", "minmax", 256)]
    return Plan(
        name="full",
        models=("demo", "vit_tiny", "vit_tiny_outlier", "vit_small", "vit_base"),
        methods=("minmax", "percentile"),
        num_samples=128,
        grid={"vit_base": tuple(cells)},
        latency_runs={"demo": 200, "vit_tiny": 50, "vit_tiny_outlier": 30, "vit_small": 30, "vit_base": 15},
        default_runs=20,
        warmup=3,
        cpu_target=True,
    )


# --- issue 11: vitexport beside its peers on the cases of bench.cases ---------------------------------

#: Every tool of the peers plan, in table order: vitexport (orin defaults), NNCF, ModelOpt (default
#: FP16 islands, and ``--high_precision_dtype fp32``), plain ``quantize_static`` (MinMax).
PATHS = ("vx", "nncf", "mo_fp16", "mo_fp32", "plain")


@dataclass(frozen=True)
class CasePlan:
    """A run of issue 11's side-by-side bench (:mod:`bench.casebench`).

    Attributes:
        name: ``peers`` | ``peers-quick`` (the records file and the report's title).
        cases: case keys (:data:`bench.cases.CASES`), in order.
        num_samples: calibration samples every tool gets in the headline.
        paths: the tools measured (:data:`PATHS`).
        extra: case → extra (path, samples) cells, measured for memory and quantize time (and scored).
        sizes: case → ``parity`` / ``score`` sample counts where the data is synthetic (ViT-B).
        latency_runs: case → timed runs; default ``default_runs``.
        timeout_s: a measurement still running after this long is killed.
        tiny: the training scripts' ``--tiny`` settings (tests only).
        case_paths: case → the tools measured on it (default: all of ``paths``).
    """

    name: str
    cases: tuple[str, ...]
    num_samples: int = 128
    paths: tuple[str, ...] = PATHS
    extra: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    sizes: dict[str, dict[str, int]] = field(default_factory=dict)
    latency_runs: dict[str, int] = field(default_factory=dict)
    default_runs: int = 20
    warmup: int = 3
    timeout_s: float = 2400.0
    tiny: bool = False
    case_paths: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def paths_of(self, case: str) -> tuple[str, ...]:
        """The tools measured on ``case`` (all of :attr:`paths` unless :attr:`case_paths` cuts them)."""
        return tuple(p for p in self.paths if p in self.case_paths.get(case, self.paths))

    def max_calib(self, case: str) -> int:
        return max([self.num_samples, *(n for _, n in self.extra.get(case, ()))])

    def runs(self, case: str) -> int:
        return self.latency_runs.get(case, self.default_runs)

    @property
    def models(self) -> tuple[str, ...]:  # the name bench.run's --models filter uses
        return self.cases


#: parity / score sizes of a generated case: the gate scores more samples than the fallback's 32
#: selection samples (issue 19: predict the parity set's tail); ViT-B width costs 4× per sample
GEN_SIZES = {"S": {"parity": 256, "score": 256}, "B": {"parity": 128, "score": 128}}


def gen_cases(seeds) -> tuple[tuple[str, ...], dict[str, dict[str, int]]]:
    """Case keys and sizes of the generated cases of ``seeds`` (:mod:`bench.gen`)."""
    from .gen import draw

    keys = tuple(f"gen{s:02d}" for s in seeds)
    return keys, {k: GEN_SIZES[draw(s).width] for k, s in zip(keys, seeds)}


def cases_plan() -> CasePlan:
    """``make bench``: every case, every tool, 128 calibration samples; ViT-B/16 at 256 for vitexport
    and NNCF too (issue 11: whole process ≤ 2.5 GB, quantize stage no slower than NNCF's); the generated
    distribution (issue 19) with vitexport, NNCF and plain ``quantize_static`` (ModelOpt collapses on
    outlier models — measured on the hand-made cases — and would double the run)."""
    keys, sizes = gen_cases(range(16))
    return CasePlan(
        name="peers",
        cases=("demo", "digits_vit", "text_encoder", "photo_swin", "doc_encoder", "minilm", "mpnet", "vit_base_outlier",
               "shapes_yolos", "shapes_segformer", "photo_mobilevit", "photo_effvit", *keys),
        extra={"vit_base_outlier": (("vx", 256), ("nncf", 256))},
        sizes={"vit_base_outlier": {"parity": 32, "score": 64}, "minilm": {"parity": 256, "score": 512},
               "mpnet": {"parity": 256, "score": 512}, **sizes},
        latency_runs={"demo": 100, "digits_vit": 50, "text_encoder": 50, "photo_swin": 50, "doc_encoder": 50,
                      "minilm": 20, "mpnet": 10, "vit_base_outlier": 10,
                      "photo_mobilevit": 50, "photo_effvit": 50},
        # the dense cases (issue 29): vitexport beside NNCF and plain quantize_static, scored by their task
        case_paths={k: ("vx", "nncf", "plain") for k in (*keys, "shapes_yolos", "shapes_segformer")},
    )


def cases_quick_plan() -> CasePlan:
    """``make bench-quick``: the demo and the text encoder, 32 samples, every tool (a few minutes once
    the text encoder is trained and cached)."""
    return CasePlan(name="peers-quick", cases=("demo", "text_encoder"), num_samples=32, default_runs=10,
                    warmup=2, timeout_s=900.0)
