"""Registries (passes, attention adapters), a user-registered adapter, and what a report says."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from passes_zoo import UntraceableAttention, UntraceableModel, export_onnx, float_mask_adds, run_onnx, softmax_mask_producers
from vitexport.parity.metrics import compare
from vitexport.passes import (
    ATTENTION_ADAPTERS,
    PASSES,
    AttentionAdapter,
    PassReport,
    QKVLayout,
    fuse_linears,
    fuse_qkv,
    get_pass,
    install_forward,
    mask_to_where,
    project_qkv,
    register_attention_adapter,
    register_pass,
    unregister_attention_adapter,
    where_logits,
)
from vitexport.passes.base import SkippedSite
from vitexport.recipe import StageToggle, Tolerance
from vitexport.sources import OutputAdapter


def test_pass_registry():
    assert {"freeze_layernorm", "mask_to_where", "fuse_qkv"} <= set(PASSES)
    for name, fn in PASSES.items():
        assert get_pass(name) is fn and fn.name == name
    with pytest.raises(ValueError, match="already registered"):
        register_pass("fuse_qkv")(lambda *a, **k: None)
    with pytest.raises(KeyError, match="unknown pass"):
        get_pass("nope")


def test_adapter_registry_refuses_duplicates_and_strangers():
    # one built-in adapter: nn.MultiheadAttention does its math inside one call nothing can see into
    assert set(ATTENTION_ADAPTERS) == {"torch_multihead_attention"}
    with pytest.raises(ValueError, match="already registered"):
        register_attention_adapter(ATTENTION_ADAPTERS["torch_multihead_attention"])
    with pytest.raises(TypeError):
        register_attention_adapter(object())  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        unregister_attention_adapter("nope")


def _untraceable_forward(self, x):
    # the user's own rewritten forward, written with vitexport's helpers
    q, k, v = (self.split(t) for t in project_qkv(self, x, ("q", "k", "v")))
    attn = (q @ k.transpose(-2, -1)) * self.scale
    if getattr(self, "vitexport_where", False):
        attn = where_logits(attn, self.keep)  # boolean, True = may attend
    else:
        attn = attn.masked_fill(~self.keep, torch.finfo(attn.dtype).min)
    return self.merge(attn.softmax(-1) @ v)


class UntraceableAdapter(AttentionAdapter):
    name = "test_untraceable"

    def matches(self, module):
        return type(module) is UntraceableAttention

    def qkv_layout(self, module):
        return QKVLayout.fused("fused by vitexport") if hasattr(module, "vitexport_qkv_split") else QKVLayout.separate("q", "k", "v")

    def mask_of(self, module, args, kwargs):
        return module.keep

    def to_where(self, module, *, mask_bias=False):
        module.vitexport_where = True
        install_forward(module, _untraceable_forward)
        return module

    def fuse_qkv(self, module):
        fuse_linears(module, ("q", "k", "v"))
        install_forward(module, _untraceable_forward)
        return module


def test_user_adapter_wins_over_the_generic_path():
    torch.manual_seed(0)
    model = OutputAdapter(UntraceableModel().eval(), ["x"], keyword=False)
    inputs = {"x": torch.randn(2, 10, 32)}
    # torch.finfo(attn.dtype) stopped a symbolic trace; the observed run sees the masked_fill anyway
    _, before = mask_to_where(model, inputs)
    assert (before.found, before.changed) == (1, 1) and before.changes[0].detail.startswith("observed: boolean masked_fill")
    register_attention_adapter(UntraceableAdapter)
    try:
        where, report = mask_to_where(model, inputs)
        assert (report.found, report.changed) == (1, 1) and report.changes[0].detail.startswith("test_untraceable")
        fused, freport = fuse_qkv(where, inputs)
        assert (freport.found, freport.changed) == (1, 1)
        _, again = fuse_qkv(fused, inputs)
        assert again.skipped == [SkippedSite("model.attn", "already fused: fused by vitexport")]
    finally:
        unregister_attention_adapter("test_untraceable")
    assert type(model.model.attn).forward is UntraceableAttention.forward  # the class is untouched
    assert "forward" not in vars(model.model.attn)  # and so is the caller's instance
    with torch.no_grad():
        for seed in range(8):
            x = {"x": torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(seed))}
            assert compare(model(**x).numpy(), fused(**x).numpy(), Tolerance(max_abs=1e-5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = export_onnx(fused, inputs)
    assert softmax_mask_producers(proto) == ["Where"] and float_mask_adds(proto) == 0
    assert np.allclose(run_onnx(proto, inputs), fused(**inputs).detach().numpy(), atol=1e-5)


def test_disabled_toggle_and_report_rendering():
    torch.manual_seed(0)
    model = OutputAdapter(UntraceableModel().eval(), ["x"], keyword=False)
    inputs = {"x": torch.randn(2, 10, 32)}
    for fn in (mask_to_where, fuse_qkv):
        same, report = fn(model, inputs, StageToggle(enabled=False))
        assert same is model and report.found == report.changed == 0 and report.notes == ["disabled by the recipe"]
    r = PassReport("demo")
    assert r.summary() == "demo: no sites found"
    r.found = 3
    r.change("a", "fold", "into x")
    r.change("b", "constants", "fold impossible: y")
    r.skip("c", "no affine")
    assert r.changed == 2 and r.summary() == "demo: 2/3 sites changed (constants 1, fold 1), 1 skipped"
    d = r.to_dict()
    assert d["changes"][1] == {"site": "b", "action": "constants", "detail": "fold impossible: y"}
    assert d["skipped"] == [{"site": "c", "reason": "no affine"}]


@pytest.mark.parametrize("name", ["seed", "hf_bert_eager", "timm_swin"])
def test_rewritten_models_survive_pickle_and_deepcopy(name):
    import copy
    import io

    from passes_zoo import build_case, run_passes

    case = build_case(name)
    model = run_passes(case).final
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    # a whole nn.Module (what users torch.save) can only be unpickled; the bytes are this test's own
    loaded = torch.load(buf, weights_only=False)
    clone = copy.deepcopy(loaded)
    with torch.no_grad():
        ref = model(**case.inputs)
        assert torch.equal(ref, loaded(**case.inputs)) and torch.equal(ref, clone(**case.inputs))
    # the rewrites came along (hooks, plans, the attention implementation): the masks are still Where
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in (loaded, clone):
            assert softmax_mask_producers(export_onnx(m, case.inputs)).count("Where") == 1 + (name != "timm_swin")


@pytest.mark.slow
def test_a_saved_hf_model_runs_in_a_fresh_process(tmp_path):
    import subprocess
    import sys

    from passes_zoo import build_case, run_passes

    case = build_case("hf_bert_sdpa")
    model = run_passes(case).final
    torch.save({"model": model, "inputs": case.inputs}, tmp_path / "m.pt")
    with torch.no_grad():
        torch.save(model(**case.inputs), tmp_path / "ref.pt")
    # the pickle names vitexport's classes (its hooks, the adapter): loading it registers the
    # "vitexport" attention implementation with transformers again
    code = (
        "import torch, sys; d = torch.load(sys.argv[1], weights_only=False); ref = torch.load(sys.argv[2]);"
        "out = d['model'](**d['inputs']); assert torch.equal(out, ref), (out - ref).abs().max()"
    )
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.pt"), str(tmp_path / "ref.pt")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
