"""vitexport as a user installs it: a wheel built from the checkout, installed by pip into a venv
outside the checkout, run from a folder that is not the checkout.

What this proves is what an editable install hides: the package data (recipes, demo) and the entry
points travel in the wheel, and nothing reads the checkout. The wheel's dependencies are the ones
``make setup`` has just installed from the same requirement list, so the fresh venv borrows them
from the project's venv (one ``.pth`` line naming its site-packages; the editable install's own
``.pth`` hooks there are not run, so the checkout stays off ``sys.path``) instead of a second 6 GB
copy of torch's CUDA build, which ran CI's disk out; ``pip check`` proves they satisfy the wheel.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from cli_helpers import ROOT

pytestmark = pytest.mark.slow

#: package data an installed vitexport reads: each target's recipe and the demo (model, weights, splits)
PACKAGE_DATA = ("vitexport/targets/tensorrt/orin.yaml", "vitexport/targets/tensorrt/orin-jp5.yaml",
                "vitexport/targets/npu.yaml", "vitexport/targets/cpu.yaml", "vitexport/targets/rknn/rk3588.yaml",
                "vitexport/targets/openvino/openvino.yaml", "vitexport/targets/rknn/worker.py",
                "vitexport/demo/demo_vit.safetensors", "vitexport/demo/calib.npz", "vitexport/demo/heldout.npz")


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _clean_env() -> dict[str, str]:
    """This process's environment without anything that points Python at the checkout or its venv."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(ROOT)))
    return env


def _build_wheel(dest: Path) -> Path:
    """The wheel of a copy of the checkout's package sources (setuptools leaves ``build/`` and
    ``*.egg-info`` where it builds, and a stale ``build/lib`` would slip old modules into the wheel)."""
    src = dest / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "vitexport", src / "vitexport", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", dest, src], dest, _clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheels = list(dest.glob("vitexport-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _venv(work: Path, env: dict[str, str]) -> Path:
    """A venv outside the checkout that sees the project venv's packages as its dependencies."""
    venv = work / "venv"
    base = getattr(sys, "_base_executable", sys.executable)  # the interpreter the project venv was made from
    proc = _run([base, "-m", "venv", "--without-pip", venv], work, env)
    assert proc.returncode == 0, proc.stderr
    site = Path(_run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     work, env).stdout.strip())
    deps = Path(sysconfig.get_paths()["purelib"])  # this (project) venv's site-packages
    assert not deps.resolve().is_relative_to(site.resolve())
    (site / "zz-project-deps.pth").write_text(f"{deps}\n")
    return venv


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv, wheel, a working folder outside the checkout) with the freshly built wheel installed."""
    work = tmp_path_factory.mktemp("installed")
    assert not work.resolve().is_relative_to(ROOT)
    env = _clean_env()
    wheel = _build_wheel(work)
    venv = _venv(work, env)
    py = venv / "bin" / "python"
    proc = _run([py, "-m", "pip", "install", "--quiet", "--no-deps", wheel], work, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _run([py, "-m", "pip", "check"], work, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the borrowed dependencies satisfy this wheel
    return venv, wheel, work, env


def test_the_wheel_carries_the_recipes_and_the_demo_as_real_files(installed):
    _, wheel, _, _ = installed
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for name in PACKAGE_DATA:
            assert name in names, name
            assert z.read(name) == (ROOT / name).read_bytes(), f"{name} differs from the checkout's"


def test_installed_vitexport_lists_exports_and_checks_from_any_folder(installed):
    venv, _, work, env = installed
    cli = venv / "bin" / "vitexport"
    where = _run([venv / "bin" / "python", "-c", "import vitexport; print(vitexport.__file__)"], work, env)
    assert Path(where.stdout.strip()).resolve().is_relative_to(venv.resolve()), where.stdout  # not the checkout

    targets = _run([cli, "targets"], work, env)
    assert targets.returncode == 0, targets.stderr
    assert {line.split()[0] for line in targets.stdout.splitlines()} >= {"orin", "orin-jp5", "npu", "cpu"}

    out = work / "demo-orin"
    export = _run([cli, "export", "--target", "orin", "--out", out], work, env)
    assert export.returncode == 0, export.stdout + export.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["passed"] and {"model.int8.onnx", "build_engine.sh", "calibration.cache"} <= set(manifest["artifacts"])

    check = _run([cli, "check", out / "model.int8.onnx", "--target", "orin"], work, env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "passes the" in check.stdout and "recipes/orin.yaml" in check.stdout
