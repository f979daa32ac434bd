"""The zoo (``zoo_families``): every family runs the four passes without a traceback, the reports
give the expected counts, every pass keeps the output within 1e-5 of the untouched model (relative to
its largest value; real tokens only for text encoders), and the exported graph has the masks as
Where, no float mask add, and the same outputs (1e-4).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from passes_zoo import PASS_ORDER, export_onnx, float_mask_adds, run_onnx, softmax_mask_producers
from vitexport.passes import get_pass
from zoo_families import CORE, SLOW, ZOO, ZooCase

TORCH_REL = 1e-5
#: reparameterize re-rounds every folded weight and a deep model compounds it: its own tolerance, which
#: every pass after it is measured with, where it folded something (each is compared with the untouched model)
REPARAM_REL = 1e-4
ONNX_REL = 1e-4
VARIANTS = 2


def _out(model, inputs) -> np.ndarray:
    with torch.no_grad():
        return model(**inputs).numpy()


def _relative(ref: np.ndarray, out: np.ndarray, keep: np.ndarray | None) -> float:
    if keep is not None:
        ref, out = ref[keep], out[keep]
    return float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-12))


def _keep(case: ZooCase, inputs, ref) -> np.ndarray | None:
    if not case.text:
        return None
    return np.broadcast_to(inputs["attention_mask"].bool().numpy()[:, :, None], ref.shape)


def _counts(reports) -> dict[str, int]:
    where, fuse = reports["mask_to_where"], reports["fuse_qkv"]
    return {
        "sites": where.stats["attention_sites"], "masks": where.changed, "fused": fuse.changed,
        "already": fuse.stats["already_fused"], "biases": where.stats["biases"],
    }


def _marks(case: ZooCase) -> list:
    return ([pytest.mark.slow] if case.name in SLOW else []) + ([] if case.name in CORE else [pytest.mark.zoo])


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=_marks(c)) for c in ZOO])
def test_zoo(case: ZooCase):
    torch.manual_seed(0)
    model, make = case.build()
    inputs = make(0)
    models, reports = {}, {}
    current = model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("reparameterize", *PASS_ORDER):  # as the pipeline runs them (vitexport.recipe.PASS_STAGES)
            current, reports[name] = get_pass(name)(current, inputs)
            models[name] = current
    where, folded = reports["mask_to_where"], reports["reparameterize"].changed > 0
    assert _counts(reports) == case.expect, {n: r.to_dict() for n, r in reports.items()}
    assert where.found == where.changed and reports["fuse_qkv"].found == where.stats["attention_sites"]
    for i in range(VARIANTS):
        x = make(i)
        ref = _out(model, x)
        for name, m in models.items():
            assert _relative(ref, _out(m, x), _keep(case, x, ref)) <= (REPARAM_REL if folded else TORCH_REL), (name, i)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = export_onnx(current, inputs)
    wheres = softmax_mask_producers(proto).count("Where")
    # opset 17 is the TorchScript exporter's graph; a model exported the pipeline's way at 18
    # (dynamo: its softmax guards fully masked rows with a Where of its own) has at least as many
    assert wheres == where.changed if proto.opset_import[0].version == 17 else wheres >= where.changed
    assert float_mask_adds(proto) == 0
    for i in range(VARIANTS):
        x = make(i)
        ref = _out(model, x)
        assert _relative(ref, run_onnx(proto, x), _keep(case, x, ref)) <= ONNX_REL, i


def test_zoo_covers_60_families():
    assert len({c.name for c in ZOO}) == len(ZOO) >= 60
    prefixes = {c.name.split("_")[0] for c in ZOO}
    assert {"timm", "tv", "hf"} <= prefixes
