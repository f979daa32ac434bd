"""``vitexport check`` as a user runs it, and on every file vitexport itself writes."""
from __future__ import annotations

import pytest
from onnx_census import assert_clean
from planted import linear, save

from cli_helpers import run_cli
from vitexport import api
from vitexport.errors import BadInput


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
