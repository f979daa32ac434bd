"""Tiny models and planted faults for the parity tests.

Everything is built here (random weights, no network) and exported with the TorchScript exporter,
so these tests do not depend on the export or quantize packages being written concurrently.
"""
from __future__ import annotations

import copy
import math
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper
from torch import nn

__all__ = [
    "tiny_vit",
    "TinyTextEncoder",
    "export",
    "image_batches",
    "text_batches",
    "swap_qk",
    "set_layernorm_eps",
    "drop_mask",
    "scale_onnx_weight",
    "plant_nan_onnx",
    "insert_qdq",
    "tensors_by_pattern",
    "calibrate_absmax",
]


# --- models ---------------------------------------------------------------------------------------
def tiny_vit(seed: int = 0, depth: int = 4, num_classes: int = 10, token_scale: float = 1.0,
             init_values: float | None = None, outlier: float = 0.0, outlier_channel: int = 7) -> nn.Module:
    """timm ViT-Tiny at 32x32, patch 8 (17 tokens, width 192, 3 heads), random weights.

    Linear weights are drawn with std 0.06 (timm's 0.02 init leaves the residual branches so small
    that no block matters). ``token_scale`` scales the patch embedding and ``init_values`` adds
    LayerScale (DeiT-III / CaiT style); both small keep the residual stream's variance near the
    LayerNorm epsilon, where an epsilon change shows. ``outlier`` adds a constant to one channel of
    the residual stream (ViT-B has channels near |x|=1400) and gives that channel a small LayerNorm
    weight, as trained models do, so per-tensor INT8 of the residual stream breaks while
    LayerNorm outputs stay easy to quantize.
    """
    import timm

    torch.manual_seed(seed)
    m = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=depth,
                          num_classes=num_classes, init_values=init_values)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.Linear):
                mod.weight.normal_(0.0, 0.06, generator=g)
                mod.bias.normal_(0.0, 0.02, generator=g)
            if isinstance(mod, nn.LayerNorm):
                mod.weight.normal_(1.0, 0.1, generator=g)
                mod.bias.normal_(0.0, 0.05, generator=g)
        m.patch_embed.proj.weight.mul_(token_scale)
        m.patch_embed.proj.bias.mul_(token_scale)
        m.cls_token.normal_(0.0, 0.5 * token_scale, generator=g)
        m.pos_embed.normal_(0.0, 0.1 * token_scale, generator=g)
        if outlier:
            m.pos_embed[..., outlier_channel] += outlier
            m.cls_token[..., outlier_channel] += outlier
            for mod in m.modules():
                if isinstance(mod, nn.LayerNorm):
                    mod.weight[outlier_channel] = 0.02
    return m.eval()


class _MaskedBlock(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d, eps=1e-6)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d, eps=1e-6)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.use_mask = True

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h = self.norm1(x)
        q, k, v = self.qkv(h).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        if self.use_mask:
            scores = scores + mask_bias
        attn = scores.softmax(-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


class TinyTextEncoder(nn.Module):
    """A text-encoder-like model: token ids + attention mask, an additive float mask in every block,
    masked mean pooling, a classifier. Blocks live in a ``ModuleList`` (scope ``layers.<i>``)."""

    def __init__(self, seed: int = 0, vocab: int = 50, d: int = 32, heads: int = 2, depth: int = 3,
                 seq: int = 12, num_classes: int = 6):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, seq, d) * 0.1)
        self.layers = nn.ModuleList(_MaskedBlock(d, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.head = nn.Linear(d, num_classes)
        with torch.no_grad():
            for mod in self.modules():
                if isinstance(mod, nn.Linear):
                    mod.weight.normal_(0.0, 0.15)
        self.eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) + self.pos
        m = attention_mask.to(x.dtype)
        bias = (1.0 - m[:, None, None, :]) * -1e4
        for layer in self.layers:
            x = layer(x, bias)
        x = self.norm(x)
        pooled = (x * m[..., None]).sum(1) / m.sum(1, keepdim=True)
        return self.head(pooled)


# --- data -----------------------------------------------------------------------------------------
def image_batches(n: int = 8, batch: int = 4, seed: int = 0, size: int = 32) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3, size, size)).astype(np.float32)
    return [{"x": x[i : i + batch]} for i in range(0, n, batch)]


def text_batches(n: int = 8, batch: int = 4, seed: int = 0, seq: int = 12, vocab: int = 50) -> list[dict[str, np.ndarray]]:
    """Token batches with real padding: every sample keeps 4..seq-2 tokens."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, size=(n, seq)).astype(np.int64)
    lengths = rng.integers(4, seq - 1, size=n)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    ids = ids * mask
    return [{"input_ids": ids[i : i + batch], "attention_mask": mask[i : i + batch]} for i in range(0, n, batch)]


# --- export ---------------------------------------------------------------------------------------
def export(module: nn.Module, feed: dict[str, np.ndarray], path: Path, opset: int = 17) -> Path:
    """TorchScript export (node names carry module scopes), static shapes."""
    args = tuple(torch.from_numpy(v) for v in feed.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=list(feed), output_names=["logits"],
                          dynamo=False, opset_version=opset)
    return Path(path)


# --- planted faults (torch) ------------------------------------------------------------------------
def swap_qk(model: nn.Module, block: int) -> nn.Module:
    """A broken fuse_qkv pass: q and k rows of one block's qkv projection swapped."""
    m = copy.deepcopy(model)
    qkv = m.blocks[block].attn.qkv
    d = qkv.out_features // 3
    with torch.no_grad():
        w, b = qkv.weight.clone(), qkv.bias.clone()
        qkv.weight[:d], qkv.weight[d : 2 * d] = w[d : 2 * d], w[:d]
        qkv.bias[:d], qkv.bias[d : 2 * d] = b[d : 2 * d], b[:d]
    return m


def set_layernorm_eps(model: nn.Module, block: int, eps: float = 1e-5) -> nn.Module:
    """A broken freeze_layernorm pass: one block's LayerNorm epsilon changed."""
    m = copy.deepcopy(model)
    m.blocks[block].norm1.eps = eps
    return m


def drop_mask(model: TinyTextEncoder, block: int) -> TinyTextEncoder:
    """A broken mask_to_where pass: one block no longer applies the attention mask."""
    m = copy.deepcopy(model)
    m.layers[block].use_mask = False
    return m


# --- planted faults (ONNX) -------------------------------------------------------------------------
def _initializer(model: onnx.ModelProto, name: str) -> onnx.TensorProto:
    for init in model.graph.initializer:
        if init.name == name:
            return init
    raise KeyError(name)


def _weight_of(model: onnx.ModelProto, node_name: str) -> str:
    node = next(n for n in model.graph.node if n.name == node_name)
    inits = {i.name for i in model.graph.initializer}
    return next(x for x in node.input if x in inits)


def scale_onnx_weight(src: Path, dst: Path, node_name: str, factor: float) -> Path:
    """Scale the weight initializer a node consumes (e.g. ``/blocks/blocks.2/mlp/fc1/MatMul``)."""
    model = onnx.load(str(src))
    init = _initializer(model, _weight_of(model, node_name))
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(factor), init.name))
    onnx.save(model, str(dst))
    return Path(dst)


def plant_nan_onnx(src: Path, dst: Path, node_name: str) -> Path:
    """Put one NaN into the weight a node consumes."""
    model = onnx.load(str(src))
    init = _initializer(model, _weight_of(model, node_name))
    w = numpy_helper.to_array(init).copy()
    w.flat[3] = np.nan
    init.CopyFrom(numpy_helper.from_array(w, init.name))
    onnx.save(model, str(dst))
    return Path(dst)


# --- QDQ ------------------------------------------------------------------------------------------
def tensors_by_pattern(model: onnx.ModelProto, op_type: str, name_contains: str = "", input_index: int | None = None,
                       computed_inputs: bool = False) -> list[str]:
    """Outputs (or the input at ``input_index``) of nodes of ``op_type`` whose name contains a string.

    ``computed_inputs``: only nodes whose inputs are all produced by other nodes (a residual Add,
    not a bias Add).
    """
    inits = {i.name for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    out = []
    for n in model.graph.node:
        if n.op_type != op_type or name_contains not in n.name:
            continue
        if computed_inputs and any(x in inits or x not in producers or producers[x].op_type == "Constant" for x in n.input):
            continue
        if input_index is None:
            out.append(n.output[0])
        elif n.input[input_index] not in inits:
            out.append(n.input[input_index])
    return list(dict.fromkeys(out))


def calibrate_absmax(model_path: Path, tensors: list[str], feeds: list[dict[str, np.ndarray]]) -> dict[str, float]:
    """Largest |value| of each tensor over the feeds (a minmax calibration)."""
    from vitexport.runners.sessions import Session

    sess = Session(model_path, outputs=tensors)
    amax = {t: 0.0 for t in tensors}
    for feed in feeds:
        for t, v in zip(tensors, sess.run(tensors, feed)):
            amax[t] = max(amax[t], float(np.abs(v).max()))
    return amax


def insert_qdq(src: Path, dst: Path, amax: dict[str, float]) -> Path:
    """Symmetric per-tensor int8 Q/DQ after each tensor; every consumer reads the DQ output.

    Node names keep the producer's scope prefix, as a scope-aware quantizer would.
    """
    model = onnx.load(str(src))
    g = model.graph
    new_nodes = []
    renamed: dict[str, str] = {}
    producers = {o: n for n in g.node for o in n.output}
    for t, a in amax.items():
        scale = max(a, 1e-8) / 127.0
        base = producers[t].name if t in producers else "/" + t
        s_name, z_name = f"{t}_qscale", f"{t}_qzero"
        g.initializer.append(numpy_helper.from_array(np.array(scale, dtype=np.float32), s_name))
        g.initializer.append(numpy_helper.from_array(np.array(0, dtype=np.int8), z_name))
        q_out, dq_out = f"{t}_quantized", f"{t}_dequantized"
        new_nodes.append((t, helper.make_node("QuantizeLinear", [t, s_name, z_name], [q_out], name=f"{base}_QuantizeLinear")))
        new_nodes.append((t, helper.make_node("DequantizeLinear", [q_out, s_name, z_name], [dq_out], name=f"{base}_DequantizeLinear")))
        renamed[t] = dq_out
    for n in g.node:
        for i, x in enumerate(n.input):
            if x in renamed:
                n.input[i] = renamed[x]
    for o in g.output:
        if o.name in renamed:  # keep graph outputs float and un-rounded
            pass
    # insert each Q/DQ pair right after its producer, keeping topological order
    ordered = []
    pending: dict[str, list] = {}
    for t, node in new_nodes:
        pending.setdefault(t, []).append(node)
    graph_inputs = {i.name for i in g.input}
    head = [node for t, nodes in pending.items() if t in graph_inputs for node in nodes]
    ordered.extend(head)
    for n in g.node:
        ordered.append(n)
        for o in n.output:
            ordered.extend(pending.get(o, []))
    del g.node[:]
    g.node.extend(ordered)
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))
    return Path(dst)


def snr_db(ref: np.ndarray, out: np.ndarray) -> float:
    noise = float(((out - ref) ** 2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float((ref**2).sum()) / noise)
