"""Tiny random-weight models of every family the passes support, their inputs, and ONNX helpers.

Everything is built offline (``pretrained=False`` / configs), small enough that the whole
``tests/passes`` run stays within a few minutes on two shared CPU cores.
"""
from __future__ import annotations

import io
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from vitexport.export import export_onnx as pipeline_export
from vitexport.passes import PassReport, freeze_layernorm, fuse_qkv, mask_to_where
from vitexport.recipe import FreezeLayerNormSpec, LayerNormMode
from vitexport.sources import OutputAdapter
from vitexport.targets import load_recipe

__all__ = [
    "Case",
    "FAMILIES",
    "build_case",
    "SeedViT",
    "seed_vit",
    "export_onnx",
    "run_onnx",
    "onnx_constants",
    "qkv_matmul_count",
    "separate_qkv_groups",
    "layernorm_affines",
    "softmax_mask_producers",
    "float_mask_adds",
    "randomise_layernorms",
    "TokenModel",
    "token_inputs",
    "token_case",
    "timm_masked_case",
    "swin_dynamic_case",
    "UntraceableAttention",
    "UntraceableModel",
]


# --------------------------------------------------------------------------------------------------
# The seed-style custom model: separate q/k/v, einsum attention, additive 0 / -1e9 key-padding buffer.
# --------------------------------------------------------------------------------------------------
PASS_ORDER = ("freeze_layernorm", "mask_to_where", "fuse_qkv")


class SeedAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, num_tokens: int, num_padded: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        mask = torch.zeros(1, 1, 1, num_tokens)
        if num_padded:
            mask[..., -num_padded:] = -1e9  # padded tokens are never attended to
        self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        q = self.q(x).reshape(B, N, self.num_heads, self.head_dim).permute(0, 2, 1, 3)
        k = self.k(x).reshape(B, N, self.num_heads, self.head_dim).permute(0, 2, 1, 3)
        v = self.v(x).reshape(B, N, self.num_heads, self.head_dim).permute(0, 2, 1, 3)
        attn = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale
        attn = attn + self.mask
        attn = attn.softmax(dim=-1)
        x = torch.einsum("bhij,bhjd->bhid", attn, v)
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class SeedMlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class SeedBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, num_tokens: int, num_padded: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = SeedAttention(dim, num_heads, num_tokens, num_padded)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = SeedMlp(dim, dim * 4)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class SeedViT(nn.Module):
    """A tiny pre-norm ViT; the last ``num_padded`` tokens are padding that no query attends to."""

    def __init__(self, img_size=32, patch=8, dim=32, depth=2, num_heads=4, num_classes=10, num_padded=3):
        super().__init__()
        n = (img_size // patch) ** 2
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.ModuleList([SeedBlock(dim, num_heads, n + 1, num_padded) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


def randomise_layernorms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial gamma / beta everywhere, so a wrong fold cannot hide behind ones and zeros."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm) and m.weight is not None:
                m.weight.copy_(0.5 + torch.rand(m.weight.shape, generator=g))
                if m.bias is not None:
                    m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))
    return model


def seed_vit(**kw) -> SeedViT:
    torch.manual_seed(0)
    return randomise_layernorms(SeedViT(**kw).eval())


# --------------------------------------------------------------------------------------------------
# Cases: one per family.
# --------------------------------------------------------------------------------------------------
@dataclass
class Case:
    """A family's model, inputs, and the site counts the passes must report for it.

    ``expect``: pass name -> dict of expected numbers: ``found``, ``changed``, and per action counts
    (``fold``, ``constants``, ``where``, ``fuse``).
    """

    name: str
    model: nn.Module
    make_inputs: Callable[[int], dict[str, torch.Tensor]]  # variant index -> inputs
    blocks: int
    expect: dict[str, dict[str, int]]
    unmasked: Callable[[dict[str, torch.Tensor], torch.Tensor], np.ndarray] | None = None
    extra: dict = field(default_factory=dict)

    @property
    def inputs(self) -> dict[str, torch.Tensor]:
        return self.make_inputs(0)


def first_output_adapter(model: nn.Module, input_names: list[str], example: dict[str, torch.Tensor],
                         keyword: bool = True) -> OutputAdapter:
    """The adapter the pipeline builds, keeping only the model's first tensor output: the passes' tests
    compare one output (a Hugging Face base model also returns ``pooler_output``, a distilled DeiT three
    logits); the export of every output is tests/test_outputs.py's."""
    probe = OutputAdapter(model, input_names, keyword=keyword).eval()
    with torch.no_grad():
        probe(**example)
    return OutputAdapter(model, input_names, keyword=keyword, outputs=probe.model_output_names[:1]).eval()


def _images(i: int, batch: int = 2, size: int = 32) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(100 + i))


def _image_case(name, model, key, blocks, expect, keyword=False) -> Case:
    model = randomise_layernorms(model.eval())
    adapter = first_output_adapter(model, [key], {key: _images(0)}, keyword=keyword)
    return Case(name, adapter, lambda i: {key: _images(i)}, blocks, expect)


def _timm(name: str, **kw) -> nn.Module:
    import timm

    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, num_classes=10, **kw)


def _hf_image(kind: str, impl: str) -> nn.Module:
    from transformers import DeiTConfig, DeiTForImageClassificationWithTeacher, ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8, num_labels=10, attn_implementation=impl)
    if kind == "vit":
        return ViTForImageClassification(ViTConfig(**cfg))
    return DeiTForImageClassificationWithTeacher(DeiTConfig(**cfg))


def _bert_case(impl: str) -> Case:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32, attn_implementation=impl,
    )
    model = randomise_layernorms(BertModel(cfg).eval())
    adapter = OutputAdapter(model, ["input_ids", "attention_mask"], outputs=["last_hidden_state"]).eval()
    seq = 12

    def make(i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(200 + i)
        ids = torch.randint(0, 100, (2, seq), generator=g)
        mask = torch.ones(2, seq, dtype=torch.long)
        # every variant pads differently (variant 0 pads nothing: what a source's example looks like)
        for row, keep in enumerate(((seq, seq - 3), (seq - 1, 5), (4, seq), (seq - 6, seq - 2), (7, 9), (seq, 2), (10, 1), (3, 11))[i % 8]):
            mask[row, keep:] = 0
        return {"input_ids": ids, "attention_mask": mask}

    def unmasked(inputs, out):
        keep = inputs["attention_mask"].bool().numpy()[:, :, None]
        return np.broadcast_to(keep, out.shape)

    expect = {
        "freeze_layernorm": {"found": 5, "changed": 5, "fold": 0, "constants": 5},
        "mask_to_where": {"found": 2, "changed": 2},
        "fuse_qkv": {"found": 2, "changed": 2},
    }
    return Case(f"hf_bert_{impl}", adapter, make, 2, expect, unmasked)


def _seed_case() -> Case:
    model = seed_vit()
    adapter = OutputAdapter(model, ["x"], keyword=False).eval()
    expect = {
        "freeze_layernorm": {"found": 5, "changed": 5, "fold": 5, "constants": 0},
        "mask_to_where": {"found": 2, "changed": 2},
        "fuse_qkv": {"found": 2, "changed": 2},
    }
    return Case("seed", adapter, lambda i: {"x": _images(i)}, 2, expect)


_VIT_LIKE = {
    "freeze_layernorm": {"found": 5, "changed": 5, "fold": 5, "constants": 0},
    "mask_to_where": {"found": 0, "changed": 0},
    "fuse_qkv": {"found": 2, "changed": 0},
}
_HF_VIT_LIKE = {**_VIT_LIKE, "fuse_qkv": {"found": 2, "changed": 2}}


def build_case(name: str) -> Case:
    """Build the named family's case (fresh model every call)."""
    if name == "timm_vit":
        return _image_case(name, _timm("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2), "x", 2, _VIT_LIKE)
    if name == "timm_deit":
        return _image_case(name, _timm("deit_tiny_distilled_patch16_224", img_size=32, patch_size=8, depth=2), "x", 2, _VIT_LIKE)
    if name == "timm_swin":
        # 8x8 tokens, 4x4 windows: stage 0 has a shifted block (its mask), stage 1 (4x4) does not shift.
        m = _timm("swin_tiny_patch4_window7_224", img_size=32, window_size=4, depths=(2, 2), num_heads=(2, 4), embed_dim=32)
        expect = {
            # patch_embed.norm feeds the first residual: constants; the other 10 fold.
            "freeze_layernorm": {"found": 11, "changed": 11, "fold": 10, "constants": 1},
            "mask_to_where": {"found": 1, "changed": 1},
            "fuse_qkv": {"found": 4, "changed": 0},
        }
        return _image_case(name, m, "x", 4, expect)
    if name in ("hf_vit_eager", "hf_vit_sdpa"):
        return _image_case(name, _hf_image("vit", name.rsplit("_", 1)[1]), "pixel_values", 2, _HF_VIT_LIKE, keyword=True)
    if name == "hf_deit":
        return _image_case(name, _hf_image("deit", "eager"), "pixel_values", 2, _HF_VIT_LIKE, keyword=True)
    if name in ("hf_bert_eager", "hf_bert_sdpa"):
        return _bert_case(name.rsplit("_", 1)[1])
    if name == "tv_vit":
        import torchvision

        torch.manual_seed(0)
        m = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=10)
        nn.init.normal_(m.heads.head.weight, std=0.2)  # torchvision zero-initialises the head: all-zero logits prove nothing
        return _image_case(name, m, "x", 2, _VIT_LIKE)
    if name == "seed":
        return _seed_case()
    raise KeyError(name)


FAMILIES = ("timm_vit", "timm_deit", "timm_swin", "hf_vit_eager", "hf_vit_sdpa", "hf_deit", "hf_bert_eager", "hf_bert_sdpa", "tv_vit", "seed")


# --------------------------------------------------------------------------------------------------
# ONNX: export with the TorchScript exporter (what the pipeline uses), run, inspect.
# --------------------------------------------------------------------------------------------------
def export_onnx(model: nn.Module, inputs: dict[str, torch.Tensor]) -> onnx.ModelProto:
    """Opset 17 with the TorchScript exporter; a model that needs a newer opset (VOLO's fold is
    opset 18's Col2Im) goes the pipeline's way, which chooses the opset the orin contract allows."""
    buf = io.BytesIO()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model, tuple(inputs.values()), buf, input_names=list(inputs), output_names=["output"], opset_version=17, dynamo=False
            )
    except torch.onnx.errors.UnsupportedOperatorError:
        recipe = load_recipe("orin")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "m.onnx"
            pipeline_export(model, inputs, path, recipe.export, contract=recipe.contract)
            return onnx.load(str(path))
    return onnx.load_from_string(buf.getvalue())


def run_onnx(proto: onnx.ModelProto, inputs: dict[str, torch.Tensor]) -> np.ndarray:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feed_names = {i.name for i in sess.get_inputs()}
    return sess.run(["output"], {k: v.numpy() for k, v in inputs.items() if k in feed_names})[0]


def onnx_constants(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers, Constant-node outputs and Identity copies of them (the exporter dedups equal
    initializers through Identity) by name."""
    out = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    for n in proto.graph.node:  # topological order: an Identity's source is already known
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = numpy_helper.to_array(a.t)
        elif n.op_type == "Identity" and n.input[0] in out:
            out[n.output[0]] = out[n.input[0]]
    return out


def _producers(proto: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in proto.graph.node for o in n.output}


def _weight_matmuls(proto: onnx.ModelProto) -> list[tuple[onnx.NodeProto, np.ndarray]]:
    """MatMul / Gemm nodes whose second input is a 2-D constant (a Linear), with (in, out) weight."""
    consts = onnx_constants(proto)
    prod = _producers(proto)
    out = []
    for n in proto.graph.node:
        if n.op_type not in ("MatMul", "Gemm") or len(n.input) < 2:
            continue
        name = n.input[1]
        w = consts.get(name)
        if w is None and name in prod and prod[name].op_type == "Transpose" and prod[name].input[0] in consts:
            w = consts[prod[name].input[0]].T
        if w is None or w.ndim != 2:
            continue
        trans_b = any(a.name == "transB" and a.i == 1 for a in n.attribute) if n.op_type == "Gemm" else False
        out.append((n, w.T if trans_b else w))
    return out


def qkv_matmul_count(proto: onnx.ModelProto) -> int:
    """Linear MatMul/Gemm nodes producing q, k and v at once (output width = 3 x input width)."""
    return sum(1 for _, w in _weight_matmuls(proto) if w.shape[1] == 3 * w.shape[0])


def separate_qkv_groups(proto: onnx.ModelProto) -> int:
    """Inputs read by three or more square Linears (unfused q/k/v)."""
    readers: dict[str, int] = {}
    for n, w in _weight_matmuls(proto):
        if w.shape[0] == w.shape[1]:
            readers[n.input[0]] = readers.get(n.input[0], 0) + 1
    return sum(1 for c in readers.values() if c >= 3)


def layernorm_affines(proto: onnx.ModelProto) -> list[tuple[str, bool]]:
    """(LayerNormalization node, whether its scale/bias are the identity)."""
    consts = onnx_constants(proto)
    out = []
    for n in proto.graph.node:
        if n.op_type != "LayerNormalization":
            continue
        scale = consts.get(n.input[1]) if len(n.input) > 1 else None
        bias = consts.get(n.input[2]) if len(n.input) > 2 and n.input[2] else None
        identity = scale is not None and np.all(scale == 1) and (bias is None or np.all(bias == 0))
        out.append((n.name, bool(identity)))
    return out


_LAYOUT = {"Reshape", "Cast", "Identity", "Transpose", "Squeeze", "Unsqueeze"}


def softmax_mask_producers(proto: onnx.ModelProto) -> list[str]:
    """For each Softmax, the op that feeds it (looking through layout ops)."""
    prod = _producers(proto)
    out = []
    for n in proto.graph.node:
        if n.op_type != "Softmax":
            continue
        src = prod.get(n.input[0])
        while src is not None and src.op_type in _LAYOUT:
            src = prod.get(src.input[0])
        out.append(src.op_type if src is not None else "input")
    return out


def float_mask_adds(proto: onnx.ModelProto) -> int:
    """Adds feeding a Softmax (through layout ops) whose other operand is a constant holding a mask
    value (<= -100): the float masks a quantizer would calibrate."""
    prod = _producers(proto)
    consts = onnx_constants(proto)
    count = 0
    for n in proto.graph.node:
        if n.op_type != "Softmax":
            continue
        src = prod.get(n.input[0])
        while src is not None and src.op_type in _LAYOUT:
            src = prod.get(src.input[0])
        if src is not None and src.op_type == "Add":
            for i in src.input:
                c = consts.get(i)
                if c is not None and c.size > 1 and np.issubdtype(c.dtype, np.floating) and (c <= -100).any():
                    count += 1
    return count


# --------------------------------------------------------------------------------------------------
# Mask variants: hand-written attentions found by tracing, plus nn.MultiheadAttention and timm inputs.
# --------------------------------------------------------------------------------------------------
class _Heads(nn.Module):
    def __init__(self, dim: int, heads: int, fused: bool = False):
        super().__init__()
        self.num_heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim**-0.5
        if fused:
            self.qkv = nn.Linear(dim, 3 * dim)
        else:
            self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def split(self, t: torch.Tensor) -> torch.Tensor:
        B, N, _ = t.shape
        return t.reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)

    def merge(self, t: torch.Tensor) -> torch.Tensor:
        B, H, N, D = t.shape
        return self.proj(t.transpose(1, 2).reshape(B, N, H * D))


class FillAttention(_Heads):
    """Boolean key padding (True = real token) applied with masked_fill(-inf)."""

    def forward(self, x, pad):
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.masked_fill(~pad[:, None, None, :], float("-inf"))
        return self.merge(attn.softmax(dim=-1) @ v)


class SdpaAttention(_Heads):
    """Fused qkv + scaled_dot_product_attention with a boolean attn_mask (True = take part)."""

    def __init__(self, dim, heads):
        super().__init__(dim, heads, fused=True)

    def forward(self, x, mask):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        out = torch.nn.functional.scaled_dot_product_attention(self.split(q), self.split(k), self.split(v), attn_mask=mask)
        return self.merge(out)


class BiasAttention(_Heads):
    """A learned relative bias (data, must stay an add) and a float mask computed from an input."""

    def __init__(self, dim, heads, tokens):
        super().__init__(dim, heads)
        self.register_buffer("rel_bias", 0.1 * torch.randn(heads, tokens, tokens, generator=torch.Generator().manual_seed(3)))

    def forward(self, x, mask):
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        attn = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        attn = attn + self.rel_bias
        attn = attn + mask
        return self.merge(torch.softmax(attn, dim=-1) @ v)


class TokenModel(nn.Module):
    """LayerNorm -> attention -> residual, twice; tokens in, tokens out (unmasked rows checkable)."""

    def __init__(self, kind: str, dim: int = 32, heads: int = 4, tokens: int = 10, depth: int = 2):
        super().__init__()
        self.kind = kind
        self.norms = nn.ModuleList([nn.LayerNorm(dim) for _ in range(depth)])
        if kind == "fill":
            self.attns = nn.ModuleList([FillAttention(dim, heads) for _ in range(depth)])
        elif kind == "sdpa":
            self.attns = nn.ModuleList([SdpaAttention(dim, heads) for _ in range(depth)])
        elif kind == "bias":
            self.attns = nn.ModuleList([BiasAttention(dim, heads, tokens) for _ in range(depth)])
        elif kind == "mha":
            self.attns = nn.ModuleList([nn.MultiheadAttention(dim, heads, batch_first=True) for _ in range(depth)])
            i = torch.arange(tokens)
            dist = (i[:, None] - i[None, :]).abs().float()
            local = torch.where(dist <= 3, -0.2 * dist, torch.tensor(float("-inf")))  # a bias and a mask in one
            self.register_buffer("local", local)
        self.head = nn.Linear(dim, 5)

    def forward(self, x, padding_mask):
        for norm, attn in zip(self.norms, self.attns):
            h = norm(x)
            if self.kind == "fill":
                h = attn(h, padding_mask)
            elif self.kind == "sdpa":
                h = attn(h, padding_mask.bool()[:, None, None, :])
            elif self.kind == "bias":
                h = attn(h, (1.0 - padding_mask.float())[:, None, None, :] * -10000.0)
            else:
                h, _ = attn(h, h, h, key_padding_mask=~padding_mask, attn_mask=self.local, need_weights=False)
            x = x + h
        return self.head(x)


def token_inputs(i: int, tokens: int = 10, dim: int = 32, batch: int = 2, full_row: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(300 + i)
    x = torch.randn(batch, tokens, dim, generator=g)
    mask = torch.ones(batch, tokens, dtype=torch.bool)
    for row in range(batch):
        keep = int(torch.randint(2, tokens + 1, (1,), generator=g))
        mask[row, keep:] = False
    if full_row:
        mask[-1] = False  # a sample that is all padding
    return {"x": x, "padding_mask": mask}


def token_case(kind: str) -> Case:
    torch.manual_seed(0)
    model = randomise_layernorms(TokenModel(kind).eval())
    adapter = OutputAdapter(model, ["x", "padding_mask"], keyword=False).eval()

    def unmasked(inputs, out):
        return np.broadcast_to(inputs["padding_mask"].numpy()[:, :, None], out.shape)

    # The first norm of each block folds into q/k/v (or in_proj); a fused qkv is reported as such.
    fuse = {"found": 2, "changed": 0 if kind in ("sdpa", "mha") else 2}
    expect = {"mask_to_where": {"found": 2, "changed": 2}, "fuse_qkv": fuse}
    return Case(f"tokens_{kind}", adapter, token_inputs, 2, expect, unmasked)


def timm_masked_case() -> Case:
    """timm ViT fed an ``attn_mask`` input: the fused-SDPA path with a boolean mask."""
    model = randomise_layernorms(_timm("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2).eval())
    adapter = OutputAdapter(model, ["x", "attn_mask"], keyword=False).eval()

    def make(i: int) -> dict[str, torch.Tensor]:
        mask = torch.ones(2, 1, 1, 17, dtype=torch.bool)
        mask[0, ..., 17 - (i % 5) - 1 :] = False  # drop some patch tokens as keys; the class token stays
        return {"x": _images(i), "attn_mask": mask}

    expect = {"mask_to_where": {"found": 2, "changed": 2}, "fuse_qkv": {"found": 2, "changed": 0}}
    return Case("timm_vit_masked", adapter, make, 2, expect)


def swin_dynamic_case() -> Case:
    """timm Swin computing its shifted-window mask in forward (``strict_img_size=False`` sets ``dynamic_mask``)."""
    m = _timm("swin_tiny_patch4_window7_224", img_size=32, window_size=4, depths=(2, 2), num_heads=(2, 4), embed_dim=32, strict_img_size=False)  # -> dynamic_mask
    expect = {"mask_to_where": {"found": 1, "changed": 1}}
    return _image_case("timm_swin_dynamic", m, "x", 4, expect)


class UntraceableAttention(_Heads):
    """torch.fx cannot trace ``torch.finfo(attn.dtype)``: needs a user adapter."""

    def __init__(self, dim, heads, tokens):
        super().__init__(dim, heads)
        keep = torch.ones(tokens, dtype=torch.bool)
        keep[-2:] = False
        self.register_buffer("keep", keep)

    def forward(self, x):
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.masked_fill(~self.keep, torch.finfo(attn.dtype).min)
        return self.merge(attn.softmax(-1) @ v)


class UntraceableModel(nn.Module):
    def __init__(self, dim=32, heads=4, tokens=10):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = UntraceableAttention(dim, heads, tokens)
        self.head = nn.Linear(dim, 5)

    def forward(self, x):
        return self.head(x + self.attn(self.norm(x)))


@dataclass
class Pipeline:
    """A case after each pass, in the pipeline's order (each pass applied to the previous result)."""

    case: Case
    models: dict[str, nn.Module] = field(default_factory=dict)
    reports: dict[str, PassReport] = field(default_factory=dict)
    _proto: onnx.ModelProto | None = None

    @property
    def final(self) -> nn.Module:
        return self.models[PASS_ORDER[-1]]

    @property
    def proto(self) -> onnx.ModelProto:
        if self._proto is None:
            self._proto = export_onnx(self.final, self.case.inputs)
        return self._proto


def run_passes(case: Case, mode: LayerNormMode = LayerNormMode.fold) -> Pipeline:
    run = Pipeline(case)
    model = case.model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in PASS_ORDER:
            if name == "freeze_layernorm":
                model, report = freeze_layernorm(model, case.inputs, FreezeLayerNormSpec(mode=mode))
            elif name == "mask_to_where":
                model, report = mask_to_where(model, case.inputs)
            else:
                model, report = fuse_qkv(model, case.inputs)
            run.models[name], run.reports[name] = model, report
    return run
