"""``vitexport check`` as a user runs it, and on every file vitexport itself writes."""
from __future__ import annotations

import pytest
from onnx_census import assert_clean
from planted import linear, save

from cli_helpers import run_cli
from vitexport import api
from vitexport.check import CheckResult, Severity, Violation
from vitexport.check.violation import FULL_LIST_MAX
from vitexport.errors import BadInput
from vitexport.targets import registered_targets


@pytest.mark.slow
def test_check_exits_2_with_one_line_per_violation(tmp_path):
    path = save(linear(zero_point=3, weight_axis=0), tmp_path / "hand_edited.onnx")
    proc = run_cli("check", path, "--target", "orin")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert [ln.split(" [")[-1].split("]")[0] for ln in lines] == ["orin.int8", "orin.int8", "orin.per_channel"]
    assert all(ln.startswith("hand_edited.onnx: node '") for ln in lines)
    assert proc.stderr == ""


@pytest.mark.slow
def test_check_exits_0_on_a_clean_file_and_takes_overrides(tmp_path):
    path = save(linear(opset=13, weight_axis=None), tmp_path / "clean.onnx")
    proc = run_cli("check", path, "--target", "npu", "--set", "contract.max_opset=13")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == f"clean.onnx: passes the {len(api.check(path, 'npu').rules)} rules of recipes/npu.yaml (npu target)"


@pytest.mark.slow
def test_check_bad_input_is_one_line(tmp_path):
    proc = run_cli("check", str(tmp_path / "absent.onnx"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"vitexport: error: {tmp_path / 'absent.onnx'}: no such ONNX file"]
    with pytest.raises(BadInput, match="unknown target 'tpu'"):
        api.check(tmp_path / "absent.onnx", "tpu")


def test_a_recipe_file_is_named_as_given(tmp_path):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("target: npu\nexport: {opset: 13}\ncontract: {max_opset: 13, allowed_ops: [MatMul]}\n")
    path = save(linear(opset=13, weight_axis=None), tmp_path / "m.onnx")
    result = api.check(path, str(recipe))
    assert {v.rule for v in result.errors} == {"contract.allowed_ops"}
    assert all(f"of {recipe}" in line for line in result.lines())


@pytest.mark.slow
def test_the_demo_runs_files_pass(demo_run):
    """model.fp32 / int8 of the bundled demo on orin (the session's shared export); the other
    recipes' demo files are checked where tests/test_cli.py exports them."""
    out, proc = demo_run
    assert proc.returncode == 0, proc.stderr
    for name in ("model.fp32.onnx", "model.int8.onnx"):
        result = api.check(out / name, "orin")
        assert result and not result.warnings, result.lines()  # the int8 file held 33 dead scales before issue 23
    for name in ("model.raw.onnx", "model.fp32.onnx", "model.int8.onnx"):
        assert_clean(out / name)
    proc = run_cli("check", str(out / "model.int8.onnx"), "--target", "orin")
    assert proc.returncode == 0 and "passes" in proc.stdout, proc.stdout + proc.stderr


def _result(groups: int, per_group: int, warnings: int = 0) -> CheckResult:
    bad = [Violation(f"rule.{g}", f"node 'n{g}_{i}' (Op{g})", f"breaks rule {g}", f"fix {g}")
           for g in range(groups) for i in range(per_group)]
    lint = [Violation("lint.dead", f"initializer 'w{i}'", "is read by no node", "drop it", severity=Severity.warning)
            for i in range(warnings)]
    return CheckResult("m.onnx", "recipes/t.yaml", "t", ("rule.0",), bad + lint)


def test_many_violations_print_a_summary_by_rule_and_v_prints_all():
    result = _result(groups=3, per_group=40, warnings=5)
    lines = result.report()
    assert len(lines) == 1 + 4 * 3 + 2 and lines[0].startswith("m.onnx: 120 violation(s) of recipes/t.yaml"), lines
    assert "  [rule.1] 40 error(s): node 'n1_0' (Op1) breaks rule 1" in lines
    assert "    also node 'n1_1' (Op1), node 'n1_2' (Op1) and 37 more" in lines
    assert lines.count("    hint: fix 1") == 1 and "  [lint.dead] 5 warning(s): initializer 'w0' is read by no node" in lines
    assert lines[-2].startswith("what to do: ") and "vitexport export --target t" in lines[-2]
    assert lines[-1] == "`vitexport -v check` lists all 125, one line each"
    assert result.report(full=True) == result.lines() + [result.summary()]  # 125 lines and the verdict


def test_a_summary_stays_under_40_lines_however_many_rules_break():
    lines = _result(groups=60, per_group=2).report()
    assert len(lines) <= 40 and "  ... and 50 more group(s), 100 violation(s)" in lines, lines


def test_a_few_violations_print_one_line_each():
    result = _result(groups=2, per_group=FULL_LIST_MAX // 2)
    assert result.report() == result.lines()
    passing = _result(groups=0, per_group=0, warnings=FULL_LIST_MAX + 1)  # only warnings: it passes
    assert passing and passing.report()[0].startswith("m.onnx: passes")
    assert not any(ln.startswith("what to do") for ln in passing.report())


@pytest.mark.slow
def test_another_targets_int8_file_is_a_short_report(demo_run):
    """The demo's Orin INT8 file checked against every other target: once 333 lines (one per float16
    constant) against the NPU's recipe and two onnx-ir tracebacks on stderr against rk3588's."""
    out, proc = demo_run
    assert proc.returncode == 0, proc.stderr
    path = out / "model.int8.onnx"
    for target in registered_targets():
        if target == api.check(path).target:
            continue
        expected = api.check(path, target)
        proc = run_cli("check", str(path), "--target", target)
        shown = proc.stdout + proc.stderr
        assert proc.returncode == (0 if expected else 2), (target, shown)
        assert len(shown.splitlines()) <= 40 and "Traceback" not in shown and proc.stderr == "", (target, shown)
        if len(expected.violations) > FULL_LIST_MAX:
            assert f"lists all {len(expected.violations)}" in proc.stdout, (target, shown)
    proc = run_cli("check", str(path), "--target", "npu", "-v")
    assert proc.returncode == 2 and len(proc.stdout.splitlines()) == len(api.check(path, "npu").violations) + 1
