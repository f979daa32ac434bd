"""Attention in an observed run: softmax between two matrix products, or ``scaled_dot_product_attention``.

Every attention shares one shape, whatever library wrote it:

* a softmax whose input, walking back through scalings, head mixing (CaiT's talking heads), views,
  adds and masks, is a matmul / einsum / bmm of two operands that come from projections (q and k);
* the softmax output, walking forward, multiplied with a third projection output (v);
* or one ``scaled_dot_product_attention`` call (its ``attn_mask`` / ``is_causal`` are the mask).

The terms met on the way from the logits to the softmax are classified (:class:`MaskTerm`): a **mask**
is boolean, or holds only 0 and very negative values, and comes from the inputs or from constants
(padding, causality, shifted windows); a **bias** is anything else, a learned one when a parameter
feeds it (relative position tables). A parameter bias with a constant mask already added to it
(Hugging Face Swin, timm Swin's fused path) is ``mask+bias``, and the add that joined them is kept
so the mask can be read alone. The site of an attention is the innermost module whose forward holds
its logits product, softmax and output product.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .observation import ADD, LINEAR, MASKED_FILL, MATMUL, SDPA, SOFTMAX, WHERE, Node, Observation, Values
from .ops import MASKED_AT_OR_BELOW

__all__ = ["MaskTerm", "Pattern", "find_patterns"]

_MAX_WALK = 64
_PROJECTIONS = frozenset({LINEAR, "conv1d", "conv2d"})
_SCALAR_ELEMENTWISE = frozenset({
    "mul", "__mul__", "__rmul__", "__imul__", "div", "__truediv__", "__itruediv__",
    "to", "float", "type", "type_as", "contiguous",
})
_LAYOUT = frozenset({
    "view", "reshape", "unsqueeze", "squeeze", "expand", "expand_as", "permute", "transpose", "contiguous",
    "to", "float", "type_as", "clone", "flatten", "repeat", "__getitem__",
})


@dataclass(eq=False)
class MaskTerm:
    """One thing applied to the logits before the softmax.

    ``kind``: how it is applied (``add``, ``masked_fill``, ``masked_fill_``, ``where``, ``sdpa``, or
    ``causal`` for ``is_causal=True``). ``role``: ``mask``, ``mask+bias`` or ``bias``. ``source``:
    ``input``, ``constant`` or ``parameter``. ``split``: for ``mask+bias``, the add that joined a
    parameter bias and a mask, and the mask's argument there.
    """

    kind: str
    op: Node
    pos: int | str | None
    logits_pos: int | str | None
    role: str
    source: str
    values: Values | None
    split: tuple[Node, int | str] | None = None
    movable: bool = False

    @property
    def is_mask(self) -> bool:
        return self.role != "bias"

    def describe(self) -> str:
        what = {"input": "from the inputs", "constant": "constant", "parameter": "parameter-derived",
                "cached": "a tensor made before the run, e.g. a cache"}[self.source]
        if self.role == "bias":
            kind = {"parameter": "learned", "cached": "cached"}.get(self.source, "fixed")
            return f"{kind} bias ({what})"
        how = {"add": "additive", "sdpa": "scaled_dot_product_attention", "causal": "causal (is_causal)",
               "where": "torch.where"}.get(self.kind, "boolean masked_fill")
        if self.values is not None and self.values.is_bool and self.kind in ("add", "sdpa"):
            how = "boolean"
        extra = " with a learned bias" if self.split else (" with a bias" if self.role == "mask+bias" else "")
        return f"{how} mask{extra} ({what})"


@dataclass(eq=False)
class Pattern:
    """One attention: its logits product (or SDPA call), softmax, output product, projections, terms."""

    scores: Node
    softmax: Node | None
    out: Node | None
    q: frozenset[Node]
    k: frozenset[Node]
    v: frozenset[Node]
    terms: list[MaskTerm] = field(default_factory=list)
    site: int = -1  # the module call that holds it

    @property
    def masks(self) -> list[MaskTerm]:
        return [t for t in self.terms if t.is_mask]

    @property
    def biases(self) -> list[MaskTerm]:
        return [t for t in self.terms if not t.is_mask]


def _tensor_args(n: Node) -> list[tuple[Any, Node]]:
    return [(k, v) for k, v in n.args.items() if isinstance(v, Node)]


def _is_matmul(n: Node) -> bool:
    return n.name in MATMUL and len(_tensor_args(n)) == 2


def _distance(n: Node, memo: dict[int, int]) -> int:
    """Steps from ``n`` back to a matrix product (at most 12), not crossing projections or another
    attention; ``_MAX_WALK`` when there is none."""
    if id(n) in memo:
        return memo[id(n)]
    level, frontier, seen, found = 0, [n], {id(n)}, _MAX_WALK
    while frontier and level <= 12 and found == _MAX_WALK:
        nxt = []
        for m in frontier:
            if _is_matmul(m):
                found = level
                break
            # A projection on the way stops the search, except where it starts: CaiT mixes the heads
            # of its logits with a Linear before the softmax.
            if m.is_leaf or (level and _is_projection(m)) or m.name in SOFTMAX or m.name == SDPA:
                continue
            for i in m.inputs:
                if id(i) not in seen:
                    seen.add(id(i))
                    nxt.append(i)
        frontier, level = nxt, level + 1
    memo[id(n)] = found
    return found


def _very_negative(n: Node, key: Any) -> bool:
    v = n.args.get(key)
    if isinstance(v, Node):
        vals = n.values.get(key)
        v = vals.scalar if vals is not None else None
    return isinstance(v, (int, float)) and v <= MASKED_AT_OR_BELOW


def _source(n: Node) -> str:
    for flag, source in (("param", "parameter"), ("input", "input"), ("cached", "cached")):
        if flag in n.flags:
            return source
    return "constant"


def _find_split(n: Node) -> tuple[Node, int | str] | None:
    """The add that put a non-parameter 0 / -inf mask onto a parameter bias, behind layout ops."""
    for _ in range(8):
        if n.name in ADD:
            args = _tensor_args(n)
            if len(args) == 2:
                for (ka, a), (kb, b) in (args, args[::-1]):
                    vals = n.values.get(kb)
                    if "param" in a.flags and "param" not in b.flags and vals is not None and vals.any_masked and vals.binary:
                        return n, kb
            return None
        ins = _tensor_args(n)
        if n.name not in _LAYOUT or len(ins) != 1:
            return None
        n = ins[0][1]
    return None


def _term(kind: str, op: Node, pos: Any, logits_pos: Any) -> MaskTerm:
    node = op.args.get(pos) if pos is not None else None
    values = op.values.get(pos) if pos is not None else None
    source = _source(node) if isinstance(node, Node) else "constant"
    split = None
    if kind in ("masked_fill", "masked_fill_", "where", "causal") or (values is not None and values.is_bool):
        role = "mask"
    elif values is None:
        role = "bias"
    elif source == "parameter" and (split := _find_split(node)) is not None:
        # A mask joined to a learned bias: Swin's -100 plus a bias of +0.5 is -99.5, so the sum's
        # values cannot say it; the add that joined them can.
        role = "mask+bias"
    elif values.any_masked:
        # a learned bias that went very negative stays a bias
        role = "bias" if source == "parameter" else ("mask" if values.binary else "mask+bias")
    else:  # nothing masked: a mask only when it comes from the inputs (an unpadded batch)
        role = "mask" if values.all_zero and source == "input" else "bias"
    return MaskTerm(kind, op, pos, logits_pos, role, source, values, split)


def _add_operands(n: Node, memo: dict) -> tuple[Any, Any] | None:
    """(logits argument, other argument) of an add on the logits path."""
    args = _tensor_args(n)
    if len(args) == 1:
        return args[0][0], None
    if len(args) != 2:
        return None
    (ka, a), (kb, b) = args
    da, db = _distance(a, memo), _distance(b, memo)
    if da == db == _MAX_WALK:
        return None
    if da != db:
        return (ka, kb) if da < db else (kb, ka)
    # Both sides come from a product (a bias computed from q): the logits are the full-size side.
    return (kb, ka) if b.shape == n.shape and a.shape != n.shape else (ka, kb)


def _walk_logits(start: Node) -> tuple[Node | None, list[MaskTerm], list[Node]]:
    terms: list[MaskTerm] = []
    path: list[Node] = []
    memo: dict[int, int] = {}
    node = start
    for _ in range(_MAX_WALK):
        if _is_matmul(node):
            return node, terms, path
        if node.is_leaf or node.name in SOFTMAX or node.name == SDPA:
            return None, terms, path
        path.append(node)
        nxt: Any = None
        if node.name in ADD:
            ops = _add_operands(node, memo)
            if ops is None:
                return None, terms, path
            nxt = node.args[ops[0]]
            if ops[1] is not None:
                terms.append(_term("add", node, ops[1], ops[0]))
        elif node.name in MASKED_FILL and (_very_negative(node, 2) or _very_negative(node, "value")):
            terms.append(_term(node.name, node, 1 if 1 in node.args else "mask", 0))
            nxt = node.args.get(0)
        elif node.name in WHERE and _very_negative(node, 2):
            terms.append(_term("where", node, 0, 1))
            nxt = node.args.get(1)
        else:
            ins = [(k, i) for k, i in _tensor_args(node) if _distance(i, memo) < _MAX_WALK]
            if len(ins) > 1 and (node.name.endswith("_") or node.name == "__setitem__"):
                ins = [p for p in ins if p[0] == 0]  # in place: follow the tensor written to
            if len(ins) > 1:
                ins.sort(key=lambda p: (_distance(p[1], memo), p[1].shape != node.shape))
            nxt = ins[0][1] if ins else None
        if not isinstance(nxt, Node):
            return None, terms, path
        node = nxt
    return None, terms, path


def _is_projection(n: Node) -> bool:
    # A grouped convolution (depthwise pooling, a positional conv) moves tokens, it does not project.
    return n.name == LINEAR or (n.name in _PROJECTIONS and n.arg(6, "groups") in (None, 1))


def _sources(start: Any) -> frozenset[Node]:
    """The projection calls (Linear, or a 1-D/2-D convolution) an operand comes from."""
    found: set[Node] = set()
    todo, seen = ([start] if isinstance(start, Node) else []), set()
    while todo and len(seen) < 4 * _MAX_WALK:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if _is_projection(n):
            found.add(n)
        elif not (n.is_leaf or _is_matmul(n) or n.name in SOFTMAX or n.name == SDPA):
            todo.extend(n.inputs)
    return frozenset(found)


def _output_product(softmax: Node) -> tuple[Node | None, Node | None]:
    """(the product that applies the attention weights, its other operand)."""
    todo, seen = [(softmax, 0)], set()
    while todo:
        n, depth = todo.pop(0)
        if id(n) in seen or depth > 12:
            continue
        seen.add(id(n))
        for u in n.users:
            if _is_matmul(u):
                other = [v for _, v in _tensor_args(u) if v is not n]
                return u, (other[0] if other else None)
            if u.name not in SOFTMAX and u.name != SDPA:
                todo.append((u, depth + 1))
    return None, None


def _common_call(*nodes: Node | None) -> int:
    stacks = [n.stack for n in nodes if n is not None]
    common = -1
    for level in zip(*stacks):
        if len(set(level)) != 1:
            break
        common = level[0]
    return common


def _movable(term: MaskTerm, path: list[Node]) -> bool:
    """Only scalings and casts between the term and the softmax: the where can sit at the softmax."""
    if term.kind not in ("add", "masked_fill", "masked_fill_") or term.op not in path:
        return False
    between = path[: path.index(term.op)]
    return all(n.name in _SCALAR_ELEMENTWISE and len(_tensor_args(n)) == 1 and n.shape == term.op.shape for n in between)


def _sdpa_pattern(n: Node) -> Pattern:
    q, k, v = n.arg(0, "query"), n.arg(1, "key"), n.arg(2, "value")
    terms = []
    pos = 3 if 3 in n.args else "attn_mask"
    if isinstance(n.args.get(pos), Node):
        terms.append(_term("sdpa", n, pos, None))
    if n.arg(5, "is_causal") is True:
        terms.append(_term("causal", n, None, None))
    p = Pattern(n, None, n, _sources(q), _sources(k), _sources(v), terms)
    p.site = _common_call(n)
    return p


def find_patterns(obs: Observation) -> list[Pattern]:
    """Every attention in the observed run, in call order (each needs q and k from projections)."""
    found = []
    for n in obs.nodes:
        if n.name == SDPA:
            p = _sdpa_pattern(n)
        elif n.name in SOFTMAX and n.inputs:
            scores, terms, path = _walk_logits(n.inputs[0])
            if scores is None:
                continue
            (_, a), (_, b) = _tensor_args(scores)[:2]
            out, v = _output_product(n)
            for t in terms:
                t.movable = _movable(t, path)
            p = Pattern(scores, n, out, _sources(a), _sources(b), _sources(v), terms)
            p.site = _common_call(scores, n, out)
        else:
            continue
        if p.q and p.k and p.site >= 0:
            found.append(p)
    return found
