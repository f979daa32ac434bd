"""Calibration memory does not grow with the number of samples (measured in fresh processes)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).parents[1] / "quantize"))
from qmodels import export_onnx, tiny_vit  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[2]))  # ``bench`` is a top-level folder, not part of the package
from bench.calib_memory import measure_calibration_memory  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("mem")
    model = export_onnx(tiny_vit(img=64, patch=8, depth=4), {"x": torch.zeros(1, 3, 64, 64)}, d / "vit.onnx")
    imgs = d / "imgs"
    imgs.mkdir()
    rng = np.random.default_rng(0)
    for i in range(96):
        Image.fromarray(rng.integers(0, 255, (72, 80, 3), dtype=np.uint8)).save(imgs / f"{i:03d}.png")
    return model, imgs, d


@pytest.mark.slow
def test_peak_memory_flat_when_samples_grow_4x(setup):
    # entropy and mse share the percentile histogram observer, so one method measures them all
    model, imgs, d = setup
    # GPTQ keeps up to quantization.gptq_rows rows per Linear input, which 24 samples do not fill and 96 do: a
    # bounded sample, not per-sample state, and not what this measures
    kw = dict(data=imgs, with_torch=False, overrides=["calibration.method=percentile", "quantization.weight_rounding=nearest"])
    small = measure_calibration_memory(model, 24, d / "n24", **kw)
    large = measure_calibration_memory(model, 96, d / "n96", **kw)
    assert small["report"]["num_samples"] == 24 and large["report"]["num_samples"] == 96
    growth = large["peak_rss_mb"] / small["peak_rss_mb"] - 1.0
    # measured +10.1 % (200 -> 220 MB) on an AMD EPYC, +3.5 MB of it the larger image set itself, under 10 % on an
    # Intel Xeon; a calibration that kept this ViT's activations per sample (~1.5 MB each) would add ~100 MB (+50 %)
    assert growth < 0.15, f"peak RSS {small['peak_rss_mb']:.0f} MB -> {large['peak_rss_mb']:.0f} MB"
