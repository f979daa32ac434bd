"""Equalisation of a weight two Linears share (onnxsim merges equal initializers).

ConViT initialises every GPSA value projection to the identity; after onnxsim those Linears read one
initializer, and equalising it for each consumer made copies whose shape the re-annotation did not
know (``timm convit_tiny`` crashed in annotate after equalisation), with a third reader under the
same name. Each copy now has its own name and a known shape.
"""
from __future__ import annotations

import pytest

import numpy as np
import onnx
import torch
from qcases import target
from qmodels import export_onnx, plant_outliers, tiny_vit

from vitexport.calibration import random_samples
from vitexport.quantize import quantize_int8


@pytest.mark.slow
def test_equalising_a_shared_weight(tmp_path):
    m = plant_outliers(tiny_vit(depth=3))
    with torch.no_grad():  # three blocks with one fc1 weight, as random-init ConViT has for its value projections
        for b in m.blocks[1:]:
            b.mlp.fc1.weight.copy_(m.blocks[0].mlp.fc1.weight)
    ex = {"x": torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))}
    path = export_onnx(m, ex, tmp_path / "shared.onnx", 17)
    readers: dict[str, int] = {}
    for n in onnx.load(str(path)).graph.node:
        if n.op_type in ("MatMul", "Gemm"):
            readers[n.input[1]] = readers.get(n.input[1], 0) + 1
    shared = [w for w, c in readers.items() if c == 3]
    assert len(shared) == 1  # one initializer, three readers
    out = tmp_path / "shared.int8.onnx"
    rep = quantize_int8(path, out, random_samples(ex, 48, seed=0), target("orin", "quantization.fallback.enabled=false"), tmp_path)
    assert rep.smoothed >= 3
    q = onnx.load(str(out))
    names = [i.name for i in q.graph.initializer]
    assert len(names) == len(set(names))
    # each reader has its own equalised weight (the LayerNorms' factors differ): two copies, and the
    # last reader scales the original in place
    by_name = {i.name: i for i in q.graph.initializer}
    copies = [by_name.get(f"{shared[0]}{suffix}_quantized") for suffix in ("_equalized", "_equalized_1", "")]
    assert all(c is not None for c in copies), sorted(n for n in by_name if shared[0] in n)
    arrays = [onnx.numpy_helper.to_array(c) for c in copies]
    assert not any(np.array_equal(a, b) for i, a in enumerate(arrays) for b in arrays[i + 1:])
