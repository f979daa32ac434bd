"""A target from another package: one module registering itself, one recipe beside it, found
through the ``vitexport.targets`` entry point, with no change to vitexport. It appears in
``vitexport targets``, exports the demo, writes its own file and ``vitexport check`` runs its rule."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vitexport.errors import BadInput
from vitexport.recipe import Recipe, TargetStage, read_recipe
from vitexport.targets import Target, registered_targets


TOY_MODULE = '''
"""A toy accelerator: symmetric per-tensor INT8 with shared Q/DQ pairs, a scale list beside the model."""
from pathlib import Path

import onnx_ir as ir

from vitexport.check.rules import RuntimeRules, qdq_scale, violation
from vitexport.recipe import TargetStage
from vitexport.runners import QDQ_AS_FLOAT, OnnxRuntimeRunner
from vitexport.stages import INT8_ONNX, Contribution, StageOutput
from vitexport.targets import Target, register_target


class ToyRules(RuntimeRules):
    RULES = RuntimeRules.RULES + ("toy.per_tensor",)

    def qdq(self, n: ir.Node, opset: int):
        out = super().qdq(n, opset)
        scale = qdq_scale(n)
        if scale is not None and scale.size > 1:
            out.append(violation("toy.per_tensor", n, "has a per-channel scale", "quantize per tensor"))
        return out


class ToySimulate:
    """A stage of the plug-in's own: its simulator runs the Q/DQ file as float Q/DQ ops."""
    name = "toy_simulate"
    needs_torch = False

    def enabled(self, recipe):
        return recipe.stages.quantize_int8.enabled and recipe.toggle(self.name).enabled

    def key(self, ctx):
        return None

    def run(self, ctx):
        return StageOutput(notes=["the toy simulator"])

    def runner(self, ctx, out):
        return OnnxRuntimeRunner(ctx.files[INT8_ONNX], name=self.name, config=QDQ_AS_FLOAT)


@register_target
class ToyTarget(Target):
    name = "toy"
    description = "Toy accelerator, per-tensor INT8 (a plug-in)"
    force_per_tensor = True
    target_stages = (TargetStage("toy_simulate"),)

    def contribution(self):
        return Contribution(stages=(ToySimulate(),))

    def rules(self):
        return ToyRules()

    def write_artifacts(self, work_dir: Path, scales, method):
        path = Path(work_dir) / "toy_scales.txt"
        path.write_text("".join(f"{name} {scale:.8g}\\n" for name, scale in sorted(scales.items())))
        return {"toy_scales": path}
'''

TOY_RECIPE = """\
# the toy accelerator takes opset 13 and no more
target: toy
export: {opset: 13}
contract: {max_opset: 13}
parity: {toy_simulate: {cosine_min: 0.97}}
"""


def _plugin(site: Path, entry: str) -> dict[str, str]:
    """A package installed the way pip leaves one (module + dist-info with entry points) under ``site``."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "toy_target.py").write_text(TOY_MODULE)
    (site / "toy.yaml").write_text(TOY_RECIPE)
    info = site / "toy_plugin-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[vitexport.targets]\n{entry}\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}


def _cli(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vitexport", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_plugin_target_lists_exports_the_demo_and_checks(tmp_path):
    env = _plugin(tmp_path / "site", "toy = toy_target")
    listed = _cli(env, "targets", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "toy        Toy accelerator, per-tensor INT8 (a plug-in)" in listed.stdout.splitlines()
    assert "orin" in listed.stdout  # vitexport's own stay

    out = tmp_path / "out"
    run = _cli(env, "export", "--target", "toy", "--out", out, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["passed"] and manifest["recipe"]["target"] == "toy" and "toy_scales.txt" in manifest["artifacts"]
    scales = (out / "toy_scales.txt").read_text().splitlines()
    assert scales and all(float(line.split()[1]) > 0 for line in scales)
    assert "build_engine.sh" not in manifest["artifacts"]  # no TensorRT here: the toy adds no engine
    details = {s["stage"]: s for s in json.loads((out / "parity.json").read_text())["stages"]}
    assert details["quantize_int8"]["details"]["quantize"]["artifacts"]["toy_scales"].endswith("toy_scales.txt")
    # its own stage ran after quantize_int8, gated with the contract its recipe gave the declared stage
    assert list(details)[-1] == "toy_simulate" and details["toy_simulate"]["passed"]
    assert details["toy_simulate"]["tolerance"]["cosine_min"] == 0.97
    misspelt = _cli(env, "export", "--target", "toy", "--out", tmp_path / "x", "--set", "stages.toy_simulat.enabled=false",
                    cwd=tmp_path)
    assert misspelt.returncode == 2 and "unknown key 'toy_simulat' in stages; did you mean 'toy_simulate'?" in misspelt.stderr

    check = _cli(env, "check", out / "model.int8.onnx", "--target", "toy", cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "(toy target)" in check.stdout


class _SimTarget(Target):
    """A plug-in's target with a stage of its own (not registered: read_recipe is handed it as the registry)."""

    name = "sim"
    target_stages = (TargetStage("simulate_npu"),)


def test_a_plugin_declares_its_stage_and_the_schema_stays_strict(tmp_path):
    """A stage a plug-in declares is a key of its target's recipes, with the declared contract's defaults,
    without an edit of vitexport.recipe; a misspelt key is still an error naming the nearest one, and
    another target's recipe does not take the stage."""
    path = tmp_path / "sim.yaml"
    path.write_text("target: sim\nparity: {simulate_npu: {cosine_min: 0.9}}\n")
    recipe = read_recipe(path, ["stages.simulate_npu.enabled=false"], targets={"sim": _SimTarget})
    assert recipe.stage_names()[-2:] == ("quantize_int8", "simulate_npu")
    tol = recipe.tolerance("simulate_npu")
    assert tol.cosine_min == 0.9 and tol.top1_agreement == 0.9  # the engine contract's other gates stay
    assert recipe.toggle("simulate_npu").enabled is False
    with pytest.raises(BadInput, match=r"^--set parity\.simulate_np\.cosine_min=0\.5: unknown key 'simulate_np' in "
                                       r"parity; did you mean 'simulate_npu'\?$"):
        read_recipe(path, ["parity.simulate_np.cosine_min=0.5"], targets={"sim": _SimTarget})
    other = tmp_path / "mine.yaml"
    other.write_text("target: cpu\nstages: {simulate_npu: {enabled: false}}\n")
    with pytest.raises(BadInput, match=rf"^{other}: unknown key 'simulate_npu' in stages"):
        read_recipe(other, targets=registered_targets())
    with pytest.raises(ValueError, match="unknown stage 'simulate_npu'"):
        Recipe(name="mine", target="cpu").tolerance("simulate_npu")
    built = _SimTarget(Recipe(name="x", target="sim")).recipe  # a recipe built in Python: the stage's defaults
    assert built.tolerance("simulate_npu").cosine_min == 0.98 and built.toggle("simulate_npu").enabled


def test_a_broken_plugin_costs_only_its_own_targets(tmp_path):
    env = _plugin(tmp_path / "site", "broken = no_such_module_anywhere")
    listed = _cli(env, "targets", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "orin" in listed.stdout and "broken" not in listed.stdout
    assert "entry point 'broken'" in listed.stderr and len(listed.stderr.strip().splitlines()) == 1
