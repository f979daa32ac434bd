"""Calibration sanity: calibration data that does not look like the parity data is warned about
(naming both sets, the statistic and by how much); the preprocessing of image folders is stated,
with where its numbers came from, on the terminal, in the reports and in the manifest."""
from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest
from PIL import Image

from vitexport import api
from vitexport.calibration import load_samples
from vitexport.calibration.images import resolve_pipeline
from vitexport.calibration.sanity import CalibrationMismatchWarning, check_data
from vitexport.demo import DEMO_CALIB, DEMO_HELDOUT
from vitexport.io import display_path
from vitexport.recipe import PreprocessSpec
from vitexport.sources.base import Preprocess

EX = {"x": np.zeros((1, 3, 32, 32), np.float32)}


def _photo(rng, size: int) -> np.ndarray:
    """A colour 'photo': smooth random colour patches (R, G, B drawn apart) plus a little noise."""
    cells = rng.integers(0, 256, size=(4, 4, 3)).astype(np.uint8)
    img = np.asarray(Image.fromarray(cells).resize((size, size), Image.Resampling.BILINEAR), np.float64)
    return np.clip(img + rng.normal(0, 8, img.shape), 0, 255)


def _folder(path, n=16, seed=0, size=40, gray=False, bright=False):
    """``n`` images written with PIL: colour, grayscale copies (mode L), or squeezed into bright values."""
    path.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(n):
        a = _photo(rng, size)
        if bright:
            a = 170 + a * 0.3  # a brighter, flatter set (another camera, another exposure)
        im = Image.fromarray(a.astype(np.uint8))
        (im.convert("L") if gray else im).save(path / f"{i:03d}.png")
    return path


def _check(calib, parity, example=EX):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check = check_data(load_samples(calib, example), load_samples(parity, example))
    return check, [str(w.message) for w in caught if issubclass(w.category, CalibrationMismatchWarning)]


def test_grayscale_calibration_against_colour_parity_warns_naming_both(tmp_path):
    gray = _folder(tmp_path / "gray_calib", seed=1, gray=True)
    colour = _folder(tmp_path / "colour_parity", seed=2)
    check, said = _check(gray, colour)
    assert len(said) == len(check.warnings) >= 1
    msg = next(m for m in said if "grayscale vs colour" in m)
    assert "gray_calib" in msg and "colour_parity" in msg
    assert "100% of the calibration samples are grayscale" in msg and "0% of the parity samples" in msg
    # the reverse is said too: colour calibration, grayscale parity
    _, said = _check(colour, gray)
    assert any("0% of the calibration samples are grayscale" in m and "100% of the parity" in m for m in said)


def test_shifted_calibration_set_warns_with_the_amount(tmp_path):
    bright = _folder(tmp_path / "bright", seed=1, bright=True)
    parity = _folder(tmp_path / "parity", seed=2)
    check, said = _check(bright, parity)
    mean = next(m for m in said if "mean differs by" in m)
    assert "bright" in mean and "parity" in mean and "parity std" in mean and "warned above 0.5" in mean
    shifts = [float(v) for v in mean.split("mean differs by ")[1].split(" parity std")[0].split(", ")]
    assert len(shifts) == 3 and min(shifts) > 0.5  # every channel, each by more than half a std
    assert any("std is 0.3" in m and "x the parity std" in m for m in said)


def test_matched_data_does_not_warn(tmp_path):
    """Two draws of the same kind of images (different seeds) and the bundled demo's two splits."""
    check, said = _check(_folder(tmp_path / "a", seed=1), _folder(tmp_path / "b", seed=2))
    assert check.compared and said == [] and check.warnings == []
    _, _, calib, parity, _ = api.prepare(target="cpu")  # the demo's splits, drawn as a run draws them
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check = check_data(calib, parity)
    assert check.compared and check.warnings == [] and caught == []
    assert (check.calibration["source"], check.parity["source"]) == (display_path(str(DEMO_CALIB)),
                                                                     display_path(str(DEMO_HELDOUT)))
    assert check.calibration["preprocess"] is None and check.calibration["kind"] == "arrays"


def test_resolution_difference_warns(tmp_path):
    small = _folder(tmp_path / "thumbs", seed=1, size=36)
    large = _folder(tmp_path / "photos", seed=2, size=160)
    _, said = _check(small, large)
    assert any("resolution 4.4x" in m and "calibration 36 px, parity 160 px" in m for m in said)


def test_the_same_source_is_not_compared(tmp_path):
    a = _folder(tmp_path / "a", gray=True)
    check, said = _check(a, a)
    assert not check.compared and said == [] and "same source" in check.why_not


def test_preprocessing_says_where_its_numbers_came_from():
    pre = Preprocess(input_size=(3, 32, 32), resize=37, crop=32, interpolation="bicubic", mean=(0.5,) * 3,
                     std=(0.5,) * 3, origin="timm's pretrained_cfg of vit_x (crop_pct 0.875)")
    p = resolve_pipeline((1, 3, 32, 32), pre, None)
    assert p.origin == "timm's pretrained_cfg of vit_x (crop_pct 0.875)"
    assert p.summary().startswith("resize the shorter side to 37 (bicubic), center crop 32x32")
    p = resolve_pipeline((1, 3, 32, 32), pre, PreprocessSpec(mean=(0.4, 0.4, 0.4)))
    assert p.origin.endswith("; mean from the recipe's calibration.preprocess") and p.mean == (0.4, 0.4, 0.4)
    assert "by default" in resolve_pipeline((1, 3, 32, 32), None, None).origin
    # where the numbers came from is not part of the content key: the same inputs, the same key
    assert p.describe() == resolve_pipeline((1, 3, 32, 32), None, PreprocessSpec(
        resize=37, interpolation="bicubic", mean=(0.4,) * 3, std=(0.5,) * 3)).describe()


def test_export_states_preprocessing_and_warns_in_terminal_report_and_manifest(tmp_path, tiny_vit_file):
    """An image-folder export: the preprocessing line is logged, the mismatch warned, the report
    and the manifest say both; the exit status (here: no exception) is unchanged."""
    gray = _folder(tmp_path / "gray_calib", seed=1, gray=True)
    colour = _folder(tmp_path / "colour_parity", seed=2)
    lines: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        arts = api.export(f"python:{tiny_vit_file}:build", "cpu", input_shape="1,3,32,32", calib=gray,
                          parity_data=colour, out=tmp_path / "out", log=lines.append,
                          overrides=["calibration.num_samples=8", "parity_data.num_samples=8"])
    assert arts.passed
    said = [str(w.message) for w in caught if issubclass(w.category, CalibrationMismatchWarning)]
    assert any("grayscale vs colour" in m for m in said)
    pre = [ln for ln in lines if ln.startswith("preprocessing of ")]
    assert len(pre) == 1 and "gray_calib" in pre[0] and "colour_parity" in pre[0]
    assert "resize the shorter side to 32 (bilinear), center crop 32x32" in pre[0] and "by default" in pre[0]
    md = (arts.out_dir / "parity.md").read_text()
    assert "## Calibration and parity data" in md and "resize the shorter side to 32" in md
    assert "**WARNING:** grayscale vs colour" in md
    assert "Calibration and parity data" in (arts.out_dir / "parity.html").read_text()
    api.render_parity(arts.out_dir)  # re-rendered from parity.json, the section stays
    assert "**WARNING:** grayscale vs colour" in (arts.out_dir / "parity.md").read_text()
    man = json.loads((arts.out_dir / "manifest.json").read_text())
    assert man["data_check"]["calibration"]["preprocess"]["mean"] == pytest.approx([0.485, 0.456, 0.406])
    assert any("grayscale" in w for w in man["data_check"]["warnings"])


def _run_on_a_terminal(args: list[str], cwd) -> tuple[int, str, str]:
    """``python -m vitexport ARGS`` with stderr on a pseudo-terminal (as a user sees it): exit code,
    stdout, stderr (read while it runs, so a full terminal buffer never blocks the command)."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")} | {"TERM": "xterm-256color"}
    proc = subprocess.Popen([sys.executable, "-m", "vitexport", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=slave, env=env)
    os.close(slave)
    chunks: list[bytes] = []

    def pump() -> None:
        while True:
            try:
                b = os.read(master, 4096)
            except OSError:  # EIO: the command closed the terminal
                return
            if not b:
                return
            chunks.append(b)

    reader = threading.Thread(target=pump)
    reader.start()
    out, _ = proc.communicate(timeout=600)
    reader.join(10)
    os.close(master)
    return proc.returncode, out.decode(), b"".join(chunks).decode(errors="replace")


def test_cli_prints_the_warning_yellow_and_the_preprocessing_line(tmp_path, tiny_vit_file):
    gray = _folder(tmp_path / "gray_calib", n=8, seed=1, gray=True)
    colour = _folder(tmp_path / "colour_parity", n=8, seed=2)
    code, out, err = _run_on_a_terminal(
        ["export", "--model", f"python:{tiny_vit_file}:build", "--target", "cpu", "--input-shape", "1,3,32,32",
         "--calib", str(gray), "--parity-data", str(colour), "--out", str(tmp_path / "out"),
         "--set", "stages.quantize_int8.enabled=false"], tmp_path)
    assert code == 0, err  # a warning, not an error
    warned = [ln for ln in err.splitlines() if "grayscale vs colour" in ln]
    assert len(warned) == 1 and "\x1b[33m" in warned[0]  # yellow
    assert "gray_calib" in warned[0] and "colour_parity" in warned[0]
    assert any(ln.startswith("preprocessing of calibration") and "center crop 32x32" in ln for ln in out.splitlines())
