"""freeze_layernorm: both modes on every family, the fold arithmetic, LayerNorm subclasses, reasons."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from passes_zoo import FAMILIES, build_case, seed_vit
from vitexport.parity.metrics import compare
from vitexport.passes import LayerNormConstants, freeze_layernorm
from vitexport.recipe import FreezeLayerNormSpec, LayerNormMode, Tolerance
from vitexport.sources import OutputAdapter

TOL = Tolerance(max_abs=1e-5)
CONSTANTS = FreezeLayerNormSpec(mode=LayerNormMode.constants)


def _out(model, inputs):
    with torch.no_grad():
        return model(**inputs).numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_constants_mode(family):
    case = build_case(family)
    eps = {n: m.eps for n, m in case.model.named_modules() if isinstance(m, nn.LayerNorm)}
    model, report = freeze_layernorm(case.model, case.inputs, CONSTANTS)
    assert report.found == report.changed == report.count("constants") == len(eps)
    for name, m in model.named_modules():
        if isinstance(m, nn.LayerNorm):
            assert m.weight is None and m.bias is None and not list(m.parameters())
            assert m.eps == eps[name.removesuffix(".norm")]  # eps is kept
        if isinstance(m, LayerNormConstants):
            buffers = dict(m.named_buffers(recurse=False))
            assert "gamma" in buffers and not list(m.parameters())
    for i in range(4):
        inputs = case.make_inputs(i)
        assert compare(_out(case.model, inputs), _out(model, inputs), TOL)


def test_fold_arithmetic_on_seed_model():
    ref = seed_vit()
    model, report = freeze_layernorm(ref, {"x": torch.randn(2, 3, 32, 32)})
    assert report.count("fold") == 5 and report.count("constants") == 0
    norm = ref.blocks[0].norm1
    g, b = norm.weight.detach().double(), norm.bias.detach().double()
    for proj in ("q", "k", "v"):
        before = getattr(ref.blocks[0].attn, proj)
        after = getattr(model.blocks[0].attn, proj)
        w = before.weight.detach().double()
        torch.testing.assert_close(after.weight.double(), (w * g).float().double(), rtol=0, atol=0)
        torch.testing.assert_close(after.bias.double(), (before.bias.double() + w @ b).float().double(), rtol=0, atol=0)
    # the LayerNorm keeps its eps and loses its affine; the head took the final norm
    assert model.blocks[0].norm1.weight is None and model.blocks[0].norm1.eps == 1e-6
    assert "model.head" not in report.changes[-1].detail and "head" in report.changes[-1].detail


def test_fold_falls_back_with_reasons_on_post_norm_bert():
    case = build_case("hf_bert_eager")
    _, report = freeze_layernorm(case.model, case.inputs)
    assert report.count("constants") == 5 and report.count("fold") == 0
    details = {c.site.rsplit(".", 2)[-2] if "LayerNorm" in c.site else c.site: c.detail for c in report.changes}
    assert all(d.startswith("fold impossible: ") for d in details.values())
    # the residual add after the embeddings / attention output, and the encoder output itself
    joined = " | ".join(details.values())
    assert "feeds add" in joined and "model output" in joined


def test_second_run_finds_nothing_to_freeze_and_inplace():
    case = build_case("seed")
    model, first = freeze_layernorm(case.model, case.inputs)
    again, second = freeze_layernorm(model, case.inputs, inplace=True)
    assert again is model
    assert second.found == first.found == 5 and second.changed == 0
    assert {s.reason for s in second.skipped} == {"no elementwise affine (nothing to freeze)"}


def test_disabled_returns_the_model_itself():
    case = build_case("seed")
    model, report = freeze_layernorm(case.model, case.inputs, FreezeLayerNormSpec(enabled=False))
    assert model is case.model and report.found == 0 and report.notes == ["disabled by the recipe"]


class NormZoo(nn.Module):
    """One of every LayerNorm flavour: nn, timm (plain, Fp32, 2d), Hugging Face ConvNext (both
    layouts) and Nemotron's ``weight + 1`` LayerNorm, which cannot be frozen generically."""

    def __init__(self):
        super().__init__()
        from timm.layers import LayerNorm, LayerNorm2d, LayerNormFp32
        from transformers.models.convnext.modeling_convnext import ConvNextLayerNorm
        from transformers.models.nemotron.modeling_nemotron import NemotronLayerNorm1P

        c = 16
        self.stem = nn.Conv2d(3, c, 4, 4)
        self.ln2d = LayerNorm2d(c)
        self.cnx_first = ConvNextLayerNorm(c, data_format="channels_first")
        self.timm_ln, self.fc_a = LayerNorm(c), nn.Linear(c, c)
        self.fp32, self.fc_b = LayerNormFp32(c), nn.Linear(c, c)
        self.cnx_last, self.fc_c = ConvNextLayerNorm(c), nn.Linear(c, c)
        self.nobias, self.fc_d = nn.LayerNorm(c, bias=False), nn.Linear(c, c)
        self.needs_bias, self.fc_e = nn.LayerNorm(c), nn.Linear(c, c, bias=False)
        self.plain_noaffine, self.fc_f = nn.LayerNorm(c, elementwise_affine=False), nn.Linear(c, c)
        self.nemo, self.fc_g = NemotronLayerNorm1P(c), nn.Linear(c, c)
        self.head = nn.Linear(c, 4)

    def forward(self, x):
        h = self.cnx_first(self.ln2d(self.stem(x)))
        t = h.flatten(2).transpose(1, 2)
        for norm, fc in ((self.timm_ln, self.fc_a), (self.fp32, self.fc_b), (self.cnx_last, self.fc_c), (self.nobias, self.fc_d),
                         (self.needs_bias, self.fc_e), (self.plain_noaffine, self.fc_f), (self.nemo, self.fc_g)):
            t = t + fc(norm(t))
        return self.head(t.mean(1))


@pytest.mark.parametrize("mode", [LayerNormMode.fold, LayerNormMode.constants])
def test_layernorm_subclasses(mode):
    from passes_zoo import randomise_layernorms

    torch.manual_seed(0)
    zoo = randomise_layernorms(NormZoo().eval())
    adapter = OutputAdapter(zoo, ["x"], keyword=False).eval()
    inputs = {"x": torch.randn(2, 3, 16, 16)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, report = freeze_layernorm(adapter, inputs, FreezeLayerNormSpec(mode=mode))
    actions = {c.site.removeprefix("model."): c.action for c in report.changes}
    skipped = {s.site.removeprefix("model."): s.reason for s in report.skipped}
    assert report.found == 9
    assert skipped["plain_noaffine"].startswith("no elementwise affine")
    assert "nemo" in skipped and "NemotronLayerNorm1P" in skipped["nemo"]  # honest: not frozen
    # channels-first norms never fold (constants along axis 1); the rest fold in fold mode
    assert actions["ln2d"] == actions["cnx_first"] == "constants"
    expected = "fold" if mode == LayerNormMode.fold else "constants"
    for name in ("timm_ln", "fp32", "cnx_last", "nobias", "needs_bias"):
        assert actions[name] == expected, (name, report.to_dict())
    if mode == LayerNormMode.fold:
        assert model.model.fc_e.bias is not None  # beta needed a bias the Linear did not have
        assert model.model.ln2d.channel_axis == 1
    for seed in range(8):
        x = {"x": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(seed))}
        assert compare(_out(adapter, x), _out(model, x), TOL)


class TiedHead(nn.Module):
    """A head whose weight is the embedding table (weight tying): folding into it would change the
    embedding lookup too."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 20)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.norm(self.emb(ids))[:, 0])


def test_tied_weights_are_not_folded():
    from passes_zoo import randomise_layernorms

    torch.manual_seed(0)
    model = OutputAdapter(randomise_layernorms(TiedHead().eval()), ["ids"], keyword=False)
    inputs = {"ids": torch.randint(0, 20, (2, 5))}
    out, report = freeze_layernorm(model, inputs)
    assert report.count("constants") == 1
    assert "tied weights" in report.changes[0].detail
    assert compare(_out(model, inputs), _out(out, inputs), TOL)


class OwnBias(nn.Module):
    """Like timm EVA / BEiT: the Linear's weight with a bias of the attention's own (q_bias, v_bias)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.qkv = nn.Linear(16, 48, bias=False)
        self.q_bias = nn.Parameter(torch.randn(48))

    def forward(self, x):
        return nn.functional.linear(self.norm(x), self.qkv.weight, self.q_bias)


class ChannelsFirstHead(nn.Module):
    """Like timm MaxViT's head: pool, a channels-first LayerNorm2d, flatten, a Linear."""

    def __init__(self):
        super().__init__()
        from timm.layers import LayerNorm2d

        self.conv = nn.Conv2d(3, 8, 4, 4)
        self.norm = LayerNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        return self.head(self.norm(self.pool(self.conv(x))).flatten(1))


@pytest.mark.parametrize("model_cls, shape, reason", [
    (OwnBias, (2, 5, 16), "is called with a bias that is not its own"),
    (ChannelsFirstHead, (2, 3, 16, 16), "does not compute a last-axis layer_norm"),
])
def test_fold_declines_what_it_cannot_fold(model_cls, shape, reason):
    from passes_zoo import randomise_layernorms

    torch.manual_seed(0)
    model = OutputAdapter(randomise_layernorms(model_cls().eval()), ["x"], keyword=False)
    with torch.no_grad():  # LayerNorm2d: non-trivial affine too
        for m in model.modules():
            if type(m).__name__ == "LayerNorm2d":
                m.weight.uniform_(0.5, 1.5), m.bias.normal_()
    inputs = {"x": torch.randn(*shape)}
    out, report = freeze_layernorm(model, inputs)
    assert report.changed == 1 and report.count("constants") == 1, report.to_dict()
    assert reason in report.changes[0].detail
    for seed in range(4):
        x = {"x": torch.randn(*shape, generator=torch.Generator().manual_seed(seed))}
        assert compare(_out(model, x), _out(out, x), TOL)
