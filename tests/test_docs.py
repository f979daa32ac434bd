"""The README as a newcomer reads it: short, the three commands first, every linked page there, no history."""
from __future__ import annotations

import re

import pytest

from cli_helpers import ROOT

README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def test_readme_is_one_screen_of_start_then_links():
    text = README.read_text()
    assert len(text) <= 15_000, f"README.md is {len(text)} characters (at most 15,000: move detail to docs/)"
    head = "\n".join(text.splitlines()[:40])
    for command in ("make setup", "make export TARGET=orin", "make test"):
        assert command in head, f"{command!r} is not in README.md's first 40 lines"
    for page in ("targets", "recipes", "calibration", "parity", "bench", "development"):
        assert f"docs/{page}.md" in text, f"README.md does not link docs/{page}.md"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    for target, _anchor in LINK.findall(page.read_text()):
        if "://" in target:
            continue
        assert (page.parent / target).resolve().exists(), f"{page.name} links {target}, which does not exist"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_docs_describe_the_present_not_history(page):
    text = page.read_text().lower()
    for phrase in ("formerly", "is gone", "no longer", "at commit", "previous run", "used to "):
        assert phrase not in text, f"{page.name} says {phrase!r}: describe what is, not what was"
