"""Where does each LayerNorm's output go? Decided on one run of the model, not from a trace.

``fold`` may move a LayerNorm's gamma/beta into the Linears that read its output only if *every*
reader is such a Linear. Tracing cannot answer that for every family (Hugging Face models do not
trace with torch.fx, reshapes inside Swin's window partition are hard to follow statically), so the
model runs once under a ``TorchFunctionMode`` that sees every torch call:

* a LayerNorm's output is tracked from its forward hook;
* ``F.linear`` with a tracked input is a consumer (the Linear is found by its weight);
  ``F.multi_head_attention_forward`` with q = k = v tracked is a consumer of its packed ``in_proj``;
* layout ops (view, permute, indexing, roll, dropout in eval, mean over tokens, ...) pass the
  tracking on *if* re-running them on ``x * g + b`` gives ``f(x) * g + b`` for a random per-channel
  ``g, b`` — that proves the normalized (last) axis was neither moved nor mixed;
* anything else (a residual add, a concat, an in-place op, being the model's output) blocks the fold,
  and its name is the reason the report gives.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map

__all__ = ["FoldPlan", "analyse_layernorm_consumers"]

# Ops that keep every channel's values in that channel (checked numerically on each call, too).
_PASS_THROUGH = {
    "view", "reshape", "flatten", "unflatten", "unsqueeze", "squeeze", "expand", "expand_as", "contiguous",
    "clone", "permute", "transpose", "swapaxes", "swapdims", "movedim", "moveaxis", "roll", "__getitem__",
    "narrow", "select", "index_select", "to", "float", "double", "half", "bfloat16", "type", "type_as",
    "detach", "dropout", "alpha_dropout", "feature_alpha_dropout", "chunk", "split", "unbind",
    "tensor_split", "split_with_sizes", "repeat", "tile", "flip", "mean", "nanmean",
    "pad",  # only a zero-width pad passes the numeric check (padded zeros do not follow x * g + b)
}
# Calls that return no tensor but read values: a fold would change what they see.
_VALUE_READS = {"item", "tolist", "__bool__", "__float__", "__int__", "numpy", "equal", "allclose", "any", "all", "__format__"}


@dataclass
class FoldPlan:
    """Readers of one LayerNorm's output: Linears and packed MultiheadAttention in-projections, or
    the reason a fold is impossible."""

    linears: list[str] = field(default_factory=list)
    mhas: list[str] = field(default_factory=list)
    blocker: str | None = None

    @property
    def foldable(self) -> bool:
        return self.blocker is None and bool(self.linears or self.mhas)


def _name(func: Any) -> str:
    n = getattr(func, "__name__", "") or ""
    if n == "__get__":  # a property such as .T / .mT
        owner = getattr(func, "__self__", None)
        return getattr(owner, "__name__", "attribute")
    return n


class _Flow(TorchFunctionMode):
    def __init__(self, model: nn.Module, lns: dict[str, nn.Module]):
        super().__init__()
        self.lns = lns
        self.plans = {n: FoldPlan() for n in lns}
        self.tracked: dict[int, tuple[str, torch.Tensor]] = {}
        self.linear_by_weight = {id(m.weight): n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
        self.linear_bias = {n: m.bias for n, m in model.named_modules() if isinstance(m, nn.Linear)}
        self.mha_by_weight = {
            id(m.in_proj_weight): n
            for n, m in model.named_modules()
            if isinstance(m, nn.MultiheadAttention) and m.in_proj_weight is not None
        }
        # A weight owned by two modules (tied embeddings / heads) must not change under one of them.
        owners: dict[int, int] = {}
        for _, prm in model.named_parameters(remove_duplicate=False):
            owners[id(prm)] = owners.get(id(prm), 0) + 1
        self.tied = {i for i, n in owners.items() if n > 1}
        self.weights = {n: id(m.weight) for n, m in model.named_modules() if isinstance(m, nn.Linear)}
        self.weights.update({n: id(m.in_proj_weight) for n, m in model.named_modules() if isinstance(m, nn.MultiheadAttention) and m.in_proj_weight is not None})
        self.linear_reads: dict[str, set[str | None]] = {}
        self.mha_reads: dict[str, set[str | None]] = {}
        self.called: set[str] = set()
        self.active = True
        self._affine: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._gen = torch.Generator().manual_seed(0)

    # -- bookkeeping -------------------------------------------------------------------------------
    def block(self, origin: str, reason: str) -> None:
        if self.plans[origin].blocker is None:
            self.plans[origin].blocker = reason

    def origin(self, t: Any) -> str | None:
        if isinstance(t, torch.Tensor):
            hit = self.tracked.get(id(t))
            if hit is not None and hit[1] is t:
                return hit[0]
        return None

    def track(self, t: torch.Tensor, origin: str) -> None:
        self.tracked[id(t)] = (origin, t)  # the reference keeps the id from being reused

    def hook(self, name: str):
        def on_output(module: nn.Module, args: tuple, output: Any) -> None:
            self.active = False
            try:
                self.called.add(name)
                if not isinstance(output, torch.Tensor) or not args or not isinstance(args[0], torch.Tensor):
                    self.block(name, "its forward does not map one tensor to one tensor")
                    return
                shape = tuple(module.normalized_shape)
                if len(shape) != 1:
                    self.block(name, f"normalizes over {len(shape)} axes; only a last-axis LayerNorm folds")
                try:
                    ref = F.layer_norm(args[0], shape, module.weight, module.bias, module.eps)
                    plain = ref.shape == output.shape and torch.allclose(ref, output, rtol=1e-4, atol=1e-5)
                except RuntimeError:  # e.g. a channels-first input the trailing shape does not fit
                    plain = False
                if not plain:
                    # Nothing to follow: a LayerNorm that cannot fold needs no consumer analysis, and
                    # the per-channel check below assumes the normalized axis is the last one.
                    self.block(name, f"{type(module).__name__} does not compute a last-axis layer_norm")
                    return
                self.track(output, name)
            finally:
                self.active = True

        return on_output

    def affine(self, origin: str, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if origin not in self._affine:
            c = int(self.lns[origin].normalized_shape[-1])
            g = 0.5 + torch.rand(c, generator=self._gen, dtype=torch.float64)
            b = torch.randn(c, generator=self._gen, dtype=torch.float64)
            self._affine[origin] = (g, b)
        g, b = self._affine[origin]
        return g.to(like.dtype), b.to(like.dtype)

    # -- the interception --------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.active:
            return out
        if func is F.linear:
            self._linear(args, kwargs)
            return out
        if func is F.multi_head_attention_forward:
            self._mha(args, kwargs)
            return out
        leaves = tree_leaves((args, kwargs))
        origins = {o for o in (self.origin(t) for t in leaves) if o is not None}
        if not origins:
            return out
        name = _name(func)
        out_tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not out_tensors and name not in _VALUE_READS:
            return out  # shape / dtype / size queries
        if name.endswith("_") and not name.endswith("__"):
            for o in origins:
                self.block(o, f"its output is modified in place ({name})")
            return out
        if name in _PASS_THROUGH and len(origins) == 1 and out_tensors:
            (o,) = origins
            if self._equivariant(func, args, kwargs, out, o):
                for t in out_tensors:
                    self.track(t, o)
                return out
            self.block(o, f"its output feeds {name}, which moves or mixes the normalized axis")
            return out
        for o in origins:
            self.block(o, f"its output feeds {name or repr(func)} (not a Linear)")
        return out

    def _equivariant(self, func, args, kwargs, out, origin: str) -> bool:
        c = int(self.lns[origin].normalized_shape[-1])

        def shift(t):
            if self.origin(t) == origin:
                g, b = self.affine(origin, t)
                return t * g + b
            return t

        try:
            out2 = func(*tree_map(shift, args), **tree_map(shift, kwargs))
        except Exception:  # an op that does not accept the shifted copy cannot be proven safe
            return False
        flat1, spec1 = tree_flatten(out)
        flat2, spec2 = tree_flatten(out2)
        if spec1 != spec2:
            return False
        for a, b2 in zip(flat1, flat2):
            if not isinstance(a, torch.Tensor):
                continue
            if a.dim() == 0 or a.shape[-1] != c or not a.is_floating_point():
                return False
            g, b = self.affine(origin, a)
            expect = a * g + b
            if not isinstance(b2, torch.Tensor) or b2.shape != expect.shape:
                return False  # the shifted copy took another shape: the op broadcast over the channel axis
            scale = float(expect.abs().max()) if expect.numel() else 1.0
            if not torch.allclose(b2, expect, rtol=1e-4, atol=1e-5 * (1.0 + scale)):
                return False
        return True

    def _linear(self, args, kwargs) -> None:
        names = ["input", "weight", "bias"]
        call = dict(zip(names, args))
        call.update(kwargs)
        x, w = call.get("input"), call.get("weight")
        lin = self.linear_by_weight.get(id(w))
        o = self.origin(x)
        for key in ("weight", "bias"):
            ow = self.origin(call.get(key))
            if ow is not None:
                self.block(ow, f"its output is used as a Linear {key}")
        if lin is not None and o is not None and call.get("bias") is not self.linear_bias[lin]:
            # timm EVA / BEiT pass their own q/v bias to F.linear: beta folded into the module's bias
            # would never be added.
            self.block(o, f"Linear '{lin}' is called with a bias that is not its own")
        if lin is not None:
            self.linear_reads.setdefault(lin, set()).add(o)
        elif o is not None:
            self.block(o, "its output feeds a functional linear whose weight no nn.Linear owns")

    def _mha(self, args, kwargs) -> None:
        names = [
            "query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight", "in_proj_bias",
            "bias_k", "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight", "out_proj_bias", "training",
            "key_padding_mask", "need_weights", "attn_mask", "use_separate_proj_weight",
        ]
        call = dict(zip(names, args))
        call.update(kwargs)
        origins = [self.origin(call.get(k)) for k in ("query", "key", "value")]
        mha = self.mha_by_weight.get(id(call.get("in_proj_weight")))
        seen = {o for o in origins if o is not None}
        if mha is not None:
            self.mha_reads.setdefault(mha, set()).add(origins[0] if len(set(origins)) == 1 else None)
        for o in seen:
            if mha is None or call.get("use_separate_proj_weight") or len(set(origins)) != 1:
                self.block(o, "its output feeds a multi-head attention as only some of query/key/value")
        for k, v in call.items():
            if k not in ("query", "key", "value") and self.origin(v) is not None:
                self.block(self.origin(v), f"its output is used as the attention's {k}")

    # -- the verdict -------------------------------------------------------------------------------
    def finish(self, output: Any) -> dict[str, FoldPlan]:
        for t in tree_leaves(output):
            o = self.origin(t)
            if o is not None:
                self.block(o, "its output is (part of) the model output")
        for name, plan in self.plans.items():
            if name not in self.called:
                self.block(name, "not called on the example inputs")
                continue
            plan.linears = sorted(lin for lin, reads in self.linear_reads.items() if name in reads)
            plan.mhas = sorted(m for m, reads in self.mha_reads.items() if name in reads)
            for lin in plan.linears + plan.mhas:
                if self.weights.get(lin) in self.tied:
                    self.block(name, f"'{lin}' shares its weight with another module (tied weights)")
            for lin in plan.linears:
                if self.linear_reads[lin] != {name}:
                    self.block(name, f"Linear '{lin}' also reads other inputs")
            for m in plan.mhas:
                if self.mha_reads[m] != {name}:
                    self.block(name, f"attention '{m}' also reads other inputs")
            if plan.blocker is None and not (plan.linears or plan.mhas):
                self.block(name, "its output reaches no Linear")
        return self.plans


def analyse_layernorm_consumers(
    model: nn.Module, inputs: dict[str, torch.Tensor], lns: dict[str, nn.Module]
) -> tuple[dict[str, FoldPlan], Any]:
    """Run ``model(**inputs)`` once and decide, per LayerNorm in ``lns``, whether its affine can fold.

    Returns:
        (name -> :class:`FoldPlan`, the model's output on ``inputs``).
    """
    flow = _Flow(model, lns)
    handles = [m.register_forward_hook(flow.hook(n)) for n, m in lns.items()]
    try:
        with torch.no_grad(), flow:
            output = model(**inputs)
    finally:
        for h in handles:
            h.remove()
    flow.active = False
    return flow.finish(output), output
