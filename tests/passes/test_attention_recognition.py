"""The generic recogniser's parts: mask vs bias, the HF mask function, fused slices, the runtime plan."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from passes_zoo import _Heads, build_case, token_case, token_inputs
from vitexport.parity.metrics import compare
from vitexport.passes import fuse_qkv, mask_to_where
from vitexport.passes._probe import probe_inputs
from vitexport.passes.attention import fuse_projections, find_patterns
from vitexport.passes.attention.observation import observe
from vitexport.recipe import Tolerance
from vitexport.sources import OutputAdapter


class Terms(_Heads):
    """One attention whose logits get a term chosen by ``kind``."""

    def __init__(self, kind: str, dim: int = 16, heads: int = 2, tokens: int = 6):
        super().__init__(dim, heads)
        self.kind = kind
        window = torch.zeros(tokens, tokens)
        window[:3, 3:] = window[3:, :3] = -100.0  # two windows, Swin-style
        self.register_buffer("window", window)
        self.table = nn.Parameter(torch.zeros(heads, tokens, tokens))  # zero-initialised, like timm relpos
        dist = (torch.arange(tokens)[:, None] - torch.arange(tokens)[None, :]).abs().float()
        self.register_buffer("local", torch.where(dist <= 2, -0.1 * dist, float("-inf")))

    def forward(self, x, pad):
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        attn = q @ k.transpose(-2, -1) * self.scale
        if self.kind == "learned_zero_bias":
            attn = attn + self.table
        elif self.kind == "constant_mask":
            attn = attn + self.window
        elif self.kind == "input_mask":
            attn = attn + (1.0 - pad.float())[:, None, None, :] * -1e4
        elif self.kind == "bias_plus_mask":  # a mask added to a learned bias before it reaches the logits
            attn = attn + (self.table + 0.5 + self.window)
        elif self.kind == "mask_with_bias":
            attn = attn + self.local
        return self.merge(attn.softmax(-1) @ v)


@pytest.mark.parametrize("kind, role, source, split", [
    ("learned_zero_bias", "bias", "parameter", False),  # the false positive: zeros are no mask
    ("constant_mask", "mask", "constant", False),
    ("input_mask", "mask", "input", False),
    ("bias_plus_mask", "mask+bias", "parameter", True),
    ("mask_with_bias", "mask+bias", "constant", False),
])
def test_masks_and_biases_are_told_apart(kind, role, source, split):
    torch.manual_seed(0)
    model = OutputAdapter(Terms(kind).eval(), ["x", "pad"], keyword=False)
    pad = torch.ones(2, 6, dtype=torch.bool)
    pad[1, 4:] = False
    inputs = {"x": torch.randn(2, 6, 16), "pad": pad}
    (pattern,) = find_patterns(observe(model, probe_inputs(inputs)))
    (term,) = pattern.terms
    assert (term.role, term.source, term.split is not None) == (role, source, split)
    where, report = mask_to_where(model, inputs)
    assert report.found == report.changed == (role != "bias")
    assert report.stats["biases"] == (role == "bias")
    x = {"x": torch.randn(2, 6, 16), "pad": pad}
    with torch.no_grad():
        assert compare(model(**x).numpy(), where(**x).numpy(), Tolerance(max_abs=1e-5))


def test_hf_boolean_mask_is_the_padding_input():
    from transformers.masking_utils import bidirectional_mask_function, causal_mask_function, sdpa_mask

    from vitexport.passes.attention.hf_interface import boolean_mask

    pad = torch.ones(2, 5, dtype=torch.bool)
    pad[0, 3:] = False
    mask = boolean_mask(2, 5, 5, mask_function=bidirectional_mask_function, attention_mask=pad, allow_is_bidirectional_skip=True)
    assert mask.shape == (2, 1, 1, 5) and torch.equal(mask[:, 0, 0], pad)
    # nothing padded: no mask at all (outside an export), as transformers' own sdpa mask does
    assert boolean_mask(2, 5, 5, mask_function=bidirectional_mask_function, attention_mask=torch.ones(2, 5, dtype=torch.bool),
                        allow_is_bidirectional_skip=True) is None
    # every other pattern is transformers' own boolean mask, always built
    causal = boolean_mask(2, 5, 5, mask_function=causal_mask_function, attention_mask=pad)
    assert torch.equal(causal, sdpa_mask(2, 5, 5, mask_function=causal_mask_function, attention_mask=pad, allow_is_causal_skip=False))


def test_hf_models_switch_through_the_attention_registry():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    case = build_case("hf_bert_eager")
    model, report = mask_to_where(case.model, case.inputs)
    assert "vitexport" in ALL_ATTENTION_FUNCTIONS
    assert model.model.config._attn_implementation == "vitexport"
    assert any("set_attn_implementation('vitexport')" in n for n in report.notes)
    attn = model.model.encoder.layer[0].attention.self
    assert "forward" not in vars(attn) and attn.vitexport_mask == "mask"  # its own forward, a plan attribute


class TwoInputs(_Heads):
    def forward(self, x, y):
        return self.merge((self.split(self.q(x)) @ self.split(self.k(y)).transpose(-2, -1)).softmax(-1) @ self.split(self.v(x)))


def test_fused_slices_stay_correct_for_other_inputs():
    torch.manual_seed(0)
    attn = TwoInputs(16, 2).eval()
    ref = TwoInputs(16, 2).eval()
    ref.load_state_dict(attn.state_dict())
    fuse_projections(attn, ["q", "k", "v"])  # k reads another tensor: its slice computes its own product
    x, y = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    runs = []
    attn.qkv.register_forward_hook(lambda *a: runs.append(1))
    with torch.no_grad():
        assert torch.allclose(attn(x, y), ref(x, y), atol=1e-6)
        assert len(runs) == 3  # q(x), k(y), v(x): no slice was taken from another input's product
        runs.clear()
        assert torch.allclose(attn(x, x), ref(x, x), atol=1e-6)
        assert len(runs) == 1  # one input: one product for all three


def test_rewritten_attention_runs_unchanged_where_the_plan_does_not_fit():
    case = token_case("fill")
    where, _ = mask_to_where(case.model, case.inputs)
    # another sequence length: the mask no longer has the observed shape, so the original op runs
    x = token_inputs(3, tokens=7)
    with torch.no_grad():
        assert torch.equal(case.model(**x), where(**x))
    misses = [m.vitexport_rewrite.misses for m in where.modules() if hasattr(m, "vitexport_rewrite")]
    assert misses and all(n >= 1 for n in misses)


def test_fuse_then_where_then_fuse_again_on_hf():
    case = build_case("hf_vit_sdpa")
    fused, first = fuse_qkv(case.model, case.inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, again = fuse_qkv(fused, case.inputs)
    assert first.changed == 2 and again.changed == 0 and again.stats["already_fused"] == 2
