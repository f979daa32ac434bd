"""The shape of the code, checked from its syntax tree: no import circle (in ``vitexport/`` and
``bench/``), no function over 80 lines in ``vitexport/``, no target named outside
``vitexport/targets/`` (the rest of the package is handed a ``Target`` and asks it), and one folder per
vendor backend there: a vendor's name (TensorRT, RKNN, OpenVINO, Vela...) appears in code only inside its
folder, and only the entry points (``api``, ``cli``) import ``vitexport.targets``.

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
import re
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


#: each backend folder under ``vitexport/targets/`` and the words that name its vendor in code (an
#: identifier, an import, a string that is not a docstring; comments and docstrings may name anyone)
VENDOR_WORDS = {
    "tensorrt": r"tensorrt|polygraphy|(?<![a-z])trt",
    "rknn": r"rknn|rockchip",
    "openvino": r"openvino",
    "ethos_u": r"(?<![a-z])ethos|(?<![a-z])vela(?![a-z])",
}
#: the modules that build a run's target from a name; everything else is handed one (or a protocol of it)
TARGET_IMPORTERS = {"vitexport.api", "vitexport.cli"}
#: backend folders the package ships at least
MIN_BACKENDS = 4


def _code_words(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, text) of what code says: names, attributes, definitions, arguments, keywords, imported
    modules, and string constants that are not docstrings (a statement that is only a string)."""
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    out: list[tuple[int, str]] = []
    for n in ast.walk(tree):
        line = getattr(n, "lineno", 0)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            out.append((line, n.value))
        elif isinstance(n, ast.Name):
            out.append((line, n.id))
        elif isinstance(n, ast.Attribute):
            out.append((line, n.attr))
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append((line, n.name))
        elif isinstance(n, ast.arg):
            out.append((line, n.arg))
        elif isinstance(n, ast.keyword) and n.arg:
            out.append((line, n.arg))
        elif isinstance(n, ast.ImportFrom):
            out += [(line, n.module or "")] + [(line, a.name) for a in n.names]
        elif isinstance(n, ast.Import):
            out += [(line, a.name) for a in n.names]
    return out


def vendor_names(source: str, vendors: dict[str, str] = VENDOR_WORDS) -> list[tuple[int, str, str]]:
    """(line, vendor, text) for each word of code in ``source`` that names one of ``vendors``."""
    return [(line, vendor, text) for line, text in _code_words(ast.parse(source))
            for vendor, pattern in vendors.items() if re.search(pattern, text, re.IGNORECASE)]


def test_the_vendor_check_reads_code_not_prose():
    """The check itself: an import, a name and a file suffix are code; a docstring and a comment are prose."""
    source = ('"""Runs on TensorRT."""\nimport tensorrt as x  # TensorRT\n'
              'def f(path):\n    """OpenVINO too."""\n    return path.suffix == ".trt" or OpenVinoRunner\n'
              'STARTED = "restart"\n')
    assert sorted((line, vendor) for line, vendor, _ in vendor_names(source)) == [
        (2, "tensorrt"), (5, "openvino"), (5, "tensorrt")]


def test_no_vendor_is_named_in_code_outside_vitexport_targets():
    """quantize/, parity/, runners/ and the rest reach a backend through its target (``Target.contribution``,
    ``Target.open_artifact``...): a vendor named anywhere else means a backend leaked out of its folder."""
    found = [f"{p.relative_to(ROOT)}:{line} {vendor}: {text[:80]!r}"
             for p in _sources("vitexport") if p.relative_to(ROOT).parts[1] != "targets"
             for line, vendor, text in vendor_names(p.read_text())]
    assert found == []


def test_a_vendor_is_named_only_in_its_own_backend_folder():
    """Inside targets/ too: the shared machinery (``_base``, ``_registry``, the ``cpu``/``npu`` contracts)
    and other backends name no vendor; the package's ``__init__`` only imports the folders."""
    root = ROOT / "vitexport" / "targets"
    found = []
    for p in _sources("vitexport/targets"):
        rel = p.relative_to(root)
        if rel == Path("__init__.py"):
            continue
        own = rel.parts[0] if len(rel.parts) > 1 else None
        found += [f"{p.relative_to(ROOT)}:{line} {vendor}: {text[:80]!r}"
                  for line, vendor, text in vendor_names(p.read_text()) if vendor != own]
    assert found == []


def test_only_the_entry_points_import_vitexport_targets():
    """Lower layers type against the protocols they read (``stages.base.RunTarget``,
    ``quantize.target.QuantizeTarget``, ``check.CheckTarget``), even in annotations: nothing below the
    entry points points back at targets/."""
    files = {_module_name(p): p for p in _sources("vitexport")}
    found = []
    for module, path in files.items():
        if module == "vitexport.targets" or module.startswith("vitexport.targets.") or module in TARGET_IMPORTERS:
            continue
        for node in _imports(ast.parse(path.read_text()), type_only=True):
            names = _imported(node, module, path.name == "__init__.py", set(files))
            found += [f"{module}:{node.lineno} imports {n}" for n in names
                      if n == "vitexport.targets" or n.startswith("vitexport.targets.")]
    assert found == []


def test_one_folder_per_backend_and_no_toolchains_folder():
    """A vendor is one folder under targets/ (Polygraphy's backend/<runtime>/), each registering a target."""
    assert not (ROOT / "vitexport" / "toolchains").exists()
    folders = sorted(p.parent.name for p in (ROOT / "vitexport" / "targets").glob("*/__init__.py"))
    assert len(folders) >= MIN_BACKENDS, folders
    homes = {cls.__module__.split(".")[2] for cls in registered_targets().values()
             if cls.__module__.startswith("vitexport.targets.") and cls.__module__.count(".") >= 3}
    assert [f for f in folders if f not in homes] == [], "a backend folder that registers no target"
