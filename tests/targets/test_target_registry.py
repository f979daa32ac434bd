"""The target registry: every registered target is complete, names are unique, and the repository's
``recipes/`` shows exactly the recipes the package ships."""
from __future__ import annotations

import pytest

from cli_helpers import ROOT
from vitexport.errors import BadInput
from vitexport.recipe import STAGE_NAMES, Recipe
from vitexport.targets import (
    DEFAULT_TARGET,
    Target,
    build_target,
    load_recipe,
    load_target,
    recipe_file,
    register_target,
    registered_targets,
    target_class,
)

TARGETS = list(registered_targets())


@pytest.mark.parametrize("name", TARGETS)
def test_every_target_is_complete(name):
    """Registered under its own name, described, its default recipe beside its module and naming it."""
    cls = target_class(name)
    assert issubclass(cls, Target) and cls.name == name and cls.description
    assert recipe_file(name) == cls.recipe_file() and cls.recipe_file().is_file()
    target = load_target(name)
    assert type(target) is cls and target.recipe.target == name and target.recipe.name == name
    assert target.rules().RULES[:3] == ("qdq.scale", "qdq.axis", "qdq.integer_path")
    assert target.high_precision() in ("fp16", "fp32") and target.arithmetic
    assert cls.check_recipe(target.recipe) == []  # its own recipe is one it can run


@pytest.mark.parametrize("name", TARGETS)
def test_a_target_declares_the_stages_it_contributes(name):
    """Each stage a target adds after quantize_int8 is one it declares (a key of its recipe's stages: and
    parity:), and its recipe has exactly the pipeline's stages and those."""
    target = load_target(name)
    declared = [s.name for s in target.target_stages]
    assert [s.name for s in target.contribution().stages] == declared
    assert target.recipe.stage_names() == (*STAGE_NAMES, *declared)
    assert all(target.recipe.toggle(s).enabled for s in declared)
    share = target.int8_share_stage
    assert share is None or share in target.recipe.stage_names()


@pytest.mark.parametrize("name", TARGETS)
def test_the_repositorys_recipes_are_the_packages(name):
    """``recipes/`` is for reading and copying; the package's files are the ones a run reads."""
    assert (ROOT / "recipes" / f"{name}.yaml").read_bytes() == recipe_file(name).read_bytes(), (
        f"recipes/{name}.yaml differs from {recipe_file(name)}: edit the package's file and copy it")


def test_recipes_folder_holds_only_targets_recipes():
    assert sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml")) == sorted(TARGETS)


def test_a_name_is_registered_once():
    class Again(Target):
        name = DEFAULT_TARGET

    with pytest.raises(ValueError, match=f"target '{DEFAULT_TARGET}' is registered already"):
        register_target(Again)
    assert target_class(DEFAULT_TARGET) is not Again
    held = target_class(DEFAULT_TARGET)
    assert register_target(held) is held  # the same class again is not a duplicate (a module imported twice)


def test_only_named_target_subclasses_register():
    class Nameless(Target):
        pass

    with pytest.raises(TypeError, match="has no 'name'"):
        register_target(Nameless)
    with pytest.raises(TypeError, match="Target subclass"):
        register_target(object)  # type: ignore[arg-type]


def test_unknown_target_lists_the_known_ones():
    with pytest.raises(BadInput, match=r"unknown target 'tpu'; known targets: " + ", ".join(TARGETS)):
        load_target("tpu")
    with pytest.raises(BadInput, match="unknown target 'tpu'"):
        build_target(Recipe(name="mine", target="tpu"))  # a recipe built in Python is checked when built


def test_a_target_refuses_a_recipe_it_cannot_run(tmp_path):
    """A target's cross-check runs at load time and names the key (here: float16 where none runs)."""
    no_f16 = [n for n in TARGETS if target_class(n).forbid_float16]
    assert no_f16
    f = tmp_path / "mine.yaml"
    f.write_text(f"target: {no_f16[0]}\nquantization: {{high_precision: fp16}}\n")
    with pytest.raises(BadInput, match=r"mine\.yaml: .*quantization\.high_precision: fp16 on the .* target"):
        load_recipe(str(f))


def test_the_default_target_is_registered():
    assert DEFAULT_TARGET in TARGETS and load_recipe().target == DEFAULT_TARGET


def test_unknown_target_option_names_the_set_and_the_nearest_option():
    with pytest.raises(BadInput) as err:
        load_target("rk3588", ["target_options.rout=rknn"])
    msg = str(err.value)
    assert "--set target_options.rout=rknn" in msg and "did you mean 'route'?" in msg
