"""The shape of the code, checked from its syntax tree: no import circle (in ``vitexport/`` and
``bench/``), no function over 80 lines in ``vitexport/``, and no target named outside
``vitexport/targets/`` (the rest of the package is handed a ``Target`` and asks it).

An import inside a function still counts as an edge: a circle dodged by a lazy import is a circle.
Only ``if TYPE_CHECKING:`` imports are left out (they never run). Importing ``a.b`` runs ``a`` first,
so it is an edge to the package ``a`` too, unless the importer lives inside ``a`` (then ``a`` is
initialising already).

A second, stricter view counts type-only imports too, between modules (a package's ``__init__``
re-exports left out): two modules that name each other's classes, even only in annotations, know
each other; the lower one takes a ``Protocol`` of what it reads (``stages.base.RunTarget``,
``quantize.annotate.AnnotateTarget``, ``targets.tensorrt.engine.TensorRTTarget``).
"""
from __future__ import annotations

import ast
from pathlib import Path

from cli_helpers import ROOT
from vitexport.targets import registered_targets

MAX_FUNCTION_LINES = 80


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module, type_only: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """Every import that can run: module level, in functions, in try / if blocks; TYPE_CHECKING ones
    only with ``type_only``."""
    hidden = set() if type_only else {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                                      and _type_checking(block) for n in ast.walk(block)}
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in hidden]


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The modules of ``known`` an import statement names (``from . import x`` names ``pkg.x``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def _sources(package: str) -> list[Path]:
    """The package's own modules: not those of a venv or cache kept inside it (``bench/.peers-venv``
    holds thousands of third-party files, some in a newer Python's syntax)."""
    root = ROOT / package
    return [p for p in root.rglob("*.py") if not any(part.startswith((".", "__pycache__")) for part in p.relative_to(root).parts)]


def import_graph(*packages: str) -> dict[str, set[str]]:
    """Module → the modules (of ``packages``) its imports run."""
    files = {_module_name(p): p for pkg in packages for p in _sources(pkg)}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text())):
            for target in _imported(node, module, is_package, set(files)):
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    name = ".".join(parts[:i])
                    inside = (module + ".").startswith(name + ".")  # a parent package of the importer
                    if name in files and name != module and not (inside and i < len(parts)):
                        graph[module].add(name)
    return graph


def module_graph(package: str) -> dict[str, set[str]]:
    """Module → the modules (not packages) it imports, type-only imports included."""
    files = {_module_name(p): p for p in _sources(package) if p.name != "__init__.py"}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        for node in _imports(ast.parse(path.read_text()), type_only=True):
            graph[module] |= {t for t in _imported(node, module, False, set(files)) if t in files and t != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_circle_hidden_in_a_function():
    """The check itself: a lazy import closing a loop is reported, a TYPE_CHECKING one is not."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\n"
                     "def f():\n    import y\n")
    assert [a.name for n in _imports(tree) for a in getattr(n, "names", [])] == ["TYPE_CHECKING", "y"]


def test_no_import_circle_in_vitexport():
    assert circles(import_graph("vitexport")) == []


def test_no_module_knows_a_module_that_knows_it_even_in_annotations():
    assert circles(module_graph("vitexport")) == []


def test_no_import_circle_in_bench():
    assert circles(import_graph("vitexport", "bench")) == []


def test_no_function_over_80_lines():
    long = [f"{p.relative_to(ROOT)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for p in sorted((ROOT / "vitexport").rglob("*.py"))
            for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def _device_strings(tree: ast.Module) -> set[int]:
    """ids of ``"cpu"``-like constants that name a torch device (``device=`` / ``map_location=``)."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.keyword) and n.arg in ("device", "map_location"):
            out.add(id(n.value))
        if isinstance(n, ast.arguments):
            named = [*n.posonlyargs, *n.args][-len(n.defaults):] if n.defaults else []
            out |= {id(d) for a, d in zip(named, n.defaults) if a.arg == "device"}
            out |= {id(d) for a, d in zip(n.kwonlyargs, n.kw_defaults) if d is not None and a.arg == "device"}
    return out


def test_no_target_is_named_outside_vitexport_targets():
    """quantize/, check/, stages/ and the rest are handed a Target: a target's name (or an enum
    member spelled after one) anywhere else in the package means a target's rule leaked out."""
    names = set(registered_targets())
    members = {n.replace("-", "_") for n in names}
    found = []
    for path in sorted((ROOT / "vitexport").rglob("*.py")):
        if path.relative_to(ROOT).parts[1] == "targets":
            continue
        tree = ast.parse(path.read_text())
        devices = _device_strings(tree)
        calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}  # tensor.cpu() is no target
        for n in ast.walk(tree):
            if isinstance(n, ast.Constant) and n.value in names and id(n) not in devices:
                found.append(f"{path.relative_to(ROOT)}:{n.lineno} {n.value!r}")
            if isinstance(n, ast.Attribute) and n.attr in members and id(n) not in calls:
                found.append(f"{path.relative_to(ROOT)}:{n.lineno} .{n.attr}")
    assert found == []
