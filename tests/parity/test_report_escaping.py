"""User strings in parity.md are text: a path holding HTML or Markdown stays literal when rendered."""
from __future__ import annotations

import pytest
from markdown_it import MarkdownIt  # CommonMark, installed with rich

from vitexport.parity.report import md_code, md_text, render_html, render_markdown

EVIL_PATH = "python:/data/<img src=x onerror=alert(1)>/m.py:build"
EVIL_NOTE = "calibrated on /x/<script>alert(1)</script> | [click](http://evil) *bold* `tick` # heading"


def _run(**extra) -> dict:
    stage = {"stage": "quantize_int8", "engine": "onnxruntime", "passed": False, "metrics": {"max_abs": 1.0},
             "checks": [{"metric": "cosine_min", "value": 0.5, "limit": 0.98, "op": ">=", "passed": False}],
             "notes": [EVIL_NOTE], "artifacts": {"model.int8.onnx": "/o/<b>x</b>/model.int8.onnx"},
             "first_divergence": "blocks.0.<i>attn</i>"}
    return {"passed": False, "model": EVIL_PATH, "target": "orin", "data": "/d/`x`/a|b.npz", "notes": [EVIL_NOTE],
            "stages": [stage], **extra}


def test_markdown_report_renders_user_strings_as_text():
    html_out = MarkdownIt("commonmark").enable("table").render(render_markdown(_run()))
    for tag in ("<img", "<script", "<b>", "<i>", "<a href", "<h1>heading", "<em>bold"):
        assert tag not in html_out, tag
    assert "&lt;img src=x onerror=alert(1)&gt;" in html_out  # the path is still there, as text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html_out


def test_html_report_escapes_user_strings():
    out = render_html(_run(), plots=False)
    assert "<img src=x" not in out and "<script>" not in out and "&lt;script&gt;" in out


@pytest.mark.parametrize("text", ["a`b", "``x``", "`", "plain", "<b>|</b>"])
def test_code_spans_hold_any_text(text):
    html_out = MarkdownIt("commonmark").render(md_code(text))
    assert html_out.count("<code>") == 1 and "<b>" not in html_out


def test_plain_names_stay_readable():
    assert md_text("freeze_layernorm") == "freeze_layernorm"
    assert md_text("no --calib given: calibrated on the parity data") == "no --calib given: calibrated on the parity data"


def test_vacuous_gate_is_a_loud_warning():
    text = render_markdown(_run(passed=True, vacuous_gate="the untouched model outputs all zeros"))
    assert text.splitlines()[2].startswith("> **WARNING: the parity gate is vacuous.**")
