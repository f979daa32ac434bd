"""Lend the project venv's torch to the rknn-toolkit2 venv: ``make setup-rknn`` runs this with the
project's interpreter after it has installed everything else into ``.venv-rknn``.

rknn-toolkit2 imports torch, and torch's Linux wheel brings its CUDA build (~5.3 GB: nvidia 3.2 GB,
triton 0.9 GB, torch 1.2 GB); a second copy ran CI's disk out. Instead, torch and the distributions it
requires (markers and extras evaluated here), less those the rknn venv already holds, are linked into
``<venv>/shared-torch/`` and one ``.pth`` line puts that folder on the rknn venv's ``sys.path`` after
its own site-packages: its numpy 1.26 / onnx 1.18 / protobuf 4.25 still come first, torch comes from
the project's single pin (pyproject.toml). Never ``pip install`` into ``.venv-rknn`` afterwards: an
uninstall there would follow the links into the project venv; ``make setup-rknn`` rebuilds it whole.

Usage: ``.venv/bin/python scripts/share_torch.py .venv-rknn``
"""
from __future__ import annotations

import glob
import importlib.metadata as md
import os
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

__all__ = ["torch_closure", "share", "main"]

#: the folder inside the rknn venv that holds the links, and the .pth that names it
SHARED, PTH = "shared-torch", "vitexport-shared-torch.pth"


def torch_closure(root: str = "torch") -> list[md.Distribution]:
    """``root`` and every distribution it requires here (recursively, with the extras it asks for).

    Returns:
        the installed distributions, ``root`` first.
    Raises:
        PackageNotFoundError: ``root`` is not installed in this interpreter's environment.
    """
    seen: dict[str, md.Distribution] = {}
    done: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    while todo:
        name, extras = todo.pop()
        if (canonicalize_name(name), extras) in done:
            continue
        done.add((canonicalize_name(name), extras))
        dist = seen.setdefault(canonicalize_name(name), md.distribution(name))
        for line in dist.requires or []:
            req = Requirement(line)
            envs = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, frozenset(req.extras)))
    return list(seen.values())


def _top_level(dist: md.Distribution) -> set[str]:
    """The site-packages entries a distribution installed (packages, modules, its dist-info), not
    its scripts (``../../bin``) or byte-code caches."""
    return {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}


def share(rknn_venv: Path) -> list[str]:
    """Link torch's closure, less what ``rknn_venv`` has installed, into ``<rknn_venv>/shared-torch``.

    Returns:
        the distributions linked.
    Raises:
        SystemExit: ``rknn_venv`` has no site-packages.
    """
    sites = glob.glob(str(rknn_venv / "lib" / "python*" / "site-packages"))
    if not sites:
        raise SystemExit(f"{rknn_venv}: no lib/python*/site-packages (create the venv first)")
    site = Path(sites[0])
    own = {canonicalize_name(d.metadata["Name"]) for d in md.distributions(path=[str(site)])}
    folder = rknn_venv.resolve() / SHARED
    folder.mkdir(exist_ok=True)
    linked = []
    for dist in torch_closure():
        name = canonicalize_name(dist.metadata["Name"])
        if name in own:  # the rknn venv's own (onnxruntime's sympy, setuptools<81): it keeps its pin
            continue
        source = Path(dist.locate_file(""))
        for entry in _top_level(dist):
            link = folder / entry
            if not link.exists():  # namespace folders (nvidia/, cuda/) are shared by several distributions
                os.symlink((source / entry).resolve(), link)
        linked.append(f"{dist.metadata['Name']}=={dist.version}")
    (site / PTH).write_text(f"{folder}\n")
    return linked


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    linked = share(Path(argv[0]))
    print(f"{argv[0]}: torch shared from {sys.prefix} ({len(linked)} distributions: {', '.join(sorted(linked)[:4])} ...)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
