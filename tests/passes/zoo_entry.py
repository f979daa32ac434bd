"""The zoo as a user's model file: ``python:tests/passes/zoo_entry.py:build_<case>`` builds that case.

``vitexport export --model python:…`` calls ``build_<name>()``; it returns the case's model and one
example input (batch 1, what the pipeline exports). Hugging Face cases go through ``hf:`` folders
instead (:func:`write_hf_folder`), the way users hand them over.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))  # imported by file path: find the zoo beside it

from zoo_families import ZOO, ZooCase  # noqa: E402

__all__ = ["ENTRY", "CASES", "write_hf_folder"]

ENTRY = Path(__file__).resolve()
CASES: dict[str, ZooCase] = {c.name: c for c in ZOO}


def write_hf_folder(case: ZooCase, folder: Path) -> Path:
    """The case's Hugging Face model saved as a model folder (config.json + safetensors, random
    weights as the zoo built them); ``config.json`` loses ``architectures`` when the case says so."""
    adapter, _ = case.build()
    adapter.model.save_pretrained(folder)
    if case.hf == "base":
        cfg = json.loads((folder / "config.json").read_text())
        cfg.pop("architectures", None)
        (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def __getattr__(name: str) -> Callable:
    """``build_<case>``: the case's model and its first example input at batch 1."""
    if not name.startswith("build_") or name[6:] not in CASES:
        raise AttributeError(name)
    case = CASES[name[6:]]

    def build():
        model, make = case.build()
        return model, {k: v[:1] for k, v in make(0).items()}

    return build
