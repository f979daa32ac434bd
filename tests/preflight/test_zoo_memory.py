"""A 16 GB machine takes every zoo model users deploy below 50 M parameters at its own input size:
the memory pre-check measures the real model's forward (fake tensors), so it refuses none of them
(the estimate it replaced refused GCViT-XXTiny at 28 GB, NextViT-S at 42 GB and, at 16 GB,
TinyViT-5M at 17.6 GB; their real peak is 1.2-1.7 GB)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "passes"))

from vitexport.errors import ResourceLimit  # noqa: E402
from vitexport.sources import load_model  # noqa: E402
from zoo_families import ZOO  # noqa: E402

MAX_PARAMS = 50_000_000
REAL = sorted({c.real for c in ZOO if c.real})


def _uri(real: str, tmp: Path) -> str:
    """``hf:ConfigClass`` becomes a folder holding that config's defaults (the published model's)."""
    if not real.startswith("hf:"):
        return real
    import transformers

    cfg = getattr(transformers, real[3:])().to_dict()
    cfg.pop("architectures", None)
    (tmp / "config.json").write_text(json.dumps(cfg))
    return f"hf:{tmp}"


@pytest.mark.zoo
@pytest.mark.parametrize("real", REAL)
def test_a_16g_machine_takes_every_zoo_model_below_50m_params(real, tmp_path, monkeypatch):
    monkeypatch.setenv("VITEXPORT_MEMORY_LIMIT", "16G")
    try:
        m = load_model(_uri(real, tmp_path))  # the pre-check runs here, on the full-size model
    except ResourceLimit as err:
        pytest.fail(f"{real}: refused at 16 GB: {err}")
    params = sum(p.numel() for p in m.module.parameters())
    if params >= MAX_PARAMS:
        pytest.skip(f"{real}: {params / 1e6:.0f} M parameters")
    assert min(m.example_inputs[k].shape[-1] for k in m.example_inputs) >= 32  # its own size, not a toy one


def test_the_zoo_names_its_full_size_models():
    assert len(REAL) >= 40 and any(r.startswith("hf:") for r in REAL) and any(r.startswith("torchvision:") for r in REAL)


def test_an_explicit_limit_refuses_and_a_higher_one_overrides(monkeypatch):
    """NextViT-S at 224: refused under a limit its forward does not fit, with the setting named;
    accepted when the limit is set above what this machine reports."""
    monkeypatch.setenv("VITEXPORT_MEMORY_LIMIT", "8M")
    with pytest.raises(ResourceLimit, match=r"one forward pass .* VITEXPORT_MEMORY_LIMIT=8M allows 8.0 MB; .*"
                                            r"\(or set VITEXPORT_MEMORY_LIMIT=SIZE if you know it fits\)"):
        load_model("timm:nextvit_small")
    monkeypatch.setenv("VITEXPORT_MEMORY_LIMIT", "1T")  # more than any test machine has
    assert tuple(load_model("timm:nextvit_small").example_inputs["x"].shape) == (1, 3, 224, 224)
