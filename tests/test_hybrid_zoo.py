"""The hybrid zoo on real compilers (issue 28 item 7): the conv-attention hybrids and dense models of
``tests/passes/zoo_families.py`` through ``vitexport export`` on ``rk3588`` (rknn-toolkit2's compiler and
simulator, in its venv) and ``openvino`` (its CPU plugin), the way a user runs it. (Their ``orin`` runs are
the export zoo's, ``tests/test_export_zoo.py``.)

Per model and target: exit 0 with the target's INT8 share of GEMM/Conv multiply-accumulates, measured from
what the backend reports (RKNN's op table, OpenVINO's runtime precisions), at or above its floor; or the
verdict its case states: exit 1 at the INT8 gate, only where the case says why (zoo_init's random weights:
the same misses as on orin, ``INT8_MISS``), with the float layers named; or exit 2 naming the compiler's
crash. ``make test-zoo`` runs it; ``pytest -rP`` prints each model's share.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "passes"))

from test_export_zoo import _QUICK, _check_terminal, _model_args  # noqa: E402
from vitexport.cli import main  # noqa: E402
from vitexport.targets import target_class  # noqa: E402
from vitexport.targets.rknn.client import rknn_available  # noqa: E402
from zoo_families import ZOO  # noqa: E402

#: ≥ 12 hybrid and conv-attention families (issue 28's list where the zoo has them) and the two dense models
HYBRIDS = ("timm_fastvit", "timm_mobilevit_xxs", "timm_mobilevitv2", "timm_efficientvit_b0", "timm_efficientvit_m0",
           "timm_efficientformer", "timm_efficientformerv2", "timm_levit", "timm_edgenext", "timm_tiny_vit",
           "timm_coat_lite", "timm_pit", "timm_nextvit", "hf_mobilevit", "hf_segformer", "hf_dpt")
TARGETS = ("rk3588", "openvino")
#: (case, target) → (exit, what its error line says) where it is not exit 0 or an INT8 miss
VERDICTS: dict[tuple[str, str], tuple[int, str]] = {
    # its INT8 passes the gate since the fallback orders a conv network's layers by the outputs (0.990), and RKNN then
    # segfaults on the laid-out file: the crash CRASHES_BEHIND_THE_GATE lists, which an INT8 miss (0.978) hid before
    ("timm_nextvit", "rk3588"): (2, "rknn-toolkit2 crashed (SIGSEGV) in stage build (compiler pass OpEmit)"),
}
#: INT8 misses of zoo_init's random weights beyond orin's (INT8_MISS): (case, target) → why
MISSES: dict[tuple[str, str], str] = {
    ("timm_nextvit", "openvino"): "INT8 cosine 0.968-0.970 with the per-node fallback order, just under the 0.98 gate "
                                  "(exit 0 at 99.3 % INT8 with the order by the outputs, 2026-12-07)",
    ("timm_efficientformerv2", "rk3588"): "RKNN's INT8 on the gate's edge: cosine 0.978-0.984 at build_engine between runs",
}
#: where an INT8 miss may show: ONNX Runtime's run of the Q/DQ file, RKNN's build and its simulator
_INT8_STAGES = ("quantize_int8", "build_engine", "simulate")
_CASES = {c.name: c for c in ZOO}


def _available(target: str) -> bool:
    if target == "rk3588":
        return rknn_available()
    return pytest.importorskip("openvino") is not None


@pytest.mark.zoo
@pytest.mark.parametrize("name,target", [pytest.param(n, t, id=f"{n}-{t}") for n in HYBRIDS for t in TARGETS])
def test_hybrid_zoo(name: str, target: str, tmp_path, monkeypatch, capfd):
    if not _available(target):
        pytest.skip(f"{target}'s toolchain is not installed (make setup-rknn)")
    case = _CASES[name]
    monkeypatch.setenv("VITEXPORT_MEMORY_LIMIT", "16G")
    out = tmp_path / "out"
    args = _model_args(case, tmp_path)
    capfd.readouterr()
    rc = main(["export", "--target", target, *args, "--out", str(out), *_QUICK])
    cap = capfd.readouterr()
    _check_terminal(cap.out, cap.err)
    want, says = VERDICTS.get((name, target), (0, ""))
    why = case.int8 or MISSES.get((name, target))
    if rc == 2 or (rc == 1 and want == 1 and says in cap.err):  # the verdict the case states
        assert rc == want and says in cap.err, f"{name} on {target}: exit {rc}\n{cap.err[-1500:]}"
        print(f"hybrid zoo {name}-{target}: exit {rc} ({says})")
        return
    assert rc == 0 or (rc == 1 and why), f"{name} on {target}: exit {rc} and the case gives no reason\n{cap.err[-1500:]}"
    doc = json.loads((out / "parity.json").read_text())
    stages = {s["stage"]: s for s in doc["stages"]}
    if rc == 1:  # a random-weight INT8 miss: at an INT8 gate, its figures below their limits, the layers named
        assert doc["failed_stage"] in _INT8_STAGES, doc["failed_stage"]
        failed = [c for c in stages[doc["failed_stage"]]["checks"] if not c["passed"]]
        assert failed and all(c["metric"].startswith("cosine_min") and c["value"] < c["limit"] for c in failed)
        assert "the fallback kept" in cap.err
        print(f"hybrid zoo {name}-{target}: exit 1 ({why}): {failed[0]['metric']} {failed[0]['value']:.4f}")
        return
    share_stage = target_class(target).int8_share_stage
    share = next(c for c in stages[share_stage]["checks"] if c["metric"] == "int8_share")
    assert share["passed"] and share["value"] >= target_class(target).int8_share_min
    if target == "rk3588":  # no compute op on the CPU, and the simulator's parity gated
        assert next(c for c in stages[share_stage]["checks"] if c["metric"] == "cpu_compute_ops")["value"] == 0
        assert stages["simulate"]["passed"]
    print(f"hybrid zoo {name}-{target}: exit 0, INT8 share {share['value']:.3f}")


def test_the_hybrid_zoo_holds_twelve_hybrid_families_and_the_dense_models():
    assert set(HYBRIDS) <= set(_CASES)
    assert len([n for n in HYBRIDS if n not in ("hf_segformer", "hf_dpt")]) >= 12
    assert {k for k, _ in VERDICTS} | {k for k, _ in MISSES} <= set(HYBRIDS)


#: where RKNN 2.5.0 still crashes once the INT8 gates let a model through (docs/bench.md narrows each down)
CRASHES_BEHIND_THE_GATE = {
    "timm_nextvit": "rknn-toolkit2 crashed (SIGSEGV) in stage build (compiler pass OpEmit)",
}
_NO_GATES = [f"parity.{stage}.{key}=0" for stage in _INT8_STAGES for key in ("cosine_min", "top1_agreement")]


@pytest.mark.zoo
@pytest.mark.parametrize("name", HYBRIDS)
def test_behind_its_int8_gate_each_hybrid_compiles_on_rk3588(name: str, tmp_path, monkeypatch, capfd):
    """The INT8 gates at 0, so that a model whose random-weight INT8 misses its gate still reaches RKNN: a crash
    hidden behind an INT8 miss shows here. Each compiles with every compute op on the NPU at the target's INT8
    share, or is one of the crashes docs/bench.md narrows down."""
    if not _available("rk3588"):
        pytest.skip("rk3588's toolchain is not installed (make setup-rknn)")
    monkeypatch.setenv("VITEXPORT_MEMORY_LIMIT", "16G")
    out = tmp_path / "out"
    sets = [a for s in _NO_GATES for a in ("--set", s)]
    capfd.readouterr()
    rc = main(["export", "--target", "rk3588", *_model_args(_CASES[name], tmp_path), "--out", str(out), *_QUICK, *sets])
    err = capfd.readouterr().err
    if name in CRASHES_BEHIND_THE_GATE:
        assert rc == 2 and CRASHES_BEHIND_THE_GATE[name] in err, f"{name}: exit {rc} (a crash fixed? drop it)\n{err[-800:]}"
        return
    assert rc == 0, f"{name}: exit {rc}\n{err[-1500:]}"
    stages = {s["stage"]: s for s in json.loads((out / "parity.json").read_text())["stages"]}
    checks = {c["metric"]: c["value"] for c in stages["build_engine"]["checks"]}
    assert checks["cpu_compute_ops"] == 0 and checks["int8_share"] >= target_class("rk3588").int8_share_min, checks
    print(f"hybrid zoo {name} behind its gate: INT8 share {checks['int8_share']:.3f}, "
          f"simulator {stages['simulate']['metrics']['cosine_min']:.4f}")
