"""Recipe validation: every shipped recipe loads; errors name the key path and the file."""
from __future__ import annotations

import pytest

from vitexport.errors import BadInput
from vitexport.recipe import CalibrationMethod, Recipe, available_recipes, load_recipe


def test_every_shipped_recipe_validates():
    names = available_recipes()
    assert {"orin", "orin-jp5", "npu", "cpu"} <= set(names)
    for name in names:
        r = load_recipe(name)
        assert isinstance(r, Recipe) and r.name == name
        assert r.export.opset <= r.contract.max_opset


@pytest.mark.parametrize("method", [m.value for m in CalibrationMethod])
def test_set_overrides_calibration_method(method):
    r = load_recipe("orin", [f"calibration.method={method}", "calibration.num_samples=7"])
    assert r.calibration.method.value == method
    assert r.calibration.num_samples == 7


def test_unknown_key_names_path_and_file():
    with pytest.raises(BadInput) as exc:
        load_recipe("orin", ["calibration.methd=minmax"])
    msg = str(exc.value)
    assert "calibration.methd" in msg and "unknown key" in msg and "orin.yaml" in msg


def test_unknown_key_in_file(tmp_path):
    bad = tmp_path / "mine.yaml"
    bad.write_text("target: orin\nquantization:\n  equalise: true\n")
    with pytest.raises(BadInput, match=r"mine\.yaml: quantization\.equalise: unknown key"):
        load_recipe(str(bad))


def test_wrong_type_names_key():
    with pytest.raises(BadInput, match=r"calibration\.num_samples"):
        load_recipe("npu", ["calibration.num_samples=lots"])


def test_wrong_enum_value():
    with pytest.raises(BadInput, match=r"calibration\.method.*'minmax'"):
        load_recipe("orin", ["calibration.method=kl"])


def test_unknown_target_lists_known_ones():
    with pytest.raises(BadInput, match=r"unknown target 'jetson'.*orin"):
        load_recipe("jetson")


def test_unknown_target_kind_in_file(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("target: hexagon\n")
    with pytest.raises(BadInput, match=r"x\.yaml: target"):
        load_recipe(str(f))


def test_parity_stage_names_are_checked(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("target: cpu\nparity:\n  quantise: {cosine_min: 0.9}\n")
    with pytest.raises(BadInput, match="quantise"):
        load_recipe(str(f))


def test_recipe_is_frozen():
    r = load_recipe("orin")
    with pytest.raises(Exception):
        r.calibration.num_samples = 3  # type: ignore[misc]


def test_override_must_be_key_value():
    with pytest.raises(BadInput, match="KEY=VALUE"):
        load_recipe("orin", ["calibration.method"])
