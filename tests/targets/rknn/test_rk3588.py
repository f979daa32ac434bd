"""The rk3588 target end to end: a timm ViT through the whole pipeline into ``model.rknn`` with
rknn-toolkit2 for real (its worker, its simulator), what RKNN's op table says the NPU runs, and the
clear exit 2 when the toolchain is missing. The pipeline test skips (saying why) only where
``make setup-rknn`` could not make the venv."""
from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
import timm
import torch

from cli_helpers import run_cli
from vitexport.calibration.data import NpzSamples
from vitexport.errors import BadInput, ParityFailure
from vitexport.pipeline import run_pipeline
from vitexport.progress import Heartbeat
from vitexport.sources.base import LoadedModel, OutputAdapter
from vitexport.targets import load_target
from vitexport.targets.rknn.client import RKNN_VENV_ENV, rknn_missing
from vitexport.targets.rknn.stages import FEW_LAYOUT_SAMPLES, samples_note

IMG = 32


@pytest.fixture(scope="module")
def rknn():
    missing = rknn_missing()
    if missing:
        pytest.skip(missing)


def _vit() -> tuple[LoadedModel, NpzSamples, NpzSamples]:
    """ViT-Tiny width (192, 3 heads), two blocks at 32x32 with 8x8 patches (16 tokens + cls)."""
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, img_size=IMG, patch_size=8,
                            num_classes=10)
    module = OutputAdapter(vit.eval(), ["image"], keyword=False).eval()
    images = np.random.default_rng(0).standard_normal((40, 3, IMG, IMG)).astype(np.float32)
    model = LoadedModel(module, {"image": torch.from_numpy(images[:1])}, "vit_tiny", "timm", "timm:vit_tiny(depth=2)")
    return model, NpzSamples({"image": images[:32]}), NpzSamples({"image": images[32:]})


@pytest.mark.slow
def test_a_vit_compiles_to_rknn_all_on_the_npu_in_int8_and_passes_the_simulator(rknn, tmp_path):
    model, calib, parity = _vit()
    target = load_target("rk3588", ["quantization.measure_latency=false", "target_options.calibration_samples=8"])
    lines: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arts = run_pipeline(model, target, tmp_path / "out", calib=calib, parity_data=parity, log=lines.append,
                            heartbeat=Heartbeat(every_s=2.0))
    assert arts.passed
    stages = {s.stage: s for s in arts.parity.stages}
    assert {"build_engine", "simulate"} <= set(stages)
    # the worker call that compiles also runs the simulator: its time is simulate's, not 0
    assert stages["simulate"].seconds > 0.05 and stages["build_engine"].seconds > stages["simulate"].seconds
    # the compile's wait shows, with the worker's step
    assert any(l.startswith("build_engine: still running, ") and "(rknn-toolkit2: " in l for l in lines), lines
    assert stages["simulate"].metrics.cosine_min > 0.99  # random init, synthetic inputs: near the float model
    assert (tmp_path / "out" / "model.rknn").stat().st_size > 0
    runtime = json.loads((tmp_path / "out" / "manifest.json").read_text())["runtime"]["build_engine"]
    assert runtime["route"] == "qdq" and runtime["on_cpu"] == [] and runtime["on_npu"] == runtime["ops"]
    assert runtime["int8_share"] >= 0.95, runtime["macs_by_dtype"]
    # 8 layout samples: the report says so, and that it is too few to trust
    few = [n for n in stages["build_engine"].notes if "target_options.calibration_samples=8" in n]
    assert few and "from 8 calibration sample(s)" in few[0] and "too few to trust" in few[0], stages["build_engine"].notes


def test_the_layout_sample_note_warns_below_the_floor_only():
    assert "too few" in samples_note(8, 8, "qdq") and "ranges from 8 calibration" in samples_note(8, 8, "qdq")
    assert "too few" not in samples_note(FEW_LAYOUT_SAMPLES, FEW_LAYOUT_SAMPLES, "qdq")
    # calibration data shorter than asked: the count is what was measured, and the warning follows it
    assert "measured 5 calibration sample(s) (target_options.calibration_samples=32)" in samples_note(5, 32, "rknn")
    assert "too few" in samples_note(5, 32, "rknn")


def test_a_missing_toolchain_is_exit_2_naming_the_make_target_before_any_work(tmp_path):
    env = {**os.environ, RKNN_VENV_ENV: str(tmp_path / "nowhere")}
    proc = run_cli("export", "--target", "rk3588", "--out", str(tmp_path / "out"), env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "make setup-rknn" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_an_unknown_route_is_exit_2_naming_the_key(tmp_path):
    proc = run_cli("export", "--target", "rk3588", "--set", "target_options.route=fastest",
                   "--out", str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 2
    assert "target_options.route" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_model_whose_weights_sit_in_a_data_file_compiles_and_is_gated(rknn, tmp_path, monkeypatch):
    """A large model (all-mpnet-base-v2: 420 MB) is saved with its weights in ``<name>.data``: the laid-out
    file RKNN compiled moved into the output folder without it, and the build_engine gate's ONNX Runtime session
    failed ("External data path does not exist", exit 3). Here every saved model takes a data file."""
    monkeypatch.setattr("vitexport.graph.files.EXTERNAL_DATA_MIN_BYTES", 0)
    model, calib, parity = _vit()
    target = load_target("rk3588", ["quantization.measure_latency=false", "target_options.calibration_samples=8"])
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arts = run_pipeline(model, target, out, calib=calib, parity_data=parity)
    assert arts.passed and "build_engine" in {s.stage for s in arts.parity.stages}
    assert (out / "model.int8.onnx.data").is_file() and (out / "model.rknn.onnx.data").is_file()
    assert not list(out.glob(".rknn-*"))  # the compile's scratch folder is gone


class _SplitChain(torch.nn.Module):
    """EdgeNeXt's SDTA channel split at a tiny size: a stride-4 stem, a stride-2 downsampling conv to 88
    channels, then 30 + 30 + 28 channels where each split's depthwise conv output joins the final Concat and
    is added to the next split's input."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 48, 4, stride=4)
        self.down = torch.nn.Conv2d(48, 88, 2, stride=2)
        self.convs = torch.nn.ModuleList([torch.nn.Conv2d(30, 30, 3, padding=1, groups=30) for _ in range(2)])
        self.head = torch.nn.Linear(88, 10)

    def forward(self, x):
        x = self.down(self.stem(x))
        parts = torch.split(x, [30, 30, 28], dim=1)
        outs, sp = [], None
        for i, conv in enumerate(self.convs):
            sp = conv(parts[i] if i == 0 else sp + parts[i])
            outs.append(sp)
        return self.head((torch.cat([*outs, parts[2]], dim=1) + x).mean((2, 3)))


@pytest.mark.slow
def test_a_channel_split_chain_compiles_with_its_first_conv_in_float16_and_crashes_rknn_without(rknn, tmp_path,
                                                                                               monkeypatch):
    """RKNN 2.5.0 crashes (SIGILL in OpEmit) on EdgeNeXt's channel-split chain with the conv whose output feeds
    both the Concat and the next split's Add in INT8: the layout leaves that conv in float16, names why, and the
    export passes every stage; without the rule the same model is the crash (exit 2), so the rule is still needed."""
    torch.manual_seed(0)
    images = np.random.default_rng(0).standard_normal((40, 3, IMG, IMG)).astype(np.float32)
    model = LoadedModel(_SplitChain().eval(), {"x": torch.from_numpy(images[:1])}, "split_chain", "python", "split_chain")
    calib, parity = NpzSamples({"x": images[:32]}), NpzSamples({"x": images[32:]})
    target = load_target("rk3588", ["quantization.measure_latency=false", "target_options.calibration_samples=8"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arts = run_pipeline(model, target, tmp_path / "out", calib=calib, parity_data=parity)
        assert arts.passed
        runtime = json.loads((tmp_path / "out" / "manifest.json").read_text())["runtime"]["build_engine"]
        assert runtime["on_cpu"] == [] and runtime["int8_share"] >= 0.95, runtime["macs_by_dtype"]
        notes = " ".join(s for st in arts.parity.stages if st.stage == "build_engine" for s in st.notes)
        assert "convs.0/Conv" in notes and "read by both a Concat and an Add" in notes
        assert "convs.1/Conv" not in notes  # the last link feeds the Concat alone: INT8
        monkeypatch.setattr("vitexport.targets.rknn.qdq.split_chain", lambda conv: False)
        with pytest.raises(BadInput, match=r"crashed \(SIGILL\)"):
            run_pipeline(model, target, tmp_path / "without", calib=calib, parity_data=parity)


@pytest.mark.slow
def test_nextvits_int8_graph_compiles_where_rknn_crashed_on_it(rknn, tmp_path):
    """The zoo's NextViT, everything INT8 (the fallback off, as a model whose INT8 passes its gate gets it):
    RKNN 2.5.0 aborted on its 12-group 3x3 convs' float biases and segfaulted on the smoothing Mul before its
    E-MHSA's q/k/v (SIGABRT / SIGSEGV in OpEmit, exit 2). With the biases in int32 and the smoothing as a
    depthwise 1x1 conv it compiles, runs every compute op on the NPU at ≥ 95 % INT8 and the simulator is gated: exit 0,
    or exit 1 at the simulator's gate, never the crash."""
    out = tmp_path / "out"
    proc = run_cli("export", "--target", "rk3588", "--model", "python:tests/passes/zoo_entry.py:build_timm_nextvit",
                   "--out", str(out), "--set", "quantization.measure_latency=false",
                   "--set", "quantization.fallback.enabled=false", timeout=300)
    assert proc.returncode in (0, 1), proc.stderr[-1500:]
    doc = json.loads((out / "parity.json").read_text())
    stages = {s["stage"]: s for s in doc["stages"]}
    assert stages["build_engine"]["passed"] and "simulate" in stages
    assert proc.returncode == 0 or doc["failed_stage"] == "simulate"
    checks = {c["metric"]: c["value"] for c in stages["build_engine"]["checks"]}
    assert checks["cpu_compute_ops"] == 0 and checks["int8_share"] >= 0.95, checks


@pytest.mark.slow
def test_a_relative_out_folder_compiles(rknn, tmp_path):
    """``make export TARGET=rk3588`` writes to ``build/<model>-rk3588``, a relative path: the compile's scratch
    folder sits inside it and the worker runs there, so a relative request path named a file that did not exist
    (exit 2, "No such file or directory: 'build/.../request.json'")."""
    # the layout's own calibration samples at the target's default: the demo's int8 file laid out from 8 samples
    # fails build_engine's gate (0.9693; 0.9964 from the default 32)
    proc = run_cli("export", "--target", "rk3588", "--out", "out", "--set", "quantization.measure_latency=false",
                   cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert (tmp_path / "out" / "model.rknn").stat().st_size > 0 and not list((tmp_path / "out").glob(".rknn-*"))


class _Upsample(torch.nn.Module):
    """DPT's fusion step at a tiny size: a conv, an align-corners bilinear upsampling by 2, a conv."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 16, 4, stride=4), torch.nn.Conv2d(16, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 10)

    def forward(self, x):
        y = torch.nn.functional.interpolate(torch.relu(self.a(x)), scale_factor=2, mode="bilinear", align_corners=True)
        return self.head(torch.relu(self.b(y)).mean((2, 3)))


@pytest.mark.slow
def _image_run(build, name: str) -> tuple[LoadedModel, NpzSamples, NpzSamples]:
    """A small conv model (seeded) on Gaussian 3x32x32 images: 32 to calibrate on, 8 for parity."""
    torch.manual_seed(0)
    images = np.random.default_rng(0).standard_normal((40, 3, IMG, IMG)).astype(np.float32)
    model = LoadedModel(build().eval(), {"x": torch.from_numpy(images[:1])}, name, "python", name)
    return model, NpzSamples({"x": images[:32]}), NpzSamples({"x": images[32:]})


def _all_on_the_npu(model, calib, parity, sets: list[str], out, share_min: float) -> None:
    """The model through rk3588 passes every gate, the simulator's included, with every op on the NPU."""
    arts = run_pipeline(model, load_target("rk3588", sets), out, calib=calib, parity_data=parity)
    assert arts.passed and "simulate" in {s.stage for s in arts.parity.stages}
    runtime = json.loads((out / "manifest.json").read_text())["runtime"]["build_engine"]
    assert runtime["on_cpu"] == [] and runtime["on_npu"] == runtime["ops"] and runtime["int8_share"] >= share_min


def _kept_on_the_cpu(model, calib, parity, sets: list[str], out, says: str) -> None:
    """With the recipe's rewrite off, RKNN runs the op on the CPU and the cpu_compute_ops gate names it."""
    with pytest.raises(ParityFailure, match=says):
        run_pipeline(model, load_target("rk3588", sets), out, calib=calib, parity_data=parity)


def test_an_align_corners_upsampling_runs_on_the_npu_where_rknn_put_it_on_the_cpu(rknn, tmp_path):
    """RKNN 2.5.0 runs an align-corners Resize on the CPU (the cpu_compute_ops gate: exit 1). The rk3588 recipe
    writes it as an asymmetric Resize with an exact correction: every op on the NPU, the simulator gated."""
    model, calib, parity = _image_run(_Upsample, "upsample")
    sets = ["quantization.measure_latency=false"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _all_on_the_npu(model, calib, parity, sets, tmp_path / "out", share_min=0.95)
        # the same model with the Resize as exported: RKNN runs it on the CPU, and the gate says so
        _kept_on_the_cpu(model, calib, parity, [*sets, "export.align_corners_resize=keep"], tmp_path / "kept",
                         r"cpu_compute_ops=1 .*Resize:/model/Resize \(Resize, \S+ on the CPU\); "
                         r"why: RKNN 2.5.0 runs an align-corners Resize on the CPU")


@pytest.mark.slow
def test_detrs_position_add_compiles_on_the_linears_conv_views_where_rknn_crashed(rknn, tmp_path, monkeypatch, capfd):
    """RKNN 2.5.0 segfaulted in OpEmit on DETR's encoder, where the sine position embedding is added to the
    flattened backbone features between their Transpose and the q/k projections' conv views (exit 2). The layout
    adds it on each conv view instead: exit 0, every op on the NPU; without that rule the same model is the crash."""
    transformers = pytest.importorskip("transformers")
    from test_outputs import _detector
    from vitexport.cli import main

    torch.manual_seed(0)
    _detector(transformers, "detr").save_pretrained(tmp_path / "detr")
    args = ["export", "--model", f"hf:{tmp_path / 'detr'}", "--target", "rk3588", "--set", "calibration.num_samples=16",
            "--set", "parity_data.synthetic_samples=8", "--set", "quantization.measure_latency=false"]
    assert main([*args, "--out", str(tmp_path / "out")]) == 0, capfd.readouterr().err[-1500:]
    runtime = json.loads((tmp_path / "out" / "manifest.json").read_text())["runtime"]["build_engine"]
    assert runtime["on_cpu"] == [] and runtime["int8_share"] >= 0.95
    monkeypatch.setattr("vitexport.targets.rknn.qdq.position_add", lambda x, t, cin: None)
    capfd.readouterr()
    assert main([*args, "--out", str(tmp_path / "without")]) == 2
    assert "rknn-toolkit2 crashed (SIGSEGV) in stage build (compiler pass OpEmit)" in capfd.readouterr().err


@pytest.mark.slow
def test_conditional_detrs_box_update_compiles_as_a_concat_where_rknn_stalled(rknn, tmp_path, capfd):
    """Conditional DETR's box update (``boxes[..., :2] += reference``) exports as a ScatterND; RKNN 2.5.0's graph
    optimiser ran over 20 minutes on it without finishing. The rk3588 recipe writes it as Slice and Concat
    (``export.slice_scatter``): exit 0, every op on the NPU. Kept as a ScatterND, the build does not finish in
    the time the written one takes several times over."""
    pytest.importorskip("transformers")
    from test_task_zoo import _cond_detr
    from vitexport.cli import main
    from vitexport.graph.files import load_model

    torch.manual_seed(0)
    model = _cond_detr()
    model.config.image_size = 64
    model.save_pretrained(tmp_path / "cdetr")
    args = ["export", "--model", f"hf:{tmp_path / 'cdetr'}", "--target", "rk3588", "--set", "calibration.num_samples=16",
            "--set", "parity_data.synthetic_samples=8", "--set", "quantization.measure_latency=false"]
    assert main([*args, "--out", str(tmp_path / "out")]) == 0, capfd.readouterr().err[-1500:]
    ops = {n.op_type for n in load_model(tmp_path / "out" / "model.fp32.onnx").graph}
    assert "ScatterND" in {n.op_type for n in load_model(tmp_path / "out" / "model.raw.onnx").graph}
    assert "ScatterND" not in ops
    runtime = json.loads((tmp_path / "out" / "manifest.json").read_text())["runtime"]["build_engine"]
    assert runtime["on_cpu"] == [] and runtime["int8_share"] >= 0.95
    capfd.readouterr()
    keep = ["--set", "export.slice_scatter=keep", "--set", "target_options.timeout_s=30"]
    assert main([*args, *keep, "--out", str(tmp_path / "kept")]) == 2
    assert "rknn-toolkit2 did not finish within 30 s in stage build" in capfd.readouterr().err
    assert not (tmp_path / "kept" / "model.rknn").exists()


class _Pyramid(torch.nn.Module):
    """UperNet's pyramid pooling at a tiny size: a 16x16 map pooled to 1, 2, 3 and 6 cells and brought back."""

    def __init__(self):
        super().__init__()
        self.stem, self.head = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.Conv2d(40, 4, 1)
        self.pools = torch.nn.ModuleList(torch.nn.AdaptiveAvgPool2d(s) for s in (1, 2, 3, 6))

    def forward(self, x):
        f = torch.relu(self.stem(x))
        levels = [torch.nn.functional.interpolate(p(f), size=f.shape[-2:], mode="bilinear") for p in self.pools]
        return self.head(torch.cat([f, *levels], 1))


@pytest.mark.slow
def test_pyramid_pooling_runs_on_the_npu(rknn, tmp_path, monkeypatch):
    """UperNet's pyramid pooling: adaptive pooling to 3 and 6 cells of a 16x16 map exported as index gathers, on
    which RKNN 2.5.0's optimiser looped; written as a MatMul it compiles. Bringing those cells back to 16x16 takes
    factors 16/3 and 8/3, which RKNN runs on the CPU; the rk3588 recipe writes them as MatMuls too: every op on
    the NPU. With the Resizes kept, the cpu_compute_ops gate names them and says why."""
    model, calib, parity = _image_run(_Pyramid, "pyramid")
    # at this size RKNN's own float16 convs around the resized maps (its split of the head conv over the Concat)
    # carry a sixth of the MACs (83 % INT8; 76 % with the Resizes kept); the task zoo's UperNet runs 98.5 % INT8.
    # Placement is what is tested.
    sets = ["quantization.measure_latency=false", "parity.build_engine.int8_share_min=0.7"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _all_on_the_npu(model, calib, parity, sets, tmp_path / "out", share_min=0.8)
        _kept_on_the_cpu(model, calib, parity, [*sets, "export.fractional_resize=keep"], tmp_path / "kept",
                         r"cpu_compute_ops=2 .*why: RKNN 2.5.0 runs a linear Resize by a factor "
                         r"that is neither an integer nor its inverse on the CPU \(3x3 to 16x16\)")
        # the adaptive pooling as the exporter writes it (index gathers and Transposes): RKNN's optimiser warns that
        # a rule may loop forever on them, then aborts (on the zoo's UperNet it looped until stopped)
        monkeypatch.setattr("vitexport.export.rewrites.adaptive_avg_pool_as_matmul", lambda x, size: None)
        with pytest.raises(BadInput, match=r"RKNN says .*may fall into an infinite loop"):
            run_pipeline(model, load_target("rk3588", sets), tmp_path / "gathers", calib=calib, parity_data=parity)
