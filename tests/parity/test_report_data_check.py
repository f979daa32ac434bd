"""The report's "Calibration and parity data" section, rendered from ``parity.json``'s ``data_check``
(written by :func:`vitexport.calibration.sanity.check_data`): the preprocessing of each set, the
warnings, the statistics side by side; absent when a run has no such key (older files)."""
from __future__ import annotations

from vitexport.parity import render_html, render_markdown

CHECK = {
    "compared": True,
    "calibration": {"source": "data/<gray>", "kind": "images", "samples": 8, "short_side_px": 40,
                    "preprocess": {"summary": "resize the shorter side to 32 (bilinear), center crop 32x32; from timm"},
                    "inputs": {"x": {"mean": [0.1, 0.2, 0.3], "std": [0.6, 0.6, 0.6], "min": -1.6, "max": 2.0,
                                     "gray_share": 1.0}}},
    "parity": {"source": "heldout.npz", "kind": "arrays", "samples": 16, "preprocess": None,
               "inputs": {"x": {"mean": [0.0, 0.3, 0.4], "std": [0.9, 0.9, 1.0], "min": -2.1, "max": 2.6,
                                "gray_share": 0.0}}},
    "warnings": ["grayscale vs colour: 100% of the calibration samples are grayscale"],
}
RUN = {"passed": True, "model": "m", "target": "cpu", "stages": [], "data_check": CHECK}


def test_markdown_section_states_preprocessing_warnings_and_statistics():
    md = render_markdown(RUN)
    section = md.split("## Calibration and parity data", 1)[1]
    assert "preprocessing: resize the shorter side to 32 (bilinear), center crop 32x32; from timm" in section
    assert "parity: heldout.npz (16 samples); arrays fed as they are" in section
    assert "- **WARNING:** grayscale vs colour: 100% of the calibration samples are grayscale" in section
    assert "| x | mean per channel | 0.1, 0.2, 0.3 | 0, 0.3, 0.4 |" in section
    assert "| images' shorter side (median px) | 40 | – |" in section


def test_html_section_is_escaped_and_absent_without_data_check():
    page = render_html(RUN, plots=False)
    assert "<h2>Calibration and parity data</h2>" in page and "data/&lt;gray&gt;" in page and "<gray>" not in page
    assert "WARNING: grayscale vs colour" in page
    bare = {k: v for k, v in RUN.items() if k != "data_check"}
    assert "Calibration and parity data" not in render_html(bare, plots=False)
    assert "Calibration and parity data" not in render_markdown(bare)
