"""Torch passes: ``reparameterize``, ``freeze_layernorm``, ``mask_to_where``, ``fuse_qkv`` (one file each).

Each pass is ``pass(model, example_inputs, spec=None, *, inplace=False) -> (model, PassReport)``;
importing this package registers them in :data:`PASSES`. A pass copies the model unless
``inplace=True``, and its report counts the sites it found, changed and skipped (with reasons).

Attention is recognised in one observed run of the model, not by class names: a softmax between two
products of projections (or a ``scaled_dot_product_attention`` call) is an attention wherever it is
written (timm, torchvision, Hugging Face, your own code), and what is applied to its logits is told
apart: masks (boolean, or 0 / very negative, from the inputs or constants) from biases (relative
position tables). Hugging Face models are rewritten through transformers' attention registry, other
modules under a scoped ``TorchFunctionMode`` hook; their own ``forward`` always runs
(:mod:`vitexport.passes.attention`).

Registering an adapter for your own attention class
----------------------------------------------------
Needed only when the observed run cannot see your attention's math (it happens inside one opaque
call: a custom C++/CUDA op, a compiled kernel), or to rewrite it your own way. Subclass
:class:`AttentionAdapter`, match your class exactly, and rewrite the *instance* you are given (it belongs to the pass's copy of the model)::

    from vitexport.passes import (AttentionAdapter, QKVLayout, bind_call, fuse_linears,
                                  install_forward, project_qkv, register_attention_adapter,
                                  where_logits)

    def my_forward(self, x, mask=None):
        q, k, v = project_qkv(self, x, ("q", "k", "v"))        # fused or not
        logits = (q @ k.transpose(-2, -1)) * self.scale
        if getattr(self, "vitexport_where", False):
            logits = where_logits(logits, mask)               # torch.where(keep, logits, finfo.min)
        elif mask is not None:
            logits = logits + mask                            # the original semantics
        return self.proj(logits.softmax(-1) @ v)

    @register_attention_adapter
    class MyAttentionAdapter(AttentionAdapter):
        name = "my_attention"

        def matches(self, module):
            return type(module) is MyAttention

        def qkv_layout(self, module):
            if hasattr(module, "vitexport_qkv_split"):
                return QKVLayout.fused("fused by vitexport")
            return QKVLayout.separate("q", "k", "v")

        def mask_of(self, module, args, kwargs):
            return bind_call(module.forward, args, kwargs).get("mask")

        def to_where(self, module, *, mask_bias=False):
            module.vitexport_where = True
            install_forward(module, my_forward)
            return module

        def fuse_qkv(self, module):
            fuse_linears(module, ("q", "k", "v"))
            install_forward(module, my_forward)
            return module

Registration refuses a name twice; a registered adapter takes the modules it matches before the
generic path does, user adapters (priority 100) before the built-in one (``nn.MultiheadAttention``,
priority 0). ``unregister_attention_adapter(name)`` removes one.
"""
from __future__ import annotations

from .attention import (
    ATTENTION_ADAPTERS,
    MASKED_AT_OR_BELOW,
    AttentionAdapter,
    AttentionSite,
    QKVLayout,
    SiteUnsupported,
    bind_call,
    find_attention_sites,
    fuse_linears,
    install_forward,
    masked_value,
    project_qkv,
    register_attention_adapter,
    unregister_attention_adapter,
    where_logits,
)
from .base import PASSES, ChangedSite, TorchPass, PassReport, SkippedSite, get_pass, maybe_copy, register_pass
from .freeze_layernorm import LayerNormConstants, freeze_layernorm
from .fuse_qkv import fuse_qkv
from .mask_to_where import mask_to_where
from .reparameterize import reparameterize

__all__ = [
    "PASSES",
    "TorchPass",
    "PassReport",
    "SkippedSite",
    "ChangedSite",
    "get_pass",
    "register_pass",
    "maybe_copy",
    "reparameterize",
    "freeze_layernorm",
    "mask_to_where",
    "fuse_qkv",
    "LayerNormConstants",
    "ATTENTION_ADAPTERS",
    "AttentionAdapter",
    "AttentionSite",
    "QKVLayout",
    "SiteUnsupported",
    "MASKED_AT_OR_BELOW",
    "bind_call",
    "find_attention_sites",
    "fuse_linears",
    "install_forward",
    "masked_value",
    "project_qkv",
    "register_attention_adapter",
    "unregister_attention_adapter",
    "where_logits",
]
