"""mask_to_where on every kind of mask: buffers, arguments, computed masks, booleans, SDPA, MHA."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from passes_zoo import (
    _producers,
    build_case,
    export_onnx,
    float_mask_adds,
    onnx_constants,
    run_onnx,
    softmax_mask_producers,
    swin_dynamic_case,
    timm_masked_case,
    token_case,
    token_inputs,
)
from vitexport.parity.metrics import compare
from vitexport.passes import fuse_qkv, mask_to_where
from vitexport.recipe import Tolerance

pytestmark = pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")  # the MHA test model mixes bool and float masks on purpose
MASK_TOL = Tolerance(max_abs=1e-5, exact_unmasked=True)
EXPORT_TOL = Tolerance(max_abs=1e-4)
VARIANT_BUILDERS = {
    "tokens_fill": lambda: token_case("fill"),
    "tokens_sdpa": lambda: token_case("sdpa"),
    "tokens_bias": lambda: token_case("bias"),
    "tokens_mha": lambda: token_case("mha"),
    "timm_vit_masked": timm_masked_case,
    "timm_swin_dynamic": swin_dynamic_case,
}


def _out(model, inputs):
    with torch.no_grad():
        return model(**inputs).numpy()


@pytest.fixture(scope="module", params=sorted(VARIANT_BUILDERS))
def variant(request):
    case = VARIANT_BUILDERS[request.param]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, report = mask_to_where(case.model, case.inputs)
    return case, model, report


def test_variant_counts_and_parity(variant):
    case, model, report = variant
    assert (report.found, report.changed) == (case.expect["mask_to_where"]["found"], case.expect["mask_to_where"]["changed"]), report.to_dict()
    for i in range(4):  # x batch 2 = 8 inputs, each with its own mask
        inputs = case.make_inputs(i)
        ref, out = _out(case.model, inputs), _out(model, inputs)
        unmasked = case.unmasked(inputs, ref) if case.unmasked else np.ones(ref.shape, bool)
        # Padded query rows whose keys are all masked legitimately change (PyTorch's fast MHA path
        # gives them zero weights, -inf masks give NaN, the where gives a uniform row): the
        # contract is on unmasked positions, so the gate is taken there.
        result = compare(ref[unmasked], out[unmasked], MASK_TOL)
        assert result, (i, result.failed_check)
        assert np.isfinite(out).all()


def test_variant_onnx(variant):
    case, model, report = variant
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = export_onnx(model, case.inputs)
    assert softmax_mask_producers(proto).count("Where") == report.changed
    assert float_mask_adds(proto) == 0
    for i in range(4):
        inputs = case.make_inputs(i)
        assert compare(_out(model, inputs), run_onnx(proto, inputs), EXPORT_TOL)


@pytest.mark.parametrize("kind", ["fill", "sdpa", "bias", "mha"])
def test_fully_masked_row_is_not_nan(kind):
    case = token_case(kind)
    model, _ = mask_to_where(case.model, case.inputs)
    inputs = token_inputs(0, full_row=True)
    out = _out(model, inputs)
    assert np.isfinite(out).all()
    ref = _out(case.model, inputs)  # the original may well be NaN there (-inf masks); rows that
    keep = inputs["padding_mask"].numpy()  # have real tokens still match
    assert compare(ref[keep], out[keep], Tolerance(max_abs=1e-5))


def _where_condition_inputs(proto):
    """For each Softmax fed by a Where: (graph inputs its condition reads, ops on the way)."""
    prod = _producers(proto)
    inputs = {i.name for i in proto.graph.input}
    found = []
    for n in proto.graph.node:
        if n.op_type != "Softmax":
            continue
        src = prod.get(n.input[0])
        while src is not None and src.op_type in {"Reshape", "Cast", "Identity", "Transpose", "Squeeze", "Unsqueeze"}:
            src = prod.get(src.input[0])
        if src is None or src.op_type != "Where":
            continue
        reached, ops, todo, seen = set(), set(), [src.input[0]], set()
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            if t in inputs:
                reached.add(t)
            elif t in prod:
                ops.add(prod[t].op_type)
                todo.extend(prod[t].input)
        found.append((reached, ops))
    return found


def test_text_encoder_where_reads_the_boolean_from_attention_mask():
    paths = {}
    for impl in ("eager", "sdpa"):
        case = build_case(f"hf_bert_{impl}")
        model, report = mask_to_where(case.model, case.inputs)
        assert report.changed == 2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = _where_condition_inputs(export_onnx(model, case.inputs))
        assert len(found) == 2 and all(r == {"attention_mask"} for r, _ in found)
        # no float round trip: the eager 0 / finfo.min tensor is not built and compared back
        assert all("Greater" not in ops for _, ops in found)
        paths[impl] = found
        # the caller's model keeps its own config
        assert case.model.model.config._attn_implementation == impl
    assert paths["eager"] == paths["sdpa"]


def test_seed_mask_buffer_becomes_a_boolean_constant():
    case = build_case("seed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        before = export_onnx(case.model, case.inputs)
        model, report = mask_to_where(case.model, case.inputs)
        after = export_onnx(model, case.inputs)
    assert float_mask_adds(before) == 2 and float_mask_adds(after) == 0
    attn = model.model.blocks[0].attn
    assert "forward" not in vars(attn) and attn.vitexport_where  # its own code runs, under a hook
    assert all(c.detail == "observed: additive mask (constant)" for c in report.changes)
    # the float mask only decides which logits are kept: folded, it is a boolean constant
    import onnxsim

    simplified, ok = onnxsim.simplify(after)
    consts = onnx_constants(simplified)
    conds = [consts.get(n.input[0]) for n in simplified.graph.node if n.op_type == "Where"]
    assert ok and len(conds) == 2 and all(c is not None and c.dtype == bool and not c.all() for c in conds)


@pytest.mark.parametrize("name", ["seed", "timm_swin", "hf_bert_sdpa"])
def test_second_run_reports_already_where(name):
    case = build_case(name)
    model, first = mask_to_where(case.model, case.inputs)
    _, second = mask_to_where(model, case.inputs)
    assert second.found == first.found > 0 and second.changed == 0
    assert {s.reason for s in second.skipped} == {"already applies its mask with torch.where"}


def test_unmasked_models_report_no_sites():
    case = build_case("tv_vit")
    model, report = mask_to_where(case.model, case.inputs)
    assert report.found == report.changed == 0
    assert report.summary().startswith("mask_to_where: no sites found")
    assert "2 attention module(s) recognised, none receives a mask" in report.notes


@pytest.mark.parametrize("kind", ["fill", "bias"])
def test_order_fuse_then_where(kind):
    case = token_case(kind)
    fused, _ = fuse_qkv(case.model, case.inputs)
    model, report = mask_to_where(fused, case.inputs)
    assert report.changed == 2
    for i in range(4):
        inputs = case.make_inputs(i)
        ref, out = _out(case.model, inputs), _out(model, inputs)
        keep = case.unmasked(inputs, ref)
        assert compare(ref[keep], out[keep], MASK_TOL)


class StyledAttention(torch.nn.Module):
    """The same attention written the ways people write it; the traced pattern must see all of them."""

    def __init__(self, style: str, dim: int = 32, heads: int = 4, tokens: int = 10):
        super().__init__()
        self.style, self.heads, self.hd = style, heads, dim // heads
        self.scale = self.hd**-0.5
        if style == "chunked_qkv":
            self.qkv = torch.nn.Linear(dim, 3 * dim)
        else:
            self.q, self.k, self.v = (torch.nn.Linear(dim, dim) for _ in range(3))
        self.proj = torch.nn.Linear(dim, dim)
        self.drop = torch.nn.Dropout(0.1)
        self.softmax = torch.nn.Softmax(dim=-1)
        keep = torch.ones(tokens)
        keep[-3:] = 0
        self.register_buffer("keep01", keep)  # 1 = real token
        self.register_buffer("additive", torch.where(keep.bool(), 0.0, float("-inf")))  # shape (N,)

    def _split(self, t):
        B, N, _ = t.shape
        return t.view(B, N, self.heads, self.hd).transpose(1, 2)

    def forward(self, x):
        if self.style == "chunked_qkv":
            q, k, v = self.qkv(x).chunk(3, dim=-1)  # fx unpacks this (not a generator over it)
            q, k, v = self._split(q), self._split(k), self._split(v)
        else:
            q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        attn = torch.matmul(q, k.transpose(-2, -1))
        if self.style == "iadd":
            attn = attn * self.scale
            attn += self.additive
            attn = torch.nn.functional.softmax(attn, dim=-1)
        elif self.style == "softmax_module":
            attn = self.softmax(attn.masked_fill(self.keep01 == 0, float("-inf")) * self.scale)
        elif self.style == "inplace_fill":
            attn = attn * self.scale
            attn.masked_fill_(self.keep01 == 0, -1e9)
            attn = attn.softmax(-1)
        else:  # chunked_qkv
            attn = (attn * self.scale + self.additive).softmax(-1)
        attn = self.drop(attn)
        out = (attn @ v).transpose(1, 2).flatten(2)
        return self.proj(out)


class StyledModel(torch.nn.Module):
    def __init__(self, style):
        super().__init__()
        self.attn = StyledAttention(style)

    def forward(self, x):
        return x + self.attn(x)


@pytest.mark.parametrize("style", ["iadd", "softmax_module", "inplace_fill", "chunked_qkv"])
def test_traced_attention_styles(style):
    from vitexport.sources import OutputAdapter

    torch.manual_seed(0)
    model = OutputAdapter(StyledModel(style).eval(), ["x"], keyword=False)
    inputs = {"x": torch.randn(2, 10, 32)}
    where, report = mask_to_where(model, inputs)
    assert (report.found, report.changed) == (1, 1), report.to_dict()
    fused, freport = fuse_qkv(where, inputs)
    assert freport.found == 1 and freport.changed == (0 if style == "chunked_qkv" else 1), freport.to_dict()
    for seed in range(8):
        x = {"x": torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(seed))}
        ref, out = _out(model, x), _out(fused, x)
        assert compare(ref, out, Tolerance(max_abs=1e-5)), style
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = export_onnx(fused, inputs)
    assert softmax_mask_producers(proto) == ["Where"] and float_mask_adds(proto) == 0
