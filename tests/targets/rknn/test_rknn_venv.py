"""``make setup-rknn``'s venv: rknn-toolkit2's pinned numpy/onnx of its own, torch borrowed from the
project venv (scripts/share_torch.py) rather than a second 5.3 GB CUDA build. Skipped (saying why)
only where the venv could not be made."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vitexport.targets.rknn.client import rknn_missing, rknn_python

PROBE = ("import json, numpy, onnx, torch; "
         "print(json.dumps([torch.__file__, torch.__version__, numpy.__version__, onnx.__version__]))")


@pytest.mark.slow  # starts the rknn venv's interpreter and torch (~7 s): make test, not the fast lane
def test_the_rknn_venv_runs_the_projects_torch_beside_its_own_numpy():
    missing = rknn_missing()
    if missing:
        pytest.skip(missing)
    out = subprocess.run([str(rknn_python()), "-I", "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    torch_file, version, numpy_version, onnx_version = json.loads(out.stdout)
    assert Path(torch_file).resolve() == Path(torch.__file__).resolve()  # the same files, not a copy
    assert version == torch.__version__
    assert numpy_version.startswith("1.26.") and onnx_version == "1.18.0"  # rknn-toolkit2's pins, not the project's
    venv = rknn_python().parent.parent
    assert not any((venv / "lib").glob("python*/site-packages/torch")), "a second torch was installed"
    assert sys.modules["numpy"].__version__ != numpy_version  # the project keeps its own numpy
