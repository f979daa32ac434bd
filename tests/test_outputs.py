"""Every tensor output of a model is exported by name and gated on its own (issue 29, items 1-2)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from vitexport import api
from vitexport.cli import main
from vitexport.errors import BadInput, ParityFailure
from vitexport.parity import check_stage
from vitexport.parity.reference import GoldenReference
from vitexport.recipe import Tolerance
from vitexport.runners import OnnxRuntimeRunner, TorchRunner
from vitexport.runners.torch_runner import tensor_outputs
from vitexport.sources import load_model

from replay import replayed

FAST = ("calibration.num_samples=16", "parity_data.synthetic_samples=8")

MODELS = '''
import torch
from torch import nn

class TwoHeads(nn.Module):
    """A detector's shape: class logits and boxes, with an entry that is no tensor."""
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 4, 4), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 32), nn.ReLU())
        self.cls = nn.Linear(32, 10)
        self.box = nn.Linear(32, 20)
    def forward(self, x):
        h = self.body(x)
        return {"logits": self.cls(h), "aux": None, "boxes": self.box(h).sigmoid().reshape(-1, 5, 4)}

class Fragile(TwoHeads):
    """The second output is the small difference of one Linear on two nearly equal inputs: INT8
    rounds each input on its own scale, by more than their difference, so that output alone
    loses its parity."""
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 16)
    def forward(self, x):
        h = self.body(x)
        return {"logits": self.cls(h), "delta": self.a(h * 1.01) - self.a(h)}

class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(12, 6)
    def forward(self, x):
        y = self.lin(x.flatten(1))
        return y, [y], y.tanh()

def two_heads():
    torch.manual_seed(0)
    return TwoHeads()

def fragile():
    torch.manual_seed(0)
    return Fragile()

def pair():
    torch.manual_seed(0)
    return Pair(), {"x": torch.randn(1, 3, 2, 2)}
'''


@pytest.fixture
def models(tmp_path) -> Path:
    path = tmp_path / "heads.py"
    path.write_text(MODELS)
    return path


def _outputs(path: Path) -> list[str]:
    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]


def _checks(out: Path) -> dict[str, list[str]]:
    return {s["stage"]: [c["metric"] for c in s["checks"]] for s in json.loads((out / "parity.json").read_text())["stages"]}


def test_tensor_outputs_keep_names_and_order_and_say_what_they_skip():
    t, u = torch.ones(1, 2), torch.zeros(1, 3)
    assert list(tensor_outputs(t)[0]) == ["output"]
    named, skipped = tensor_outputs({"pred_boxes": u, "hidden_states": (t, t), "logits": t, "loss": None})
    assert list(named) == ["pred_boxes", "logits"]  # the model's order, not logits first
    assert skipped == ["hidden_states (tuple)", "loss (None)"]
    named, skipped = tensor_outputs((t, [t], u))
    assert list(named) == ["output_0", "output_2"] and skipped == ["output_1 (list)"]
    with pytest.raises(TypeError):
        tensor_outputs({"a": None})


def test_a_tuple_model_has_numbered_outputs_and_one_output_stays_output(models):
    m = load_model(f"python:{models}:pair")
    assert m.output_names == ["output_0", "output_2"]
    assert m.module.skipped == ["output_1 (list)"]
    one = load_model(f"python:{models}:pair", outputs="output_2")
    assert one.output_names == ["output"] and one.module.model_output_names == ["output_2"]
    with TorchRunner(one.module, one.example_inputs) as r:
        out = r.infer({"x": one.example_inputs["x"].numpy()})
    np.testing.assert_allclose(out["output"], m.module(**m.example_inputs)[1].detach().numpy(), rtol=1e-6)


def test_two_outputs_export_on_orin_by_name_and_each_is_gated(models, tmp_path):
    out = tmp_path / "orin"
    arts = api.export(f"python:{models}:two_heads", "orin", input_shape="1,3,32,32", out=out, overrides=FAST)
    assert arts.passed
    assert _outputs(out / "model.fp32.onnx") == ["logits", "boxes"]
    assert _outputs(out / "model.int8.onnx") == ["logits", "boxes"]
    # the FP32 file computes what torch computes, output by output
    m = load_model(f"python:{models}:two_heads", input_shape="1,3,32,32")
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits, boxes = m.module(x=x)
    with OnnxRuntimeRunner(out / "model.fp32.onnx") as r:
        got = r.infer({"x": x.numpy()})
    np.testing.assert_allclose(got["logits"], logits.numpy(), atol=1e-5)
    np.testing.assert_allclose(got["boxes"], boxes.numpy(), atol=1e-5)
    checks = _checks(out)
    assert checks["export_onnx"] == ["max_abs/ref_scale[logits]", "max_abs/ref_scale[boxes]"]
    # top-1 on the classification output only; cosine on every output
    # (then the target's INT8-share gate, which is the model's, not an output's)
    assert checks["quantize_int8"] == ["cosine_min[logits]", "top1_agreement_gated[logits]", "cosine_min[boxes]", "int8_share"]
    stage = json.loads((out / "parity.json").read_text())["stages"][-1]
    assert set(stage["output_metrics"]) == {"logits", "boxes"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["outputs"] == {"logits": {"shape": [1, 10]}, "boxes": {"shape": [1, 5, 4]}}
    notes = arts.parity.notes
    assert any(n.startswith("outputs: logits [1, 10], boxes [1, 5, 4]") for n in notes)
    assert "not exported (not a tensor): aux (None)" in notes
    assert "- outputs: logits" in (out / "parity.md").read_text()  # the report lists them


def test_outputs_flag_keeps_one_and_an_unknown_name_is_exit_2(models, tmp_path, capsys):
    out = tmp_path / "one"
    rc = main(["export", "--model", f"python:{models}:two_heads", "--input-shape", "1,3,32,32", "--target", "cpu",
               "--out", str(out), "--outputs", "logits", *(a for kv in FAST for a in ("--set", kv))])
    assert rc == 0
    assert _outputs(out / "model.int8.onnx") == ["output"]
    assert _checks(out)["quantize_int8"] == ["cosine_min", "top1_agreement_gated", "int8_share"]  # as a single-output model's
    assert "--outputs kept the model's 'logits' only" in capsys.readouterr().out
    rc = main(["export", "--model", f"python:{models}:two_heads", "--input-shape", "1,3,32,32", "--target", "cpu",
               "--out", str(tmp_path / "bad"), "--outputs", "logits,box"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "'box'" in err and "did you mean 'boxes'?" in err and "its outputs are logits, boxes" in err
    assert "Traceback" not in err


def test_a_second_output_that_int8_breaks_fails_the_gate_naming_it(models, tmp_path):
    out = tmp_path / "fragile"
    with pytest.raises(ParityFailure) as info:
        api.export(f"python:{models}:fragile", "orin", input_shape="1,3,32,32", out=out, overrides=FAST)
    err = info.value
    assert err.stage == "quantize_int8" and err.metric == "cosine_min[delta]"
    stage = json.loads((out / "parity.json").read_text())["stages"][-1]
    failed = [c["metric"] for c in stage["checks"] if not c["passed"]]
    assert failed == ["cosine_min[delta]"]  # the logits passed: one output alone fails the stage
    assert stage["passed"] is False


def test_the_gate_fails_an_output_the_engine_lacks():
    ref = GoldenReference({"logits": np.array([[1.0, 2.0]]), "boxes": np.ones((1, 3))}, [{"x": np.zeros((1, 2), np.float32)}])
    res = check_stage("compare", replayed({"logits": np.array([[1.0, 2.0]])}), ref, Tolerance(cosine_min=0.9))
    assert not res.passed and res.failed_check.metric == "output_shape[boxes]"
    assert any("'boxes' missing" in n for n in res.notes)


def _detector(transformers, family: str):
    """A tiny random-weight detector: YOLOS (a ViT with detection tokens) or DETR (a ResNet backbone,
    no timm, nothing pretrained: no network)."""
    if family == "yolos":
        config = transformers.YolosConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                          image_size=[64, 64], patch_size=16, num_detection_tokens=5)
        return transformers.YolosForObjectDetection(config)
    backbone = transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 32, 64], depths=[1, 1, 1, 1],
                                         out_features=["stage4"])
    config = transformers.DetrConfig(use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=backbone,
                                     backbone=None, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                     decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=5,
                                     num_labels=3)
    config.image_size = 64  # DETR's config has no input size; the source reads this one
    return transformers.DetrForObjectDetection(config)


@pytest.mark.parametrize("family,target", [("yolos", "orin"), ("yolos", "openvino"), ("detr", "orin")])
def test_a_detector_exports_logits_and_pred_boxes(tmp_path, family, target):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / family
    torch.manual_seed(0)
    _detector(transformers, family).save_pretrained(folder)
    out = tmp_path / target
    # a random-weight detector this small keeps much of itself float (the fallback, TensorRT's attention
    # rules): its INT8 share is the share gate's business (tests/targets/test_int8_share.py), not this test's
    share = [f"parity.{stage}.int8_share_min=0" for stage in ("quantize_int8", "build_engine")]
    arts = api.export(f"hf:{folder}", target, out=out, overrides=[*FAST, *share])
    assert arts.passed
    names = _outputs(out / "model.int8.onnx")
    assert names[:2] == ["logits", "pred_boxes"]
    assert arts.outputs["pred_boxes"] == [1, 5, 4]
    last = json.loads((out / "parity.json").read_text())["stages"][-1]
    assert {"cosine_min[logits]", "cosine_min[pred_boxes]"} <= {c["metric"] for c in last["checks"]}


def test_an_unknown_output_is_refused_before_any_work(models):
    m = load_model(f"python:{models}:pair", outputs=["nope"])
    with pytest.raises(BadInput, match="no tensor output 'nope'.*its outputs are output_0, output_2"):
        m.output_names


def test_two_outputs_compile_for_rk3588_and_the_simulator_gates_each(models, tmp_path):
    from vitexport.targets.rknn.client import rknn_missing

    missing = rknn_missing()
    if missing:
        pytest.skip(missing)
    out = tmp_path / "rk"
    arts = api.export(f"python:{models}:two_heads", "rk3588", input_shape="1,3,32,32", out=out,
                      overrides=(*FAST, "quantization.measure_latency=false"))
    assert arts.passed
    assert _outputs(out / "model.rknn.onnx") == ["logits", "boxes"]
    checks = _checks(out)
    for stage in ("build_engine", "simulate"):  # RKNN's simulator answers both outputs, each gated
        assert {"cosine_min[logits]", "cosine_min[boxes]"} <= set(checks[stage])


def test_export_onnx_names_a_plain_modules_dict_outputs(tmp_path):
    from vitexport.export import export_onnx
    from vitexport.recipe import ExportSpec

    class Dicty(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x):
            y = self.lin(x)
            return {"scores": y, "loss": torch.zeros(()), "probs": y.softmax(-1)}

    torch.manual_seed(0)
    export_onnx(Dicty(), {"x": torch.randn(2, 4)}, tmp_path / "m.onnx", ExportSpec())
    assert _outputs(tmp_path / "m.onnx") == ["scores", "probs"]  # the 0-d loss has no sample axis: left out


def test_a_single_output_stage_is_written_as_before():
    ref = GoldenReference({"output": np.array([[1.0, 2.0]])}, [{"x": np.zeros((1, 2), np.float32)}])
    res = check_stage("compare", replayed({"output": np.array([[1.0, 2.0]])}), ref, Tolerance(cosine_min=0.9))
    d = res.to_dict()
    assert res.passed and "output_metrics" not in d and [c["metric"] for c in d["checks"]] == ["cosine_min"]
    two = GoldenReference({"logits": np.array([[1.0, 2.0]]), "boxes": np.ones((1, 3))}, ref.feeds)
    both = check_stage("compare", replayed({"logits": np.array([[1.0, 2.0]]), "boxes": np.ones((1, 3))}), two,
                       Tolerance(cosine_min=0.9))
    back = type(both).from_dict(both.to_dict())  # parity.json read back (vitexport parity OUT re-renders from it)
    assert set(back.output_metrics) == {"logits", "boxes"} and back.passed
