"""Benchmark: ``export_onnx`` + ``simplify_onnx`` against a plain ``torch.onnx.export``.

The target (issue 4) is at most 1.5× the plain export's time on timm ViT-B/16. This is a benchmark,
not a test: it takes tens of seconds and its numbers depend on the machine.
"""
from __future__ import annotations

import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from ..recipe import load_recipe
from .export import export_onnx
from .simplify import simplify_onnx

__all__ = ["export_speed"]


def export_speed(
    model: torch.nn.Module | None = None,
    image_size: int = 224,
    target: str = "orin",
    work_dir: str | Path | None = None,
    repeats: int = 1,
) -> dict[str, Any]:
    """Time a plain TorchScript export and vitexport's export + simplify of the same model.

    Args:
        model: the model (default: timm ``vit_base_patch16_224`` with random weights).
        image_size: the square input size; batch 1.
        target: the recipe whose export/contract sections are used; the plain export uses its opset.
        work_dir: where the files go (default: a temporary folder, removed afterwards).
        repeats: runs of each; the best time of each is reported.
    Returns:
        Seconds of ``plain``, ``export`` and ``simplify`` (wall ``*_s`` and CPU ``*_cpu_s``), and
        ``ratio`` / ``ratio_cpu`` = (export + simplify) / plain.
    """
    import onnx  # noqa: F401  - imported before timing: both paths use it, only one would pay for it
    import onnxsim  # noqa: F401

    if model is None:
        import timm

        model = timm.create_model("vit_base_patch16_224", pretrained=False)
    model.eval()
    recipe = load_recipe(target)
    x = torch.randn(1, 3, image_size, image_size, generator=torch.Generator().manual_seed(0))
    # Wall time and this process's CPU time: on a shared machine the second is the steadier one.
    best = {k: float("inf") for k in ("plain_s", "export_s", "simplify_s", "plain_cpu_s", "export_cpu_s", "simplify_cpu_s")}

    def timed(key: str, fn) -> None:
        w, c = time.perf_counter(), time.process_time()
        fn()
        best[f"{key}_s"] = min(best[f"{key}_s"], time.perf_counter() - w)
        best[f"{key}_cpu_s"] = min(best[f"{key}_cpu_s"], time.process_time() - c)

    def plain(path: Path) -> None:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=recipe.export.opset)

    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        d = Path(tmp)
        for _ in range(repeats):
            timed("plain", lambda: plain(d / "plain.onnx"))
            timed("export", lambda: export_onnx(model, {"x": x}, d / "model.raw.onnx", recipe.export))
            timed("simplify", lambda: simplify_onnx(d / "model.raw.onnx", d / "model.fp32.onnx", recipe))
    best["ratio"] = (best["export_s"] + best["simplify_s"]) / best["plain_s"]
    best["ratio_cpu"] = (best["export_cpu_s"] + best["simplify_cpu_s"]) / best["plain_cpu_s"]
    return {**best, "model": type(model).__name__, "opset": recipe.export.opset}

if __name__ == "__main__":  # python -m vitexport.export.bench
    print(export_speed())
