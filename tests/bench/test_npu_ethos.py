"""bench/npu.py's Ethos-U section: rendered from an export's figures and spliced into results-npu.md
without touching the RKNN / OpenVINO sections around it."""
from __future__ import annotations

from bench.npu import ETHOS_TITLE, _splice, render_ethos

ROW = {"n": 8, "exit": 0, "wall_s": 12.0,
       "simulate": {"cosine_min": 0.9974, "cosine_mean": 0.9999, "top1_agreement": 1.0, "accuracy": 0.9875,
                    "reference_accuracy": 0.9875},
       "build_engine": {"cosine_min": 0.9977}, "int8_share": 1.0,
       "runtime": {"npu_cycles": 361631, "latency_ms": 0.3616, "sram_kib": 28.0, "flash_kib": 194.77, "cpu_compute_ops": []}}


def test_the_ethos_section_replaces_itself_and_keeps_the_others():
    text = "# NPU bench\n\n## demo\n\nrknn rows\n\n## OpenVINO\n\nov rows\n"
    once = _splice(text, render_ethos({"demo": ROW}))
    assert once.count(ETHOS_TITLE) == 1 and "rknn rows" in once and "ov rows" in once
    assert "| 0 | 0.9974 |" in once and "361,631" in once and "| none |" in once
    failed = {"demo": {**ROW, "exit": 1, "error": "simulate: cosine_min 0.5 < 0.98"}}
    again = _splice(once, render_ethos(failed))
    assert again.count(ETHOS_TITLE) == 1 and "| 1 |" in again and "cosine_min 0.5" in again and "| 0 | 0.9974 |" not in again
    # a section in the middle of the file: what follows it survives
    middle = _splice(text.replace("## OpenVINO", ETHOS_TITLE + "\n\nold\n\n## OpenVINO"), render_ethos({"demo": ROW}))
    assert "old" not in middle and middle.index(ETHOS_TITLE) < middle.index("## OpenVINO") and "ov rows" in middle
