"""The error boundary: which exit code an exception is, and the one line the user reads."""
from __future__ import annotations

import pytest

from hostile import write_user_model
from vitexport.cli import main
from vitexport.errors import (
    BadInput,
    InternalError,
    ParityFailure,
    ResourceLimit,
    UserCodeError,
    classify,
    user_code,
)
from vitexport.sources import load_model


def test_exit_codes_are_the_documented_ones():
    assert BadInput("x").exit_code == 2 and UserCodeError("x").exit_code == 2 and ResourceLimit("x").exit_code == 2
    assert ParityFailure("s", "m", 1.0, 2.0, ">=").exit_code == 1
    assert InternalError("x").exit_code == 3


def test_an_exception_in_our_code_is_internal():
    try:
        {}["missing"]
    except KeyError as exc:
        err = classify(exc)
    assert isinstance(err, InternalError) and "KeyError" in str(err)


def test_failed_allocations_are_resource_limits():
    import numpy as np

    try:
        np.empty(1 << 62, np.uint8)
    except MemoryError as exc:
        err = classify(exc)
    assert isinstance(err, ResourceLimit) and "smaller --input-shape" in str(err)


def test_user_code_errors_name_the_users_file_and_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_user_model(tmp_path)
    m = load_model(f"python:{path}:build_forward_raises")
    import torch

    with pytest.raises(UserCodeError) as info, user_code("running"):
        with torch.no_grad():
            m.module(**m.example_inputs)
    text = str(info.value)
    # the innermost line of the user's file, not of torch's module machinery
    line = next(i for i, s in enumerate(path.read_text().splitlines(), 1) if "forward exploded" in s)
    assert text.endswith(f"your model code raised ValueError: forward exploded (net.py:{line})"), text


def test_sys_exit_in_user_code_is_caught(tmp_path):
    with pytest.raises(UserCodeError, match=r"called sys.exit\(3\)"):
        load_model(f"python:{write_user_model(tmp_path)}:build_exits")


def test_internal_error_exits_3_with_the_traceback_in_error_log(tmp_path, monkeypatch, capsys):
    import vitexport.api as api

    def broken_pipeline(*args, **kwargs):  # a bug in our own code: the boundary must catch it
        raise KeyError("stage_table")

    monkeypatch.setattr(api, "run_pipeline", broken_pipeline)
    out = tmp_path / "out"
    assert main(["export", "--out", str(out)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitexport: error: internal error: KeyError"), err
    assert str(out / "error.log") in err[0]
    log = (out / "error.log").read_text()
    assert "Traceback" in log and "broken_pipeline" in log
    assert sorted(p.name for p in out.iterdir()) == ["error.log"]  # nothing half-made beside it

    assert main(["-v", "export", "--out", str(tmp_path / "again")]) == 3
    verbose = capsys.readouterr().err
    assert "Traceback" in verbose and "broken_pipeline" in verbose
    assert verbose.strip().splitlines()[-1].startswith("vitexport: error: internal error")


def test_verbose_shows_the_users_traceback(tmp_path, capsys):
    path = write_user_model(tmp_path)
    assert main(["-v", "export", "--model", f"python:{path}:build_raises", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "cannot build this" in err and "build_raises" in err


def test_warnings_are_one_line_each(tmp_path, capsys):
    """A skipped image is one 'vitexport: warning:' line, without a line of our source."""
    from hostile import forged_png

    path = write_user_model(tmp_path)
    images = tmp_path / "imgs"
    images.mkdir()
    from PIL import Image

    Image.new("RGB", (40, 40), (10, 200, 30)).save(images / "ok.png")
    (images / "junk.jpg").write_bytes(b"nope")
    forged_png(images / "huge.png", 100_000, 100_000)
    # the run then stops on the parity data, so only the loading of the calibration folder runs
    rc = main(["export", "--model", f"python:{path}:build", "--calib", str(images),
               "--parity-data", str(tmp_path / "missing.npz"), "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert err[0].startswith("vitexport: warning: ") and "skipped 2 unreadable image file(s)" in err[0]
    assert "huge.png (too large" in err[0] and "junk.jpg (not an image)" in err[0]
    assert "warnings.warn" not in err[0] and ".py:" not in err[0]
    assert err[1].startswith("vitexport: error: data path not found")
