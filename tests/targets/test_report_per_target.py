"""Every target's parity report tells the truth about that target: a tiny ViT through the whole
pipeline for each target, then the report's sentences checked against the run's own figures.

- No sentence names another target's engine (each target supplies its ``engine``: a report of the
  openvino target says nothing of TensorRT's fused attention).
- The size the quantize stage states is the file's size; the summary's "above / below" of the
  prediction agrees with the two numbers; the INT8 share is the manifest's; the summary says where
  the artifact runs (the target's ``where``) and, for an NPU, how many ops it placed where.
- The terms the report uses are explained (once), and the HTML holds the cosine plot.

rk3588 compiles with rknn-toolkit2 in its own venv (``make setup-rknn``); it is skipped, saying why,
only where that venv is missing.
"""
from __future__ import annotations

import json
import os
import re
import warnings

import numpy as np
import pytest
import timm
import torch

from vitexport.calibration.data import NpzSamples
from vitexport.parity.report import md_text, render_html, render_markdown
from vitexport.pipeline import run_pipeline
from vitexport.sources.base import LoadedModel, OutputAdapter
from vitexport.targets import load_target
from vitexport.targets._registry import registered_targets, target_class
from vitexport.targets.rknn.client import rknn_missing

IMG = 32
TARGETS = ["orin", "openvino", "cpu", "npu", pytest.param("rk3588", marks=pytest.mark.slow)]
#: every engine some registered target names (ONNX Runtime runs every target's INT8 gate: not another's)
ENGINES = {cls.engine for cls in registered_targets().values() if cls.engine and cls.engine != "ONNX Runtime"}


def _export(name: str, out):
    """One block of ViT-Tiny width at 32x32 (8x8 patches: 16 tokens + cls), labelled parity data."""
    if name == "rk3588" and rknn_missing():
        pytest.skip(f"rk3588 needs rknn-toolkit2's venv: {rknn_missing()}")
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1, img_size=IMG, patch_size=8, num_classes=10)
    module = OutputAdapter(vit.eval(), ["image"], keyword=False).eval()
    images = np.random.default_rng(0).standard_normal((48, 3, IMG, IMG)).astype(np.float32)
    with torch.no_grad():
        labels = module(torch.from_numpy(images[32:])).argmax(1).numpy()
    model = LoadedModel(module, {"image": torch.from_numpy(images[:1])}, "vit", "timm", "timm:vit_tiny(depth=1)")
    sets = ["quantization.measure_latency=false"] + (["target_options.calibration_samples=32"] if name == "rk3588" else [])
    # random weights at 32 px: the fallback keeps most Linears float (orin: 9 % of MACs INT8), below every
    # target's INT8 share; this test reads the report's sentences, tests/targets/test_int8_share.py the gate
    stage = target_class(name).int8_share_stage
    sets += [f"parity.{stage}.int8_share_min=0"] if stage is not None else []
    target = load_target(name, sets)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arts = run_pipeline(model, target, out, calib=NpzSamples({"image": images[:32]}),
                            parity_data=NpzSamples({"image": images[32:]}, labels=labels))
    return arts, target


@pytest.fixture(scope="module", params=TARGETS)
def report(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param) / "out"
    arts, target = _export(request.param, out)
    data = json.loads((out / "parity.json").read_text())
    return request.param, target, data, out


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.;:])\s+|\n", text) if s.strip()]


def test_no_sentence_names_another_targets_engine(report):
    name, target, data, out = report
    others = ENGINES - {target.engine}
    for text in (render_markdown(data), render_html(data, plots=False), (out / "parity.md").read_text()):
        wrong = [s for s in _sentences(text) if any(e in s for e in others)]
        assert wrong == [], f"{name}: {wrong[:3]}"


def test_the_stated_size_is_the_files(report):
    name, _, data, out = report
    q = next(s for s in data["stages"] if s["stage"] == "quantize_int8")
    line = next(n for n in q["notes"] if n.startswith("model.int8.onnx: "))
    size = os.path.getsize(out / "model.int8.onnx") + sum(p.stat().st_size for p in out.glob("model.int8.onnx.data"))
    value, unit = re.match(r"model\.int8\.onnx: ([\d.]+) (KiB|MiB) on disk", line).groups()  # never bytes: a model
    assert abs(float(value) * (2**10 if unit == "KiB" else 2**20) - size) <= 0.51 * (2**10 if unit == "KiB" else 2**20 / 10)
    consts = sum(q["details"]["quantize"]["precision"]["weight_bytes"].values())
    assert 0 < consts < size  # the constants the line lists are part of the file, not activations


def test_the_summary_agrees_with_the_numbers(report):
    name, target, data, out = report
    md = render_markdown(data)
    summary = md[md.index("## Summary"):md.index("## Stages")]
    assert f"**runs on**: {md_text(target.where)}" in summary
    q = next(s for s in data["stages"] if s["stage"] == "quantize_int8")
    pred = q["details"]["quantize"]["parity"]["prediction"]["cosine_min"]
    measured = q["metrics"]["cosine_min"]
    said = re.search(r"worst cosine of ([\d.]+) on (\d+) parity sample\(s\), (at or above|below) the quantizer's "
                     r"predicted lower bound ([\d.]+)", summary)
    assert said, summary
    assert float(said[1]) == pytest.approx(measured, abs=1e-6) and float(said[4]) == pytest.approx(pred, abs=1e-6)
    assert said[3] == ("at or above" if measured >= pred else "below")
    assert int(said[2]) == len(q["sample_cosines"]) == 16
    share = re.search(r"\*\*INT8 share\*\*: ([\d.]+)%", summary)
    runtime = next((s["details"]["runtime"] for s in data["stages"] if (s.get("details") or {}).get("runtime")), None)
    expected = runtime["int8_share"] if runtime and "int8_share" in runtime else q["details"]["quantize"]["precision"]["int8_gemm_macs_share"]
    assert float(share[1]) == pytest.approx(100 * expected, abs=0.05)
    if runtime and "on_npu" in runtime:  # an NPU's op placement is on the first screen
        assert f"{runtime['on_npu']} of {runtime['ops']} ops on the NPU" in summary


def test_terms_are_explained_once_and_the_cosine_plot_is_drawn(report):
    name, _, data, _ = report
    md = render_markdown(data)
    for term in ("gated top-1", "near ties", "attn·V", "INT8 share"):
        assert md.count(f"**{term}**: ") == (2 if term == "INT8 share" else 1), term  # the summary's fact, the term
    html = render_html(data)
    assert "cosine per sample against the gate&#x27;s threshold" in html
    assert html.index("gate: value vs threshold") < html.index("<h2>Stages</h2>")
