"""1×1 convs (a hybrid's expand / project convs) calibrate as the Linears they are: their input rows are
the channel vectors at each pixel, so the range search scores clipping candidates by the conv's output
error and the bias correction folds the conv's mean INT8 error into its bias (issue 28)."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from qcases import target as build
from qmodels import export_onnx
from vitexport.calibration import random_samples
from vitexport.quantize.calibrate import calibrate
from vitexport.quantize.quantizer import prepare_model


class _Hybridish(nn.Module):
    """A depthwise conv whose channels differ 30-fold (folded BatchNorm scales), Hardswish, then a 1×1
    projection conv with a bias and a 3×3 conv: the MBConv tail of MobileViT / EfficientViT."""

    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pw = nn.Conv2d(16, 24, 1)
        self.k3 = nn.Conv2d(24, 8, 3, padding=1)
        with torch.no_grad():
            self.dw.weight.mul_(torch.logspace(-1, 0.5, 16).view(16, 1, 1, 1))
            self.dw.bias.fill_(0.3)

    def forward(self, x):
        return self.k3(self.pw(nn.functional.hardswish(self.dw(x)))).mean((2, 3))


def _calibrated(tmp_path):
    torch.manual_seed(0)
    ex = {"x": torch.randn(1, 16, 12, 12)}
    path = export_onnx(_Hybridish().eval(), ex, tmp_path / "h.onnx")
    tgt = build("orin", "quantization.fallback.enabled=false")
    model = prepare_model(path, tgt)
    plan = tgt.annotate(model)
    res = calibrate(model, tgt, plan, random_samples(ex, 40, seed=1), tgt.recipe)
    convs = {n.name: n for n in model.graph if n.op_type == "Conv"}
    pw = next(k for k, n in convs.items() if n.inputs[1].const_value.shape[2:] == (1, 1))
    k3 = next(k for k, n in convs.items() if n.inputs[1].const_value.shape[2:] == (3, 3) and n.attributes["group"].as_int() == 1)
    dw = next(k for k in convs if k not in (pw, k3))
    return res, convs, pw, k3, dw


def test_pointwise_conv_is_searched_and_bias_corrected(tmp_path):
    res, convs, pw, k3, dw = _calibrated(tmp_path)
    pw_in = convs[pw].inputs[0].name
    # searched by the conv's output error: the choice is one of the candidates, recorded for the report
    assert res.table.choices["range"][pw_in] in {"minmax", "mse", "percentile99.9", "percentile99.99", "percentile99.999"}
    assert res.table.choices["error"]["linears"] == 1  # the 1×1 conv: a k×k conv's rows say nothing per pixel
    assert pw in res.table.bias and len(res.table.bias[pw]) == 24
    # the 3×3 conv reads the projection's output: per-tensor MSE decides its range, and its mean error is corrected
    assert res.table.choices["range"][convs[k3].inputs[0].name] == "mse"
    assert len(res.table.bias[k3]) == 8 and len(res.table.bias[dw]) == 16


def test_pointwise_rows_are_channel_vectors(tmp_path):
    """The sampled rows hold one value per input channel (16), not one per pixel column (12)."""
    from vitexport.quantize import calibrate as cal

    torch.manual_seed(0)
    ex = {"x": torch.randn(1, 16, 12, 12)}
    path = export_onnx(_Hybridish().eval(), ex, tmp_path / "h.onnx")
    tgt = build("orin")
    model = prepare_model(path, tgt)
    plan = tgt.annotate(model)
    stats = cal._statistics(model, plan, random_samples(ex, 40, seed=1), tgt.recipe, cal.QuantProfile())
    assert sorted(r.shape[1] for r in stats.rows.values()) == [16, 16, 24]  # dw and pw read 16 channels, k3 24
    for t, rows in stats.rows.items():
        assert stats.absmax[t].shape == (rows.shape[1],) and np.all(stats.absmax[t] >= np.abs(rows).max(0))


def test_conv_matrix_maps_channel_means():
    """The summed-taps matrix gives a conv's output mean from its input's channel means (no padding)."""
    from vitexport.quantize.calibrate import _conv_matrix
    from vitexport.quantize.search import QuantArith
    import onnx_ir as ir

    torch.manual_seed(0)
    conv = nn.Conv2d(8, 12, 3, groups=4, bias=False)
    x = torch.randn(4, 8, 1, 1).expand(4, 8, 10, 10)  # each channel constant over the image: no border effect
    node = ir.Node("", "Conv", [], attributes=[ir.AttrInt64("group", 4)])
    w, wq = _conv_matrix(node, conv.weight.detach().numpy(), QuantArith())
    with torch.no_grad():
        ref = conv(x).mean((2, 3)).numpy()
    mean_in = x.mean((2, 3)).numpy()
    assert np.allclose(mean_in @ w, ref, atol=1e-5)
    assert not w[:2, 3:].any() and not np.array_equal(w, wq)  # block-diagonal over groups; wq rounded


class _MBConv(nn.Module):
    """Expand 1×1 conv, SiLU, a depthwise conv whose input channels differ 100-fold, project 1×1 conv. The
    depthwise weights undo the spread (as a folded BatchNorm does), so every channel matters downstream."""

    def __init__(self):
        super().__init__()
        self.expand = nn.Conv2d(8, 16, 1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.project = nn.Conv2d(16, 8, 1)
        with torch.no_grad():
            self.expand.weight.mul_(torch.logspace(-2, 0, 16).view(16, 1, 1, 1))
            self.expand.bias.mul_(torch.logspace(-2, 0, 16))
            self.dw.weight.mul_(torch.logspace(2, 0, 16).view(16, 1, 1, 1))
            self.dw.bias.zero_()

    def forward(self, x):
        return self.project(self.dw(nn.functional.silu(self.expand(x)))).mean((2, 3))


def _int8_error(tmp_path, tag: str) -> float:
    from vitexport.quantize import quantize_int8
    from vitexport.runners import OnnxRuntimeRunner
    from vitexport.runners.sessions import QDQ_AS_FLOAT

    torch.manual_seed(0)
    ex = {"x": torch.randn(1, 8, 10, 10)}
    module = _MBConv().eval()
    path = export_onnx(module, ex, tmp_path / "mb.onnx")
    feeds = list(random_samples(ex, 8, seed=9).batches(1))
    with torch.no_grad():
        ref = np.concatenate([module(torch.from_numpy(f["x"])).numpy() for f in feeds])
    tgt = build("orin", "quantization.fallback.enabled=false")
    quantize_int8(path, tmp_path / f"{tag}.onnx", random_samples(ex, 40, seed=1), tgt, tmp_path / tag)
    with OnnxRuntimeRunner(tmp_path / f"{tag}.onnx", config=QDQ_AS_FLOAT) as run:
        out = np.concatenate([next(iter(run.infer(f).values())) for f in feeds])
    return float(np.abs(out - ref).max() / np.abs(ref).max())


def test_depthwise_input_is_equalised(tmp_path, monkeypatch):
    """A per-channel Mul lands in front of the depthwise conv and its weight takes the factors; the INT8
    output is closer to the float one than with the channels left as they are (α = 0: factors of 1)."""
    from vitexport.quantize import calibrate as cal

    torch.manual_seed(0)
    ex = {"x": torch.randn(1, 8, 10, 10)}
    path = export_onnx(_MBConv().eval(), ex, tmp_path / "mb.onnx")
    tgt = build("orin", "quantization.fallback.enabled=false")
    model = prepare_model(path, tgt)
    res = calibrate(model, tgt, tgt.annotate(model), random_samples(ex, 40, seed=1), tgt.recipe)
    dw = next(n for n in model.graph if n.op_type == "Conv" and n.attributes.get("group") and n.attributes["group"].as_int() == 16)
    site = dw.inputs[0].producer().inputs[0].name
    assert dw.inputs[0].producer().op_type == "Mul" and res.table.choices["alpha"][site] == cal.DEPTHWISE_ALPHA
    factors = np.asarray(res.table.equalization[site])
    assert factors.shape == (16,) and factors.max() == 1.0 and factors.min() < 0.3

    equalised = _int8_error(tmp_path, "eq")
    monkeypatch.setattr(cal, "DEPTHWISE_ALPHA", 0.0)
    assert equalised < 0.7 * _int8_error(tmp_path, "plain")


def test_a_target_that_declines_the_depthwise_mul_gets_none(tmp_path):
    """rk3588 (``equalise_depthwise`` False: RKNN runs the Mul as a float16 op of its own on the full map):
    the depthwise conv reads its input as it is, and the table's settings say so (no stale reuse)."""
    from vitexport.quantize.calibrate import table_settings

    torch.manual_seed(0)
    ex = {"x": torch.randn(1, 8, 10, 10)}
    path = export_onnx(_MBConv().eval(), ex, tmp_path / "mb.onnx")
    tables = {}
    for name in ("orin", "rk3588"):
        tgt = build(name, "quantization.fallback.enabled=false")
        model = prepare_model(path, tgt)
        res = calibrate(model, tgt, tgt.annotate(model), random_samples(ex, 40, seed=1), tgt.recipe)
        dw = next(n for n in model.graph if n.op_type == "Conv" and n.attributes.get("group")
                  and n.attributes["group"].as_int() == 16)
        mul = dw.inputs[0].producer()  # SiLU's own x·sigmoid(x) Mul, or a Mul by constant factors
        tables[name] = (mul.op_type == "Mul" and mul.inputs[1].const_value is not None, res.table.equalization,
                        table_settings(tgt.recipe, tgt, 0))
    assert tables["orin"][0] and tables["orin"][1]
    assert not tables["rk3588"][0] and not tables["rk3588"][1]
    assert "no_depthwise_insert" in tables["rk3588"][2]["smoothing"]


def test_conv_matrix_weighs_border_taps(tmp_path):
    """On a 4×4 map a padded 3×3 conv's output mean, from constant channels, is the taps weighed by where
    they land inside the image (the summed kernel would overstate it by 16/9 on a corner-heavy map)."""
    from vitexport.quantize.calibrate import _conv_matrix
    from vitexport.quantize.search import QuantArith

    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, padding=1, bias=False)
    ex = {"x": torch.randn(1, 4, 4, 4)}
    path = export_onnx(conv.eval(), ex, tmp_path / "c.onnx")
    model = prepare_model(path, build("orin"))
    node = next(n for n in model.graph if n.op_type == "Conv")
    w, _ = _conv_matrix(node, conv.weight.detach().numpy(), QuantArith())
    x = torch.randn(3, 4, 1, 1).expand(3, 4, 4, 4)
    with torch.no_grad():
        ref = conv(x).mean((2, 3)).numpy()
    assert np.allclose(x.mean((2, 3)).numpy() @ w, ref, atol=1e-5)
