"""The lint (vitexport.check.lint) on planted faults: each rule fires with its severity and names
the node or tensor; ``vitexport check`` prints warnings and exits 0, exits 2 on a lint error."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from planted import linear, plant, plant_nameless_node, plant_unused_initializer, save

from vitexport.check import LINT_RULES, Severity, check_file, lint_model
from vitexport.cli import main
from vitexport.targets import load_target

CHECK_DOC = Path(__file__).resolve().parents[2] / "docs" / "check.md"

# (fault planted in linear(), rule, the name its finding carries)
CASES = [
    ("dead_node", "lint.dead_node", "orphan_relu"),
    ("dead_value_info", "lint.dead_value_info", "removed_tensor"),
    ("unused_input", "lint.unused_input", "attention_mask"),
    ("duplicate_node_name", "lint.duplicate_node_name", "act_q"),
    ("input_shadows_initializer", "lint.input_shadows_initializer", "w_q"),
    ("float64", "lint.float64", "offset64"),
    ("requantize", "lint.qdq_noop", "again_q"),
    ("qdq_output", "lint.qdq_noop", "out_q"),
]


def _check(tmp_path, m, target: str = "cpu"):
    return check_file(save(m, tmp_path / "m.onnx"), load_target(target))


def test_a_clean_graph_has_no_finding(tmp_path):
    result = _check(tmp_path, linear())
    assert result.violations == [] and set(LINT_RULES) <= set(result.rules)


@pytest.mark.parametrize("fault,rule,name", CASES, ids=[c[0] for c in CASES])
def test_each_planted_fault_is_reported_by_name(fault, rule, name, tmp_path):
    result = _check(tmp_path, plant(fault, linear()))
    found = [v for v in result.violations if v.rule.startswith("lint.")]
    assert [v.rule for v in found] == [rule] * len(found) and found, result.lines()
    assert any(f"'{name}'" in v.subject for v in found), result.lines()
    assert all(v.severity == LINT_RULES[rule] for v in found)
    assert bool(result) == (LINT_RULES[rule] is Severity.warning)


def test_float64_names_where_it_enters_not_every_tensor(tmp_path):
    result = _check(tmp_path, plant("float64", linear()))
    subjects = [v.subject for v in result.violations if v.rule == "lint.float64"]
    assert subjects == ["initializer 'offset64'", "node 'to_double' (Cast)"]  # not add64, which only carries it


def test_planted_unused_initializer_and_nameless_node_are_named_and_exit_0(tmp_path, capsys):
    path = save(plant_nameless_node(plant_unused_initializer(linear())), tmp_path / "edited.onnx")
    assert main(["check", path, "--target", "orin"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == ("edited.onnx: warning: initializer 'stale_scale' is read by no node that reaches an output "
                      "[lint.unused_initializer]; hint: " + out[0].split("; hint: ")[1])
    assert out[1].startswith("edited.onnx: warning: node #4 (Identity) writing 'y_out' has no name [lint.node_name]")
    assert out[2].endswith("(orin target) with 2 warning(s) (lint.node_name, lint.unused_initializer)")


def test_a_lint_error_exits_2(tmp_path, capsys):
    path = save(plant("duplicate_node_name", linear()), tmp_path / "dup.onnx")
    assert main(["check", path, "--target", "cpu"]) == 2
    out = capsys.readouterr().out
    assert "dup.onnx: node 'act_q' names 2 nodes [lint.duplicate_node_name]" in out


def test_inline_constants_over_2gb_are_an_error():
    """An in-memory model whose weights protobuf could not serialise (a broadcast view: 2 GiB of
    float32 that take no memory), and the same weights kept as external data."""
    x = ir.Value(name="x", shape=ir.Shape([1]), type=ir.TensorType(ir.DataType.FLOAT))
    huge = ir.Value(name="huge", const_value=ir.Tensor(np.broadcast_to(np.float32(0), (2**29,)), name="huge"))
    node = ir.node("Gather", [huge, x], name="gather")
    graph = ir.Graph([x], node.outputs, nodes=[node], initializers=[huge], opset_imports={"": 17})
    found = [v for v in lint_model(ir.Model(graph, ir_version=8)) if v.rule == "lint.inline_2gb"]
    assert len(found) == 1 and found[0].severity is Severity.error and "'huge' 2.15 GB" in found[0].problem


def test_every_rule_is_in_the_check_page_with_its_severity():
    text = CHECK_DOC.read_text()
    for rule, severity in LINT_RULES.items():
        assert re.search(rf"`{re.escape(rule)}`\s*\|\s*{severity.value}", text), rule
