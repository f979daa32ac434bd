"""The exit-code contract: bad input (a hostile file, a careless option, the user's model code
raising or lying, a run too large for memory) never gives a traceback or leaves an artifact: exit 2,
one line saying what to change. Interrupted runs resume to the same bytes; a full disk leaves the
previous artifacts intact."""
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
from hostile import CASES, write_user_model
from vitexport.cli import main
from vitexport.io import sha256_file


class _OpenFile:
    """Unpickling this would create a marker file: proof that code ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _tree(root: Path) -> dict[str, int]:
    """Every entry under ``root`` (not following links) with its size: what a run left behind."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = p.lstat().st_size if not p.is_dir() else -1
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input_exits_with_one_line_and_leaves_nothing(case, tmp_path, monkeypatch, capsys):
    """Each case: the exit code (2 for anything the user can change), one line on stderr that
    names what to change, no traceback, and nothing new on disk (no half-written artifact)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # a default output folder (build/...) would land here and be seen
    args = case.args(work)
    for k, v in case.env.items():
        monkeypatch.setenv(k, v)
    if case.command == "export" and "--out" not in args:
        args = [*args, "--out", str(work / "out")]
    before = _tree(work)
    rc = main([case.command, *args])
    cap = capsys.readouterr()
    assert rc == case.code, f"{case.name}: rc={rc}\n{cap.out}\n{cap.err}"
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitexport: error:"), cap.err
    assert "Traceback" not in cap.err + cap.out
    assert case.says.lower() in err[0].lower(), err[0]
    assert _tree(work) == before, f"{case.name} left files behind"


def test_the_table_covers_every_class():
    assert len(CASES) >= 60
    assert len({c.name for c in CASES}) == len(CASES)


# The same contract from a real process, for a representative subset and for the inputs that could
# hang one (a FIFO is opened only by someone who did not check it is a regular file).
SUBPROCESS_CASES = ["model file calls sys.exit at import", "forward raises", "input too large for memory",
                    "--out under a file"]


def _fifo_cases(tmp: Path) -> dict[str, list[str]]:
    user = ["--model", f"python:{write_user_model(tmp)}:build"]
    images = tmp / "imgs"
    images.mkdir()
    os.mkfifo(images / "frame.jpg")
    os.mkfifo(tmp / "weights.safetensors")
    os.mkfifo(tmp / "calib.npz")
    os.mkfifo(tmp / "net_fifo.py")
    return {
        "FIFO among calibration images": [*user, "--calib", str(images)],
        "FIFO as weights": ["--weights", str(tmp / "weights.safetensors")],
        "FIFO as calibration data": ["--calib", str(tmp / "calib.npz")],
        "FIFO as the model file": ["--model", f"python:{tmp / 'net_fifo.py'}:build"],
    }


FIFO_CASES = ["FIFO among calibration images", "FIFO as weights", "FIFO as calibration data", "FIFO as the model file"]


@pytest.mark.slow
@pytest.mark.parametrize("name", SUBPROCESS_CASES + FIFO_CASES)
def test_hostile_input_in_a_real_process(name, tmp_path):
    case = next((c for c in CASES if c.name == name), None)
    args = case.args(tmp_path) if case else _fifo_cases(tmp_path)[name]
    env = {**os.environ, **(case.env if case else {})}
    before = _tree(tmp_path)
    if "--out" not in args:
        args = [*args, "--out", str(tmp_path / "out")]
    proc = subprocess.run([sys.executable, "-m", "vitexport", "export", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 2, f"{name}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitexport: error:"), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    if case:
        assert case.says.lower() in err[0].lower()
    assert _tree(tmp_path) == before


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


FAST = ["--set", "stages.quantize_int8.enabled=false"]  # the torch and FP32 stages show these properties


def test_a_constant_reference_marks_the_gate_vacuous(tmp_path, capsys):
    path = write_user_model(tmp_path)
    out = tmp_path / "out"
    assert main(["export", "--model", f"python:{path}:build_zero_head", "--out", str(out), *FAST]) == 0
    err = capsys.readouterr().err
    assert "vitexport: warning: the parity gate is vacuous: the untouched model outputs all zeros" in err
    doc = json.loads((out / "parity.json").read_text())
    assert doc["passed"] and "all zeros" in doc["vacuous_gate"]
    assert "WARNING: the parity gate is vacuous" in (out / "parity.md").read_text().splitlines()[2]


@pytest.mark.slow
def test_identical_commands_write_identical_bytes_without_weights(tmp_path, capsys):
    """The user's build is not seeded; vitexport builds it under a fixed seed, whatever the
    process did before (here: a whole other run in the same interpreter)."""
    path = write_user_model(tmp_path)
    digests = []
    for name in ("a", "b"):
        assert main(["export", "--model", f"python:{path}:build", "--out", str(tmp_path / name), *FAST]) == 0
        digests.append({n: sha256_file(tmp_path / name / n) for n in ("model.raw.onnx", "model.fp32.onnx", "reference.npz")})
    assert digests[0] == digests[1]
