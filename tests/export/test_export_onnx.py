"""export_onnx + simplify_onnx: static shapes, opset, parity, determinism, exporter fallback."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap

import onnx
import pytest
import torch
from export_helpers import adapter, feeds, image, leftovers, onnx_parity, op_counts, tiny_timm

from vitexport.errors import BadInput
from vitexport.export import export_onnx, simplify_onnx
from vitexport.targets import build_target, load_recipe, registered_targets


def _static_dims(model: onnx.ModelProto) -> list[list[int]]:
    return [[d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in [*model.graph.input, *model.graph.output]]


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("target", list(registered_targets()))
def test_every_recipe_exports_static_graph_with_parity(target, tmp_path):
    recipe = load_recipe(target)
    model, size = tiny_timm("vit")
    model = adapter(model)
    inputs = image(size, batch=2)
    raw, fp32 = tmp_path / "model.raw.onnx", tmp_path / "model.fp32.onnx"

    rep = export_onnx(model, inputs, raw, recipe.export)
    assert rep.exporter == "torchscript" and rep.opset == recipe.export.opset
    assert rep.to_dict()["exporter"] == "torchscript" and rep.notes
    srep = simplify_onnx(raw, fp32, build_target(recipe))
    assert srep.nodes_after < srep.nodes_before and srep.to_dict()["contract"] == "holds"

    for path in (raw, fp32):
        m = onnx.load(str(path))
        assert next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")) == recipe.export.opset
        assert [i.name for i in m.graph.input] == ["x"] and [o.name for o in m.graph.output] == ["output"]
        assert _static_dims(m) == [[2, 3, size, size], [2, 10]]
        # The pipeline gates with the recipe's tolerance; measure it here on other inputs than the example.
        res = onnx_parity(model, inputs, path, recipe.tolerance("export_onnx"), feeds(size))
        assert res, res.failed_check
    ops = op_counts(fp32)
    assert "Attention" not in ops and ops["Softmax"] == 2  # explicit attention, one per block
    assert ("LayerNormalization" in ops) != recipe.export.decompose_layernorm
    assert leftovers(tmp_path) == ["model.fp32.onnx", "model.raw.onnx"]


@pytest.mark.parametrize("kind,target", [("eva02", "orin"), ("eva02", "orin-jp5"), ("swin", "orin"), ("swin", "npu")])
def test_eva02_and_swin_export_with_parity(kind, target, tmp_path):
    # EVA-02 goes in unwrapped: torch.onnx.export(eva, (x,)) fails on is_causal bound as a tensor.
    recipe = load_recipe(target)
    model, size = tiny_timm(kind)
    inputs = image(size, batch=1)
    rep = export_onnx(model, inputs, tmp_path / "raw.onnx", recipe.export)
    simplify_onnx(tmp_path / "raw.onnx", tmp_path / "fp32.onnx", build_target(recipe))
    for name in ("raw.onnx", "fp32.onnx"):
        res = onnx_parity(model, inputs, tmp_path / name, recipe.tolerance("simplify"), feeds(size, batch=1))
        assert res, (name, res.failed_check, rep.notes)
    if recipe.export.decompose_layernorm:
        assert "LayerNormalization" not in op_counts(tmp_path / "fp32.onnx")


def _export_in_subprocess_script(target: str, out: str) -> str:
    return textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(__file__.rsplit('/', 1)[0])!r})
        from export_helpers import adapter, image, tiny_timm
        from vitexport.export import export_onnx, simplify_onnx
        from vitexport.targets import build_target, load_recipe
        r = load_recipe({target!r}); m, s = tiny_timm("vit")
        export_onnx(adapter(m), image(s), {out!r} + "/raw.onnx", r.export)
        simplify_onnx({out!r} + "/raw.onnx", {out!r} + "/fp32.onnx", build_target(r))
    """)


def _export_and_simplify(target: str, d) -> tuple[str, str]:
    recipe = load_recipe(target)
    model, size = tiny_timm("vit")  # a fresh model each time, same seed
    export_onnx(adapter(model), image(size), d / "raw.onnx", recipe.export)
    simplify_onnx(d / "raw.onnx", d / "fp32.onnx", build_target(recipe))
    return _sha(d / "raw.onnx"), _sha(d / "fp32.onnx")


@pytest.mark.parametrize("target", ["orin", "orin-jp5"])
def test_same_inputs_give_identical_bytes(target, tmp_path):
    assert _export_and_simplify(target, tmp_path / "a") == _export_and_simplify(target, tmp_path / "b")


@pytest.mark.slow
def test_identical_bytes_across_processes(tmp_path):
    # A fresh interpreter: no exporter counter, cache or id() carries over from this one.
    here = _export_and_simplify("orin-jp5", tmp_path / "a")
    d = tmp_path / "b"
    d.mkdir()
    subprocess.run([sys.executable, "-c", _export_in_subprocess_script("orin-jp5", str(d))], check=True, timeout=300)
    assert (_sha(d / "raw.onnx"), _sha(d / "fp32.onnx")) == here


@pytest.mark.slow
def test_falls_back_to_dynamo_and_says_so(tmp_path):
    # Without the explicit attention, TorchScript has no opset-13 form of SDPA; dynamo has (at
    # opset 18, converted down to 13).
    recipe = load_recipe("npu")
    spec = recipe.export.model_copy(update={"explicit_attention": False})
    model, size = tiny_timm("vit")
    model = adapter(model)
    inputs = image(size)
    rep = export_onnx(model, inputs, tmp_path / "raw.onnx", spec)
    assert rep.exporter == "dynamo"
    assert [a.exporter for a in rep.attempts] == ["torchscript", "dynamo"] and not rep.attempts[0].ok
    assert "scaled_dot_product_attention" in rep.attempts[0].error
    assert any("fell back to dynamo" in n for n in rep.notes) and any("converted to 13" in n for n in rep.notes)
    m = onnx.load(str(tmp_path / "raw.onnx"))
    assert next(o.version for o in m.opset_import if o.domain == "") == 13
    assert _static_dims(m) == [[2, 3, size, size], [2, 10]]
    res = onnx_parity(model, inputs, tmp_path / "raw.onnx", recipe.tolerance("export_onnx"), feeds(size))
    assert res, res.failed_check


class _Unexportable(torch.nn.Module):
    def forward(self, x):
        return torch.special.i1e(x)  # no TorchScript symbolic


def test_exporter_failure_names_the_operator_and_leaves_nothing(tmp_path):
    spec = load_recipe("orin").export.model_copy(update={"exporter": "torchscript"})
    with pytest.raises(BadInput) as err:
        export_onnx(_Unexportable(), {"x": torch.randn(1, 4)}, tmp_path / "raw.onnx", spec)
    assert "special_i1e" in str(err.value) and "torchscript" in str(err.value)
    assert err.value.exit_code == 2
    assert leftovers(tmp_path) == []


def test_simplify_off_still_checks_the_contract(tmp_path):
    recipe = load_recipe("orin-jp5", ["export.simplify=false"])
    model, size = tiny_timm("vit")
    rep = export_onnx(adapter(model), image(size), tmp_path / "raw.onnx", recipe.export)
    srep = simplify_onnx(tmp_path / "raw.onnx", tmp_path / "fp32.onnx", build_target(recipe))
    assert not srep.simplified and srep.nodes_after == srep.nodes_before and rep.exporter == "torchscript"
    assert onnx_parity(adapter(model), image(size), tmp_path / "fp32.onnx", recipe.tolerance("simplify"))


def test_caller_model_is_not_modified(tmp_path):
    model, size = tiny_timm("vit")
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    export_onnx(model, image(size), tmp_path / "raw.onnx", load_recipe("orin-jp5").export)
    assert model.training and all(m.training for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
