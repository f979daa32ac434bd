"""Bad input never gives a traceback or leaves an artifact: exit 2, one line. Interrupted runs resume
to the same bytes; a full disk leaves the previous artifacts intact."""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cli_helpers import ROOT, run_cli
from vitexport.io import sha256_file


class _OpenFile:
    """Unpickling this would create a marker file: proof that code ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _bad_inputs(tmp: Path) -> dict[str, list[str]]:
    from vitexport.demo import DEMO_MODEL_URI

    (tmp / "empty.safetensors").write_bytes(b"")
    (tmp / "corrupt.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json" + b"\0" * 64)
    good = ROOT / "vitexport" / "demo" / "demo_vit.safetensors"
    (tmp / "truncated.safetensors").write_bytes(good.read_bytes()[:5000])
    torch.save({"w": torch.zeros(1), "x": _OpenFile(tmp / "PWNED")}, tmp / "evil.pt")
    (tmp / "empty_dir").mkdir()
    (tmp / "junk_dir").mkdir()
    for i in range(3):
        (tmp / "junk_dir" / f"img{i}.jpg").write_bytes(b"not an image at all")
    np.savez(tmp / "wrong_shape.npz", x=np.zeros((4, 3, 32, 32), np.float32))
    (tmp / "bad.yaml").write_text("target: orin\ncalibration:\n  methd: minmax\n")
    (tmp / "badtype.yaml").write_text("target: orin\ncalibration:\n  num_samples: many\n")
    m = ["--model", DEMO_MODEL_URI]
    return {
        "missing weights": [*m, "--weights", str(tmp / "nope.safetensors")],
        "empty weights": [*m, "--weights", str(tmp / "empty.safetensors")],
        "corrupt weights": [*m, "--weights", str(tmp / "corrupt.safetensors")],
        "truncated weights": [*m, "--weights", str(tmp / "truncated.safetensors")],
        "pickle checkpoint": [*m, "--weights", str(tmp / "evil.pt")],
        "unknown target": ["--target", "jetson-nano"],
        "unknown recipe key": ["--target", str(tmp / "bad.yaml")],
        "mistyped recipe key": ["--target", str(tmp / "badtype.yaml")],
        "unknown --set key": ["--set", "quantization.equalise=false"],
        "malformed input shape": ["--model", "timm:vit_tiny_patch16_224", "--input-shape", "1x3xbig"],
        "unknown model name": ["--model", "timm:vit_gigantic_patch99"],
        "missing python file": ["--model", f"python:{tmp / 'missing.py'}:build"],
        "empty calibration folder": ["--calib", str(tmp / "empty_dir")],
        "unreadable calibration folder": ["--calib", str(tmp / "junk_dir")],
        "parity data of the wrong shape": ["--parity-data", str(tmp / "wrong_shape.npz")],
    }


CASES = [
    "missing weights", "empty weights", "corrupt weights", "truncated weights", "pickle checkpoint",
    "unknown target", "unknown recipe key", "mistyped recipe key", "unknown --set key",
    "malformed input shape", "unknown model name", "missing python file", "empty calibration folder",
    "unreadable calibration folder", "parity data of the wrong shape",
]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_exits_2_with_one_line_and_no_artifact(tmp_path, case):
    args = _bad_inputs(tmp_path)[case]
    out = tmp_path / "out"
    proc = run_cli("export", *args, "--out", str(out))
    assert proc.returncode == 2, f"{case}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitexport: error:"), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not out.exists(), f"{case}: left {list(out.iterdir())}"
    assert not (tmp_path / "PWNED").exists(), "the pickle's code ran"


def test_trust_pickle_is_explicit(tmp_path):
    """With --trust-pickle a legacy checkpoint is read (and the user accepted that it runs code)."""
    from vitexport.demo import DEMO_MODEL_URI, DEMO_WEIGHTS
    from safetensors.torch import load_file

    sd = load_file(str(DEMO_WEIGHTS))
    torch.save({"model": sd, "epoch": _OpenFile(tmp_path / "RAN")}, tmp_path / "legacy.pth")
    proc = run_cli("export", "--model", DEMO_MODEL_URI, "--weights", str(tmp_path / "legacy.pth"), "--trust-pickle",
                   "--out", str(tmp_path / "o"), "--set", "stages.quantize_int8.enabled=false")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "RAN").exists()


def _digests(folder: Path) -> dict[str, str]:
    return {n: sha256_file(folder / n) for n in ("model.fp32.onnx", "model.int8.onnx", "calibration.json")}


def test_killed_run_resumes_to_identical_bytes(tmp_path):
    slow = ["--set", "calibration.method=entropy", "--set", "calibration.num_samples=200"]
    straight = tmp_path / "straight"
    assert run_cli("export", "--out", str(straight), *slow).returncode == 0
    resumed = tmp_path / "resumed"
    proc = subprocess.Popen([sys.executable, "-m", "vitexport", "export", "--out", str(resumed), *slow],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    state = resumed / ".vitexport-state.json"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if state.is_file() and "simplify" in json.loads(state.read_text() or "{}"):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (resumed / "model.int8.onnx").exists()
    again = run_cli("export", "--out", str(resumed), *slow)
    assert again.returncode == 0, again.stderr
    man = json.loads((resumed / "manifest.json").read_text())
    assert {"export_onnx", "simplify"} <= set(man["resumed_stages"])
    assert _digests(resumed) == _digests(straight)


def test_full_disk_keeps_previous_artifacts(tmp_path):
    out = tmp_path / "o"
    assert run_cli("export", "--out", str(out)).returncode == 0
    before = {p.name: sha256_file(p) for p in out.iterdir() if p.is_file()}

    def small_disk():
        # the file-size limit makes every large write fail the way a full disk does (EFBIG ~ ENOSPC)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    proc = subprocess.run([sys.executable, "-m", "vitexport", "export", "--out", str(out), "--no-resume"],
                          cwd=ROOT, capture_output=True, text=True, preexec_fn=small_disk, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cannot write" in proc.stderr and "Traceback" not in proc.stderr
    after = {p.name: sha256_file(p) for p in out.iterdir() if p.is_file()}
    assert after == before
