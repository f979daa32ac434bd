"""Reports rendered from data: ``parity.json`` (the data), ``parity.md`` and ``parity.html``.

Both renderers take the ``parity.json`` dict, never live objects, so a finished run's report can be
re-rendered from its file (``vitexport parity OUT_DIR``). The package: :mod:`.common` (formatting,
the tables, the summary's facts and terms), :mod:`.markdown`, :mod:`.html` (self-contained: inline
CSS, plots embedded as base64 PNG), :mod:`.plots` (matplotlib's Agg canvas); this module writes and
reads the files.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from ...errors import BadInput
from ...io import atomic_write_json, atomic_write_text
from ..stage import ParityRun
from .common import md_code, md_text, overview, terms
from .html import render_html
from .markdown import render_markdown

__all__ = [
    "PARITY_JSON",
    "PARITY_MD",
    "PARITY_HTML",
    "write_reports",
    "render_reports",
    "load_run",
    "render_markdown",
    "render_html",
    "md_text",
    "md_code",
    "overview",
    "terms",
]

PARITY_JSON, PARITY_MD, PARITY_HTML = "parity.json", "parity.md", "parity.html"


def _as_dict(run: ParityRun | Mapping[str, Any]) -> dict[str, Any]:
    return run.to_dict() if isinstance(run, ParityRun) else dict(run)


def write_reports(out_dir: str | Path, run: ParityRun | Mapping[str, Any], *, html_plots: bool = True) -> dict[str, Path]:
    """Write ``parity.json``, ``parity.md`` and ``parity.html`` into ``out_dir`` (each atomically).

    Returns:
        file name → path: ``{"parity.json": ..., "parity.md": ..., "parity.html": ...}``.
    """
    out_dir = Path(out_dir)
    data = _as_dict(run)
    paths = {name: out_dir / name for name in (PARITY_JSON, PARITY_MD, PARITY_HTML)}
    atomic_write_json(paths[PARITY_JSON], data)
    atomic_write_text(paths[PARITY_MD], render_markdown(data))
    atomic_write_text(paths[PARITY_HTML], render_html(data, plots=html_plots))
    return paths


def load_run(out_dir: str | Path) -> ParityRun:
    """Read ``OUT_DIR/parity.json`` (or the file itself) into a :class:`ParityRun`.

    Raises:
        BadInput: no such file, or not a parity report.
    """
    p = Path(out_dir)
    if p.is_dir():
        p = p / PARITY_JSON
    if not p.is_file():
        raise BadInput(f"no parity report at {p} (expected the output folder of a finished run)")
    try:
        data = json.loads(p.read_text())
        if not isinstance(data, dict) or "stages" not in data:
            raise ValueError("no 'stages' key")
        return ParityRun.from_dict(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"{p}: not a parity report ({exc})") from None


def render_reports(out_dir: str | Path) -> dict[str, Path]:
    """Re-render ``parity.md`` and ``parity.html`` of a finished run from its ``parity.json``
    (``vitexport parity OUT_DIR``); ``parity.json`` itself is left as it is.

    Returns:
        file name → path, as :func:`write_reports`.
    Raises:
        BadInput: no readable ``parity.json`` in ``out_dir``.
    """
    p = Path(out_dir)
    folder = p if p.is_dir() else p.parent
    load_run(p)  # validates
    data = json.loads((folder / PARITY_JSON).read_text())
    paths = {name: folder / name for name in (PARITY_JSON, PARITY_MD, PARITY_HTML)}
    atomic_write_text(paths[PARITY_MD], render_markdown(data))
    atomic_write_text(paths[PARITY_HTML], render_html(data))
    return paths
