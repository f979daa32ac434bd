"""Third-party output (native prints on file descriptors 1 and 2, Python prints) goes to the log; transformers'
"Loading weights" bars never reach the terminal while an ``hf:`` model loads (a tiny folder saved here)."""
from __future__ import annotations

import ctypes
import logging
import os
import re
import sys

import pytest

from cli_helpers import run_cli
from vitexport.quiet import captured_output, quiet_transformers

transformers = pytest.importorskip("transformers")


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


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    """A 2-layer ViT classifier folder with safetensors weights (transformers' own save)."""
    folder = tmp_path_factory.mktemp("tiny-hf-vit")
    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                 image_size=32, patch_size=8, num_labels=3)
    with captured_output("save_pretrained"):  # its "Writing model shards" bar is the test's, not the subject
        transformers.ViTForImageClassification(cfg).save_pretrained(folder)
    return folder


def test_from_pretrained_draws_a_bar_unless_quieted(tiny_hf, capfd):
    transformers.utils.logging.enable_progress_bar()  # a user's process where bars are on
    transformers.ViTForImageClassification.from_pretrained(str(tiny_hf), local_files_only=True)
    assert "Loading weights" in capfd.readouterr().err  # what leaks without the quieting
    with quiet_transformers() as printed:
        transformers.ViTForImageClassification.from_pretrained(str(tiny_hf), local_files_only=True)
    out = capfd.readouterr()
    assert "Loading weights" not in out.err + out.out and "it/s" not in out.err
    assert not any("Loading weights" in line for line in printed.lines)  # not drawn at all, not merely hidden
    assert transformers.utils.logging.is_progress_bar_enabled()  # the process's own setting is given back


def test_an_hf_export_source_prints_no_progress_bar(tiny_hf, capfd):
    from vitexport.sources import load_model

    transformers.utils.logging.enable_progress_bar()
    model = load_model(f"hf:{tiny_hf}")
    out = capfd.readouterr()
    assert model.module is not None
    assert "Loading weights" not in out.err + out.out and "%|" not in out.err, out.err[-500:]
