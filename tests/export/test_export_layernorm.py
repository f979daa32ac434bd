"""The decomposed LayerNorm: exact in float32, no LayerNormalization/Pow op, and float16-safe."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from export_helpers import adapter, float16_storage, image, op_counts, run_ort, tiny_timm, to_float16

from vitexport.export import export_onnx, simplify_onnx
from vitexport.export.layernorm import decomposed_layer_norm
from vitexport.targets import build_target, load_recipe


@pytest.mark.parametrize("fp16_safe", [True, False])
@pytest.mark.parametrize("scale", [1e-4, 1.0, 1e3])
@pytest.mark.parametrize("shape,norm", [((2, 5, 16), (16,)), ((2, 3, 4, 6), (4, 6))])
def test_matches_layer_norm_in_float32(fp16_safe, scale, shape, norm):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g) * scale
    x[0, 0] = 3.0  # a constant row: zero deviation must not divide by zero
    w, b = torch.randn(*norm, generator=g), torch.randn(*norm, generator=g)
    for eps in (1e-5, 1e-6):
        want = F.layer_norm(x, norm, w, b, eps)
        got = decomposed_layer_norm(x, norm, w, b, eps, fp16_safe=fp16_safe)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(decomposed_layer_norm(x, norm, eps=eps, fp16_safe=fp16_safe),
                                   F.layer_norm(x, norm, eps=eps), rtol=1e-5, atol=1e-5)


def _outlier_vit():
    """A tiny ViT whose residual stream carries channels near ±1000, as ViT-B's does (|x| ≈ 1400)."""
    model, size = tiny_timm("vit", seed=1)
    with torch.no_grad():
        model.patch_embed.proj.bias[:3] = torch.tensor([1000.0, -1000.0, 900.0])
    return model, size


def _fp16_outputs(target: str, tmp_path, **export_overrides) -> dict[str, np.ndarray]:
    """The float32 torch reference and the exported graph run two ways in float16 (see
    :func:`float16_storage` for why two)."""
    recipe = load_recipe(target)
    spec = recipe.export.model_copy(update=export_overrides)
    model, size = _outlier_vit()
    inputs = image(size, batch=2)
    peak = []
    hook = model.blocks[0].register_forward_pre_hook(lambda m, a: peak.append(float(a[0].abs().max())))
    with torch.no_grad():
        ref = adapter(model)(inputs["x"]).numpy()
    hook.remove()
    assert peak[0] > 900  # the activations the LayerNorms see really reach |x| ≈ 1000
    export_onnx(adapter(model), inputs, tmp_path / "raw.onnx", spec)
    simplify_onnx(tmp_path / "raw.onnx", tmp_path / "fp32.onnx", build_target(recipe))
    ops = op_counts(tmp_path / "fp32.onnx")
    assert "LayerNormalization" not in ops and "Pow" not in ops
    fp32 = onnx.load(str(tmp_path / "fp32.onnx"))
    x16 = inputs["x"].numpy().astype(np.float16)
    return {
        "ref": ref,
        "float16": run_ort(to_float16(fp32), {"x": x16}, optimize=False).astype(np.float32),
        "float16_storage": run_ort(float16_storage(fp32), {"x": x16.astype(np.float32)}, optimize=False),
    }


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_orin_jp5_layernorm_survives_float16(tmp_path):
    out = _fp16_outputs("orin-jp5", tmp_path)
    for kind in ("float16", "float16_storage"):
        assert np.isfinite(out[kind]).all(), kind
        assert _cosine(out["ref"], out[kind]) > 0.999, kind
        assert (out["ref"].argmax(1) == out[kind].argmax(1)).all(), kind


def test_plain_decomposition_breaks_in_float16(tmp_path):
    # Why fp16_safe_layernorm exists: (x - mean)^2 of 1000 is 1e6, above float16's 65504; the
    # variance becomes inf and every LayerNorm returns its bias alone.
    res = _fp16_outputs("orin-jp5", tmp_path, fp16_safe_layernorm=False)
    out = res["float16_storage"]
    assert not np.isfinite(out).all() or _cosine(res["ref"], out) < 0.99
