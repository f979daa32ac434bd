"""Attention recognised in a traced graph, for modules no adapter knows (hand-written models).

The module is traced with ``torch.fx`` (every child module a leaf, so the graph is this module's own
code, with its non-tensor arguments fixed to the values seen on the example inputs). In the graph we
look for the pattern every softmax attention shares:

* a softmax whose input, walking back through shape ops, scalings, adds and masks, is a matmul /
  einsum / bmm of two operands that come from Linears (q and k);
* the softmax output, walking forward, multiplied with a third operand that comes from a Linear (v);
* on the way from the logits matmul to the softmax: ``add`` of a mask (a tensor whose entries are 0 or
  <= ``MASKED_AT_OR_BELOW`` on the example inputs; a buffer, an argument or computed in forward),
  ``masked_fill`` with a very negative value (a boolean mask), or an existing ``torch.where``;
* or a ``scaled_dot_product_attention`` call (its ``attn_mask`` / ``is_causal`` are the mask).

q/k/v from three different Linears with one input are fusable; from one Linear, already fused.
Rewrites edit the graph and the module is replaced by the resulting ``GraphModule``.
"""
from __future__ import annotations

import inspect
import math
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_leaves

from .base import AttentionAdapter, QKVLayout, SiteUnsupported
from .ops import MASKED_AT_OR_BELOW, is_binary_additive, masked_value

__all__ = ["TracedAttention", "analyse_module", "TraceFailure"]

_SOFTMAX_FUNCS = {torch.softmax, F.softmax, torch.special.softmax}
_MATMUL_FUNCS = {torch.matmul, operator.matmul, torch.bmm, torch.einsum}
_MATMUL_METHODS = {"matmul", "bmm", "__matmul__"}
_ADD_FUNCS = {operator.add, operator.iadd, torch.add}
_MUL_FUNCS = {operator.mul, operator.imul, torch.mul, operator.truediv, operator.itruediv, torch.div}
_WHERE_FUNCS = {torch.where}
_MAX_WALK = 48


class TraceFailure(Exception):
    """The module cannot be traced or its trace does not reproduce it; the message says why."""


class _LeafTracer(fx.Tracer):
    # Every child is a leaf: the graph shows the traced module's own code, and q/k/v are call_module
    # nodes we can rewire.
    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True


class _Recorder(fx.Interpreter):
    """Runs the graph once and keeps every node's value (shapes, dtypes, mask contents)."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.values: dict[fx.Node, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        self.values[n] = out
        return out


def _is_call(n: Any, funcs: set | None = None, methods: set | None = None) -> bool:
    if not isinstance(n, fx.Node):
        return False
    if funcs and n.op == "call_function" and n.target in funcs:
        return True
    return bool(methods and n.op == "call_method" and n.target in methods)


def _submodule(gm: fx.GraphModule, n: fx.Node) -> nn.Module | None:
    return gm.get_submodule(n.target) if n.op == "call_module" else None


def _is_linear(gm: fx.GraphModule, n: Any) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_module" and isinstance(_submodule(gm, n), nn.Linear)


def _is_softmax(gm: fx.GraphModule, n: fx.Node) -> bool:
    return _is_call(n, _SOFTMAX_FUNCS, {"softmax"}) or (n.op == "call_module" and isinstance(_submodule(gm, n), nn.Softmax))


def _is_matmul(n: Any) -> bool:
    if not _is_call(n, _MATMUL_FUNCS, _MATMUL_METHODS):
        return False
    return len([a for a in n.args if isinstance(a, fx.Node)]) == 2


def _is_sdpa(n: fx.Node) -> bool:
    return _is_call(n, {F.scaled_dot_product_attention})


def _tensor_inputs(n: fx.Node) -> list[fx.Node]:
    return [a for a in n.all_input_nodes]


def _reaches(gm: fx.GraphModule, start: Any, pred) -> bool:
    """Backward search from ``start`` (not past Linears, placeholders, attributes) for a node
    satisfying ``pred``."""
    if not isinstance(start, fx.Node):
        return False
    seen, todo = set(), [start]
    while todo and len(seen) < _MAX_WALK * 4:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if pred(n):
            return True
        if n.op in ("placeholder", "get_attr") or _is_linear(gm, n):
            continue
        todo.extend(_tensor_inputs(n))
    return False


def _linear_sources(gm: fx.GraphModule, start: Any) -> set[fx.Node]:
    """The Linear call nodes an operand of the logits / output matmul comes from."""
    found: set[fx.Node] = set()
    if not isinstance(start, fx.Node):
        return found
    seen, todo = set(), [start]
    while todo and len(seen) < _MAX_WALK * 4:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if _is_linear(gm, n):
            found.add(n)
            continue
        if n.op in ("placeholder", "get_attr") or _is_matmul(n) or _is_sdpa(n) or _is_softmax(gm, n):
            continue
        todo.extend(_tensor_inputs(n))
    return found


@dataclass
class _MaskTerm:
    kind: str  # "add" | "masked_fill" | "masked_fill_" | "where" | "sdpa"
    op: fx.Node  # the node applying the mask
    mask: Any  # the mask node (or None for sdpa is_causal only)
    logits: Any = None  # the logits-side operand of an add
    binary: bool = True  # additive float mask holds only 0 / masked values on the example inputs
    movable: bool = False  # only elementwise ops between it and the softmax: the where can sit there


@dataclass
class _Pattern:
    softmax: fx.Node | None
    scores: fx.Node | None  # logits matmul, or the sdpa node
    q: set[fx.Node] = field(default_factory=set)
    k: set[fx.Node] = field(default_factory=set)
    v: set[fx.Node] = field(default_factory=set)
    masks: list[_MaskTerm] = field(default_factory=list)


def _value(values: dict, n: Any) -> Any:
    return values.get(n) if isinstance(n, fx.Node) else n


def _classify_add_term(values: dict, term: Any) -> tuple[bool, bool]:
    """(is_mask, binary) for the non-logits operand of an add before softmax."""
    t = _value(values, term)
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        return False, True
    masked = t <= MASKED_AT_OR_BELOW
    if bool(masked.any()):
        return True, is_binary_additive(t)
    # All zeros: a mask with nothing masked on the example inputs (e.g. an unpadded batch).
    return bool((t == 0).all()), True


def _is_elementwise_scalar(n: fx.Node) -> bool:
    """mul / div by a number, a dtype cast, contiguous: ops a where can be moved across."""
    if _is_call(n, _MUL_FUNCS, {"mul", "div", "__mul__", "__truediv__"}):
        return len(n.all_input_nodes) == 1
    return _is_call(n, None, {"float", "to", "type_as", "contiguous"}) and len(n.all_input_nodes) == 1


def _walk_logits(gm: fx.GraphModule, values: dict, start: fx.Node) -> tuple[fx.Node | None, list[_MaskTerm]]:
    terms: list[_MaskTerm] = []
    node: Any = start
    movable = True  # nothing but elementwise ops so far between here and the softmax
    for _ in range(_MAX_WALK):
        if not isinstance(node, fx.Node):
            return None, terms
        # An in-place masked_fill_ on this node changes what later users see.
        for user in node.users:
            if _is_call(user, None, {"masked_fill_"}) and user.args[0] is node and _very_negative(user.args[2] if len(user.args) > 2 else user.kwargs.get("value")):
                terms.append(_MaskTerm("masked_fill_", user, user.args[1]))
        if _is_matmul(node):
            return node, terms
        if _is_call(node, _ADD_FUNCS, {"add", "__add__", "add_"}):
            a, b = node.args[0], node.args[1]
            has_a = _reaches(gm, a, _is_matmul)
            has_b = _reaches(gm, b, _is_matmul)
            if has_a == has_b:
                return None, terms
            logits, term = (a, b) if has_a else (b, a)
            is_mask, binary = _classify_add_term(values, term)
            if is_mask:
                terms.append(_MaskTerm("add", node, term, logits, binary, movable))
            node = logits
            continue
        if _is_call(node, {torch.masked_fill}, {"masked_fill"}):
            value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value")
            if _very_negative(_value(values, value)):
                terms.append(_MaskTerm("masked_fill", node, node.args[1], node.args[0], True, movable))
            node = node.args[0]
            continue
        if _is_call(node, _WHERE_FUNCS) and len(node.args) == 3 and _very_negative(_value(values, node.args[2])):
            terms.append(_MaskTerm("where", node, node.args[0]))
            node = node.args[1]
            continue
        ins = [a for a in node.all_input_nodes if _reaches(gm, a, _is_matmul)]
        if len(ins) != 1 or node.op == "call_module" and _is_linear(gm, node):
            return None, terms
        movable = movable and _is_elementwise_scalar(node)
        node = ins[0]
    return None, terms


def _very_negative(v: Any) -> bool:
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = float(v)
    return isinstance(v, (int, float)) and v <= MASKED_AT_OR_BELOW


def _walk_to_output_matmul(gm: fx.GraphModule, softmax: fx.Node) -> fx.Node | None:
    todo, seen = [softmax], set()
    while todo and len(seen) < _MAX_WALK:
        n = todo.pop(0)
        if n in seen:
            continue
        seen.add(n)
        for u in n.users:
            if _is_matmul(u):
                return u
            if not _is_linear(gm, u):
                todo.append(u)
    return None


def _sdpa_call(n: fx.Node) -> dict[str, Any]:
    names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
    call = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
    call.update(dict(zip(names, n.args)))
    call.update(n.kwargs)
    return call


def _find_patterns(gm: fx.GraphModule, values: dict) -> list[_Pattern]:
    patterns = []
    for n in gm.graph.nodes:
        if _is_sdpa(n):
            c = _sdpa_call(n)
            p = _Pattern(None, n, _linear_sources(gm, c["query"]), _linear_sources(gm, c["key"]), _linear_sources(gm, c["value"]))
            if c["attn_mask"] is not None or c["is_causal"]:
                t = _value(values, c["attn_mask"])
                binary = not isinstance(t, torch.Tensor) or t.dtype == torch.bool or is_binary_additive(t)
                p.masks.append(_MaskTerm("sdpa", n, c["attn_mask"], None, binary))
            patterns.append(p)
        elif _is_softmax(gm, n) and n.all_input_nodes:
            scores, masks = _walk_logits(gm, values, n.all_input_nodes[0])
            if scores is None:
                continue
            a, b = [x for x in scores.args if isinstance(x, fx.Node)][:2]
            out = _walk_to_output_matmul(gm, n)
            v = set()
            if out is not None:
                other = [x for x in out.args if isinstance(x, fx.Node) and not _reaches(gm, x, lambda m: m is n)]
                v = _linear_sources(gm, other[0]) if other else set()
            patterns.append(_Pattern(n, scores, _linear_sources(gm, a), _linear_sources(gm, b), v, masks))
    return [p for p in patterns if p.q and p.k]


def _restore_signature(gm: fx.GraphModule, params: list[str]) -> None:
    # fx renames specialised (concrete) arguments (mask -> mask_1); keep the original names so callers
    # passing them by keyword still work.
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, name in zip(placeholders, params):
        node.target = name
    gm.recompile()


def _unique_attr(gm: nn.Module, base: str) -> str:
    name, i = base, 1
    while hasattr(gm, name):
        name, i = f"{base}_{i}", i + 1
    return name


def _copy_plain_attributes(src: nn.Module, dst: nn.Module) -> None:
    # The parent's code may read attributes of its child (num_heads, scale); a GraphModule only keeps
    # what its graph uses.
    for k, v in vars(src).items():
        if k.startswith("_") or k == "training" or hasattr(dst, k):
            continue
        if isinstance(v, (int, float, bool, str, tuple, type(None))):
            setattr(dst, k, v)


def _outputs_equal(a: Any, b: Any) -> bool:
    la, lb = tree_leaves(a), tree_leaves(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor) and not (x.shape == y.shape and torch.equal(x, y)):
            return False
    return True


def analyse_module(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> "TracedAttention | None":
    """Trace ``module`` as called with ``(args, kwargs)`` and look for one attention in its graph.

    Returns:
        A :class:`TracedAttention` for the site, or None when the graph holds no attention.
    Raises:
        TraceFailure: the module cannot be traced faithfully (the message says why).
    """
    sig = inspect.signature(module.forward)
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
        raise TraceFailure("forward takes *args/**kwargs")
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise TraceFailure(f"recorded call does not fit forward: {exc}") from None
    bound.apply_defaults()
    call = dict(bound.arguments)
    concrete = {}
    for k, v in call.items():
        if isinstance(v, torch.Tensor):
            continue
        if any(isinstance(x, torch.Tensor) for x in tree_leaves(v)):
            raise TraceFailure(f"argument '{k}' is a container of tensors")
        concrete[k] = v
    try:
        graph = _LeafTracer().trace(module, concrete_args=concrete or None)
    except Exception as exc:  # fx raises many types (TraceError, TypeError, NotImplementedError ...)
        raise TraceFailure(f"torch.fx cannot trace it: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}") from None
    gm = fx.GraphModule(module, graph, class_name=type(module).__name__)
    params = list(sig.parameters)
    _restore_signature(gm, params)
    run_args = [call[p] for p in params]
    with torch.no_grad():
        rec = _Recorder(gm)
        try:
            traced_out = rec.run(*run_args)
        except Exception as exc:
            raise TraceFailure(f"its trace does not run: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}") from None
        if not _outputs_equal(traced_out, module(*args, **kwargs)):
            raise TraceFailure("its trace does not reproduce the module (data-dependent control flow?)")
    patterns = _find_patterns(gm, rec.values)
    if not patterns:
        return None
    return TracedAttention(module, gm, params, patterns, rec.values)


class TracedAttention(AttentionAdapter):
    """One attention found by tracing; acts as the adapter for that single site."""

    name = "traced_pattern"
    priority = -1
    family = "traced"

    def __init__(self, module: nn.Module, gm: fx.GraphModule, params: list[str], patterns: list[_Pattern], values: dict):
        self.original = module
        self.gm = gm
        self.params = params
        self.patterns = patterns
        self.values = values

    # --- what the passes read -------------------------------------------------------------------
    def matches(self, module: nn.Module) -> bool:
        return module is self.original

    @property
    def pattern(self) -> _Pattern:
        return self.patterns[0]

    def describe(self) -> str:
        p = self.pattern
        core = "scaled_dot_product_attention" if p.softmax is None else f"{p.scores.target if p.scores.op != 'call_function' else p.scores.target.__name__} + softmax"
        return f"traced pattern ({core})"

    def qkv_layout(self, module: nn.Module | None = None) -> QKVLayout:
        if len(self.patterns) > 1:
            return QKVLayout.unsupported(f"{len(self.patterns)} attentions in one module")
        p = self.pattern
        if len(p.q) != 1 or len(p.k) != 1 or len(p.v) != 1:
            return QKVLayout.unsupported("q, k or v does not come from exactly one Linear")
        (q,), (k,), (v,) = p.q, p.k, p.v
        if q is k is v:
            return QKVLayout.fused(f"q, k and v come from one Linear '{q.target}'")
        if len({q, k, v}) != 3:
            return QKVLayout.unsupported("two of q, k, v share a Linear")
        inputs = {n.args[0] if n.args else None for n in (q, k, v)}
        if len(inputs) != 1 or any(n.kwargs for n in (q, k, v)):
            return QKVLayout.unsupported("q, k and v read different inputs (cross-attention)")
        return QKVLayout.separate(q.target, k.target, v.target)

    def mask_terms(self) -> list[_MaskTerm]:
        return [t for p in self.patterns for t in p.masks]

    def mask_of(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
        # Sites are found from the graph; this is only for the AttentionAdapter interface.
        return None

    def has_mask(self) -> bool:
        return bool(self.mask_terms())

    def is_where(self, module: nn.Module | None = None) -> bool:
        terms = self.mask_terms()
        return bool(terms) and all(t.kind == "where" for t in terms)

    def mask_description(self) -> str:
        kinds = []
        for t in self.mask_terms():
            if t.kind == "where":
                continue
            src = t.mask.op if isinstance(t.mask, fx.Node) else "none"
            what = {"get_attr": "buffer", "placeholder": "argument"}.get(src, "computed in forward")
            if t.kind == "add":
                kinds.append(f"additive mask ({what}{'' if t.binary else ', with bias'})")
            elif t.kind.startswith("masked_fill"):
                kinds.append(f"boolean masked_fill ({what})")
            else:
                kinds.append("scaled_dot_product_attention mask" + (f" ({what})" if t.mask is not None else " (is_causal)"))
        return ", ".join(kinds)

    # --- rewrites ---------------------------------------------------------------------------------
    def _finish(self) -> fx.GraphModule:
        gm = self.gm
        used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
        # Only attribute reads left without readers are removed; a general dead-code pass could drop
        # the user's in-place ops.
        for n in list(gm.graph.nodes):
            if n.op == "get_attr" and not n.users:
                gm.graph.erase_node(n)
        gm.graph.lint()
        gm.recompile()
        gm.delete_all_unused_submodules()
        still = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
        for target in used - still:  # a mask buffer nothing reads any more
            if "." not in target and target in gm._buffers:
                del gm._buffers[target]
        _copy_plain_attributes(self.original, gm)
        gm.train(self.original.training)
        return gm

    def _dtype(self, n: fx.Node) -> torch.dtype:
        v = self.values.get(n)
        return v.dtype if isinstance(v, torch.Tensor) else torch.get_default_dtype()

    def _keep_node(self, term: _MaskTerm, bool_means_keep: bool) -> tuple[fx.Node, fx.Node | None]:
        """(keep node, kept-bias node or None), inserted before ``term.op``."""
        g, gm = self.gm.graph, self.gm
        mask = term.mask
        value = self.values.get(mask) if isinstance(mask, fx.Node) else None
        is_bool = isinstance(value, torch.Tensor) and value.dtype == torch.bool
        if is_bool:
            return (mask if bool_means_keep else g.call_function(torch.logical_not, (mask,))), None
        if mask.op == "get_attr":
            # A constant mask: precompute keep (and the kept bias) as buffers, no compare in the graph.
            t = _fetch_attr(gm, mask.target)
            keep_t = t > MASKED_AT_OR_BELOW
            keep_name = _unique_attr(gm, mask.target.replace(".", "_") + "_keep")
            gm.register_buffer(keep_name, keep_t)
            keep = g.get_attr(keep_name)
            bias = None
            if not term.binary:
                bias_name = _unique_attr(gm, mask.target.replace(".", "_") + "_kept_bias")
                gm.register_buffer(bias_name, torch.where(keep_t, t, torch.zeros((), dtype=t.dtype)))
                bias = g.get_attr(bias_name)
            return keep, bias
        keep = g.call_function(torch.gt, (mask, MASKED_AT_OR_BELOW))
        bias = None if term.binary else g.call_function(torch.where, (keep, mask, 0.0))
        return keep, bias

    def to_where(self, module: nn.Module | None = None, *, mask_bias: bool = False) -> nn.Module:
        g = self.gm.graph
        for pattern in self.patterns:
            self._where_at_softmax(pattern)
        for term in self.mask_terms():
            if term.kind == "where" or term.movable:
                continue
            if term.kind == "sdpa":
                self._explicit_sdpa(term)
                continue
            with g.inserting_before(term.op):
                if term.kind == "add":
                    keep, bias = self._keep_node(term, bool_means_keep=True)
                    logits = term.logits
                    if bias is not None:
                        logits = g.call_function(operator.add, (logits, bias))
                    new = g.call_function(torch.where, (keep, logits, masked_value(self._dtype(term.op))))
                    term.op.replace_all_uses_with(new)
                    g.erase_node(term.op)
                else:  # masked_fill / masked_fill_: True marks masked positions
                    keep, _ = self._keep_node(term, bool_means_keep=False)
                    x = term.op.args[0]
                    new = g.call_function(torch.where, (keep, x, masked_value(self._dtype(term.op))))
                    if term.kind == "masked_fill":
                        term.op.replace_all_uses_with(new)
                    else:  # in place: every later reader of x sees the masked tensor
                        order = {n: i for i, n in enumerate(g.nodes)}
                        for user in list(x.users):
                            if user is not term.op and user is not new and order[user] > order[term.op]:
                                user.replace_input_with(x, new)
                        term.op.replace_all_uses_with(new)
                    g.erase_node(term.op)
        return self._finish()

    def _where_at_softmax(self, pattern: _Pattern) -> None:
        """Masks with only elementwise ops (scaling) between them and the softmax: drop them where
        they are and apply one ``where`` on the softmax input, so the where feeds the softmax and the
        scaling never multiplies finfo.min."""
        terms = [t for t in pattern.masks if t.movable and t.kind in ("add", "masked_fill")]
        if not terms or pattern.softmax is None:
            for t in terms:
                t.movable = False
            return
        g = self.gm.graph
        dtype = self._dtype(pattern.softmax.all_input_nodes[0])
        keeps = []
        for term in terms:
            with g.inserting_before(term.op):
                keep, bias = self._keep_node(term, bool_means_keep=term.kind == "add")
                replacement = term.logits
                if bias is not None:
                    replacement = g.call_function(operator.add, (replacement, bias))
            keeps.append(keep)
            term.op.replace_all_uses_with(replacement)
            g.erase_node(term.op)
        softmax = pattern.softmax
        logits = softmax.all_input_nodes[0]
        with g.inserting_before(softmax):
            keep = keeps[0]
            for other in keeps[1:]:
                keep = g.call_function(torch.logical_and, (keep, other))
            new = g.call_function(torch.where, (keep, logits, masked_value(dtype)))
        softmax.replace_input_with(logits, new)

    def _explicit_sdpa(self, term: _MaskTerm) -> None:
        g, gm = self.gm.graph, self.gm
        n = term.op
        c = _sdpa_call(n)
        if c["enable_gqa"]:
            raise SiteUnsupported("scaled_dot_product_attention with enable_gqa is not rewritten")
        qv = self.values.get(c["query"])
        kv = self.values.get(c["key"])
        if not isinstance(qv, torch.Tensor) or not isinstance(kv, torch.Tensor):
            raise SiteUnsupported("query/key shapes unknown")
        scale = c["scale"] if c["scale"] is not None else 1.0 / math.sqrt(qv.shape[-1])
        dtype = qv.dtype
        with g.inserting_before(n):
            kt = g.call_method("transpose", (c["key"], -2, -1))
            logits = g.call_function(operator.mul, (g.call_function(torch.matmul, (c["query"], kt)), scale))
            if c["attn_mask"] is not None:
                keep, bias = self._keep_node(term, bool_means_keep=True)
                if bias is not None:
                    logits = g.call_function(operator.add, (logits, bias))
                logits = g.call_function(torch.where, (keep, logits, masked_value(dtype)))
            if c["is_causal"]:
                L, S = qv.shape[-2], kv.shape[-2]
                name = _unique_attr(gm, "causal_keep")
                gm.register_buffer(name, torch.ones(L, S, dtype=torch.bool).tril())
                logits = g.call_function(torch.where, (g.get_attr(name), logits, masked_value(dtype)))
            weights = g.call_function(torch.softmax, (logits, -1))
            out = g.call_function(torch.matmul, (weights, c["value"]))
        n.replace_all_uses_with(out)
        g.erase_node(n)

    def fuse_qkv(self, module: nn.Module | None = None) -> nn.Module:
        layout = self.qkv_layout()
        if layout.kind != "separate":
            raise SiteUnsupported(layout.reason)
        gm, g = self.gm, self.gm.graph
        q, k, v = (next(iter(s)) for s in (self.pattern.q, self.pattern.k, self.pattern.v))
        parts = [gm.get_submodule(n.target) for n in (q, k, v)]
        ref = parts[0].weight
        has_bias = any(p.bias is not None for p in parts)
        fused = nn.Linear(ref.shape[1], sum(p.out_features for p in parts), bias=has_bias, device=ref.device, dtype=ref.dtype)
        with torch.no_grad():
            fused.weight.copy_(torch.cat([p.weight for p in parts], 0))
            if has_bias:
                fused.bias.copy_(torch.cat([p.bias if p.bias is not None else torch.zeros(p.out_features, dtype=ref.dtype) for p in parts]))
        fused.train(parts[0].training)
        prefix = q.target.rpartition(".")[0]
        owner = gm.get_submodule(prefix) if prefix else gm
        base = "qkv" if not hasattr(owner, "qkv") and not hasattr(self.original, "qkv") else "qkv_fused"
        leaf = _unique_attr(owner, base)
        target = f"{prefix}.{leaf}" if prefix else leaf
        gm.add_submodule(target, fused)
        order = {n: i for i, n in enumerate(g.nodes)}
        first = min((q, k, v), key=order.__getitem__)
        with g.inserting_before(first):
            qkv = g.call_module(target, (q.args[0],))
            split = g.call_function(torch.split, (qkv, [p.out_features for p in parts]), {"dim": -1})
            outs = [g.call_function(operator.getitem, (split, i)) for i in range(3)]
        for old, new in zip((q, k, v), outs):
            old.replace_all_uses_with(new)
            g.erase_node(old)
        for n in (q, k, v):
            gm.delete_submodule(n.target)
        return self._finish()


def _fetch_attr(gm: nn.Module, target: str) -> torch.Tensor:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj
