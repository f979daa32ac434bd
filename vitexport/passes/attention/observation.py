"""One observed run of the model: every torch call, the tensors it read, and the module that made it.

The passes recognise attention in what the model *does*, not in its source: the model runs once under
a ``TorchFunctionMode`` (PyTorch's supported hook for seeing torch calls) with a forward hook on every
module. Each call that returns a tensor becomes a :class:`Node` holding its arguments (other nodes or
plain values), the module calls open at that moment, and what its value depends on (``param``: a
parameter; ``input``: a model input). This sees through ``**kwargs`` forwards, ``torch.fx.wrap``-ped
functions, data-dependent Python and library dispatch tables alike, which a symbolic trace does not.

Operands of the ops that can apply a mask (add, ``masked_fill``, ``where``, the ``attn_mask`` of
``scaled_dot_product_attention``) get a :class:`Values` summary while they are alive, so nothing has
to be kept after the run.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from .ops import MASKED_AT_OR_BELOW

__all__ = [
    "ADD", "MATMUL", "SOFTMAX", "MASKED_FILL", "WHERE", "SDPA", "LINEAR", "COUNTED",
    "Values", "Node", "ModuleCall", "Observation", "func_name", "observe",
]

ADD = frozenset({"add", "__add__", "__radd__", "__iadd__", "add_"})
MATMUL = frozenset({"matmul", "__matmul__", "__rmatmul__", "bmm", "einsum"})
SOFTMAX = frozenset({"softmax"})
MASKED_FILL = frozenset({"masked_fill", "masked_fill_"})
WHERE = frozenset({"where"})
SDPA = "scaled_dot_product_attention"
LINEAR = "linear"
#: The calls a rewritten attention counts to find the one it replaces (see ``runtime``).
COUNTED = ADD | MASKED_FILL | SOFTMAX | {SDPA}
# Tensors made "like" another read only its shape and dtype: the result depends on nothing.
_SHAPE_ONLY = frozenset({
    "new_zeros", "new_ones", "new_full", "new_empty", "zeros_like", "ones_like", "empty_like", "full_like",
})
_MASK_OPS = ADD | MASKED_FILL | WHERE | {SDPA}


def func_name(func: Any) -> str:
    """The name a call is known by (a property read is named after its property)."""
    name = getattr(func, "__name__", "") or ""
    if name == "__get__":
        owner = getattr(func, "__self__", None)
        return getattr(owner, "__name__", "attribute")
    return name


@dataclass(frozen=True)
class Values:
    """What a mask-like operand held on the observed run (floats: 'masked' is <= -100)."""

    is_bool: bool
    shape: tuple[int, ...]
    any_true: bool = False  # booleans
    any_false: bool = False
    any_masked: bool = False  # floats
    binary: bool = False  # floats: every entry 0 or masked
    all_zero: bool = False
    scalar: float | None = None  # a one-element tensor's value
    keep: torch.Tensor | None = field(default=None, compare=False)  # floats with masked entries: t > -100

    @classmethod
    def of(cls, t: torch.Tensor) -> "Values":
        t = t.detach()
        shape = tuple(t.shape)
        if t.dtype == torch.bool:
            return cls(True, shape, any_true=bool(t.any()), any_false=bool((~t).any()))
        if not t.is_floating_point():
            return cls(False, shape, scalar=float(t) if t.numel() == 1 else None)
        scalar = float(t) if t.numel() == 1 else None
        if t.numel() == 0:
            return cls(False, shape, binary=True, all_zero=True)
        lo, hi = float(t.amin()), float(t.amax())
        if lo > MASKED_AT_OR_BELOW:  # the common case (activations, biases): two reductions, no copies
            zero = lo == 0.0 and hi == 0.0
            return cls(False, shape, binary=zero, all_zero=zero, scalar=scalar)
        masked, zero = t <= MASKED_AT_OR_BELOW, t == 0  # (NaN entries land here too: none is either)
        any_masked = bool(masked.any())
        return cls(
            False, shape, any_masked=any_masked, binary=bool((masked | zero).all()), all_zero=bool(zero.all()),
            scalar=scalar, keep=~masked if any_masked else None,
        )


@dataclass(eq=False)
class Node:
    """One tensor-producing call (or a leaf: a parameter, buffer, model input or other constant)."""

    seq: int
    name: str
    args: dict[int | str, Any] = field(default_factory=dict)  # position/keyword -> Node or plain value
    inputs: list["Node"] = field(default_factory=list)  # every tensor it read, nested ones too
    stack: tuple[int, ...] = ()  # ids of the module calls open when it ran (outermost first)
    flags: frozenset[str] = frozenset()  # "param", "input", "cached" (made before the run): what it depends on
    label: str = ""  # leaves: the tensor's name; linear: the nn.Linear that owns the weight
    shape: tuple[int, ...] = ()
    values: dict[int | str, Values] = field(default_factory=dict)  # summaries of mask-like operands
    users: list["Node"] = field(default_factory=list)

    @property
    def is_leaf(self) -> bool:
        return self.seq < 0

    def arg(self, *keys: int | str) -> Any:
        """The first of ``keys`` (positions or keywords) the call was given."""
        for k in keys:
            if k in self.args:
                return self.args[k]
        return None

    def __repr__(self) -> str:
        return f"Node({self.seq}, {self.name}{', ' + self.label if self.label else ''})"


@dataclass
class ModuleCall:
    """One call of a module's forward: ``start``/``end`` bound the sequence numbers of its calls."""

    id: int
    name: str
    module: nn.Module
    start: int
    end: int = -1
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Observation:
    """The observed run: its nodes in call order, module calls by id, and the model's output."""

    nodes: list[Node]
    calls: dict[int, ModuleCall]
    output: Any

    def calls_of(self, name: str) -> list[ModuleCall]:
        return [c for c in self.calls.values() if c.name == name]

    def ordinal(self, node: Node, call: ModuleCall) -> int:
        """How many calls named like ``node`` ran inside ``call`` before it (what a rewrite counts)."""
        return sum(1 for n in self.nodes[call.start:node.seq] if n.name == node.name and call.id in n.stack)


class _Observer(TorchFunctionMode):
    def __init__(self, model: nn.Module, inputs: dict[str, torch.Tensor]):
        super().__init__()
        self.nodes: list[Node] = []
        self.stack: tuple[int, ...] = ()
        self.live: dict[int, tuple[weakref.ref, Node]] = {}
        self.leaves: dict[int, Node] = {}
        for n, p in model.named_parameters(remove_duplicate=False):
            self.leaves.setdefault(id(p), Node(-1, "param", flags=frozenset({"param"}), label=n, shape=tuple(p.shape)))
        for n, b in model.named_buffers(remove_duplicate=False):
            self.leaves.setdefault(id(b), Node(-1, "buffer", label=n, shape=tuple(b.shape)))
        for n, t in inputs.items():
            self.leaves[id(t)] = Node(-1, "input", flags=frozenset({"input"}), label=n, shape=tuple(t.shape))
        self.keep = list(inputs.values())  # model inputs stay alive: their ids must not be reused
        self.linears = {id(m.weight): n for n, m in model.named_modules() if isinstance(m, nn.Linear)}

    def node_of(self, t: torch.Tensor) -> Node:
        hit = self.live.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
        leaf = self.leaves.get(id(t))
        if leaf is None:
            # A tensor no observed call made: a cached value (LeViT's attention biases), a plain
            # attribute. It depends on a parameter when autograd says so; else nobody knows.
            flags = frozenset({"param"}) if (t.requires_grad or t.grad_fn is not None) else frozenset({"cached"})
            leaf = Node(-1, "const", flags=flags, shape=tuple(t.shape))
            self.set_node(t, leaf)
        return leaf

    def set_node(self, t: torch.Tensor, node: Node) -> None:
        try:
            self.live[id(t)] = (weakref.ref(t), node)
        except TypeError:  # not weak-referenceable: it is not followed
            pass

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        name = func_name(func)
        if name == "__setitem__" and args and isinstance(args[0], torch.Tensor):
            outs = [args[0]]  # in place: the destination now holds a new value
        if outs:
            self._record(name, args, kwargs, outs)
        return out

    def _record(self, name: str, args: tuple, kwargs: dict, outs: list[torch.Tensor]) -> None:
        node = Node(len(self.nodes), name, stack=self.stack, shape=tuple(outs[0].shape))
        entries = list(enumerate(args)) + list(kwargs.items())
        flags: set[str] = set()
        for key, value in entries:
            if isinstance(value, torch.Tensor):
                node.args[key] = self.node_of(value)
                if name in _MASK_OPS:
                    node.values[key] = Values.of(value)
            elif isinstance(value, (int, float, bool, str, type(None))):
                node.args[key] = value
            for t in tree_leaves(value):
                if isinstance(t, torch.Tensor):
                    src = self.node_of(t)
                    node.inputs.append(src)
                    src.users.append(node)
                    flags |= src.flags
        node.flags = frozenset() if name in _SHAPE_ONLY else frozenset(flags)
        if name == LINEAR:
            w = args[1] if len(args) > 1 else kwargs.get("weight")
            node.label = self.linears.get(id(w), "")
        self.nodes.append(node)
        for t in outs:
            self.set_node(t, node)


def observe(
    model: nn.Module, inputs: dict[str, torch.Tensor], watch: set[str] = frozenset()
) -> Observation:
    """Run ``model(**inputs)`` once without gradients and record it.

    Args:
        model: the model; its modules get temporary forward hooks (removed before returning).
        inputs: keyword inputs of the run.
        watch: module names whose calls also keep their ``(args, kwargs)`` (for adapters).
    Returns:
        The :class:`Observation`.
    """
    obs = _Observer(model, inputs)
    calls: dict[int, ModuleCall] = {}
    handles = []

    def pre(name: str):
        def hook(module, args, kwargs):
            call = ModuleCall(len(calls), name, module, len(obs.nodes))
            if name in watch:
                call.args, call.kwargs = tuple(args), dict(kwargs)
            calls[call.id] = call
            obs.stack = obs.stack + (call.id,)

        return hook

    def post(module, args, output):
        if obs.stack:
            calls[obs.stack[-1]].end = len(obs.nodes)
            obs.stack = obs.stack[:-1]

    try:
        for name, module in model.named_modules():
            handles.append(module.register_forward_pre_hook(pre(name), with_kwargs=True))
            handles.append(module.register_forward_hook(post, always_call=True))
        with torch.no_grad(), obs:
            output = model(**inputs)
    finally:
        for h in handles:
            h.remove()
    return Observation(obs.nodes, calls, output)
