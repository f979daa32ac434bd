"""The heartbeat of a long wait: a line every ``every_s`` off a terminal, none for a short wait,
a transient spinner on a terminal."""
from __future__ import annotations

import time

from vitexport.progress import Heartbeat


def test_a_long_wait_says_it_is_still_running_every_interval():
    lines: list[str] = []
    with Heartbeat(every_s=0.2).track("compile", lines.append):
        time.sleep(0.75)
    assert 3 <= len(lines) <= 4, lines  # at 0.2, 0.4, 0.6 s (0.8 s on a slow join)
    assert all(l.startswith("compile: still running, ") and l.endswith(" s") for l in lines)
    n = len(lines)
    time.sleep(0.3)
    assert len(lines) == n  # the thread stopped with the block


def test_a_short_wait_says_nothing_and_an_error_still_stops_the_beat():
    lines: list[str] = []
    with Heartbeat(every_s=0.5).track("simplify", lines.append):
        time.sleep(0.05)
    assert lines == []
    try:
        with Heartbeat(every_s=0.1).track("build", lines.append):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    n = len(lines)
    time.sleep(0.25)
    assert len(lines) == n


def test_on_a_terminal_a_spinner_replaces_the_lines():
    lines: list[str] = []
    with Heartbeat(every_s=0.1, live=True).track("compile", lines.append):
        time.sleep(0.3)
    assert lines == []
