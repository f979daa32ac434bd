"""Third-party output (native prints on file descriptors 1 and 2, Python prints) goes to the log."""
from __future__ import annotations

import ctypes
import logging
import os
import re
import sys

import pytest

from cli_helpers import run_cli
from vitexport.quiet import captured_output


def test_native_and_python_output_is_captured_and_logged(capfd, caplog):
    libc = ctypes.CDLL(None)
    with caplog.at_level(logging.DEBUG, logger="vitexport.thirdparty"):
        with captured_output("a library") as printed:
            libc.puts(b"from C on stdout")
            libc.fflush(None)
            os.write(2, b"raw on fd 2\n")
            print("from Python")
            print("to stderr", file=sys.stderr)
    cap = capfd.readouterr()
    assert cap.out == "" and cap.err == ""
    assert sorted(printed.lines) == sorted(["from C on stdout", "raw on fd 2", "from Python", "to stderr"])
    assert printed.note().startswith("a library printed 4 line(s), kept out of the terminal")
    assert {r.getMessage() for r in caplog.records} >= {"a library: raw on fd 2", "a library: from Python"}
    print("after")  # the descriptors are back
    assert capfd.readouterr().out == "after\n"


def test_output_is_kept_when_the_block_raises(capfd):
    try:
        with captured_output("x") as printed:
            os.write(1, b"dump before the error\n")
            raise ValueError("boom")
    except ValueError:
        pass
    assert printed.lines == ["dump before the error"] and capfd.readouterr().out == ""


@pytest.mark.slow
def test_verbose_export_shows_the_log_and_no_third_party_warning(tmp_path):
    """``vitexport -v export`` of the demo: torch's FutureWarning (``torch.distributed.reduce_op``,
    met by the preflight's memory probe) and numpy's "overflow encountered in cast" (float16's mask
    fill) reached stderr; every line there now is vitexport's log or a vitexport warning."""
    proc = run_cli("-v", "export", "--target", "orin", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert any(" vitexport.pipeline: " in ln for ln in lines), proc.stderr  # -v still logs the steps
    stray = [ln for ln in lines if not re.match(r"\d\d:\d\d:\d\d vitexport[.\w]*: |vitexport: warning: ", ln)]
    assert stray == [] and "Warning: " not in proc.stderr, proc.stderr
