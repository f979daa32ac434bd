"""The golden reference: captured first, saved atomically, loaded without pickle."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from vitexport.runners import TorchRunner
from vitexport.errors import BadInput
from vitexport.parity import GoldenReference, capture_reference


def test_capture_keeps_outputs_feeds_labels_and_layers(vit_reference, vit_feeds):
    ref = vit_reference
    assert ref.output.shape == (8, 10) and ref.num_samples == 8
    assert len(ref.feeds) == 2 and np.array_equal(ref.feeds[1]["x"], vit_feeds[1]["x"])
    assert ref.feeds[0]["x"] is not vit_feeds[0]["x"]  # a copy: later changes to the data do not leak in
    assert list(ref.layers) == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert ref.layers["blocks.0"].shape == (8, 17, 192) and ref.layer_batches == 2
    assert ref.engine == "torch"


def test_save_load_round_trip(vit_reference, tmp_path):
    path = vit_reference.save(tmp_path)
    assert path.name == "reference.npz"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reference.npz"]  # no temp file left
    back = GoldenReference.load(tmp_path)
    assert np.array_equal(back.output, vit_reference.output)
    assert np.array_equal(back.labels, vit_reference.labels)
    assert back.source == "untouched torch model" and back.layer_batches == 2
    assert [list(f) for f in back.feeds] == [["x"], ["x"]]
    assert all(np.array_equal(back.layers[k], v) for k, v in vit_reference.layers.items())
    with np.load(path, allow_pickle=False) as z:  # readable without pickle
        assert "meta" in z.files


def test_load_errors(tmp_path):
    with pytest.raises(BadInput, match="not found"):
        GoldenReference.load(tmp_path)
    (tmp_path / "reference.npz").write_bytes(b"garbage")
    with pytest.raises(BadInput, match="not a readable golden reference"):
        GoldenReference.load(tmp_path)


def test_layer_capture_limited_to_first_batches(vit, vit_feeds, vit_example):
    runner = TorchRunner(vit, vit_example)
    ref = capture_reference(runner, vit_feeds, layers=["blocks.1"], layer_samples=3)
    assert list(ref.layers) == ["blocks.1"] and ref.layers["blocks.1"].shape[0] == 4 and ref.layer_batches == 1
    assert runner.is_active is False  # activated for the capture only


def test_nonfinite_reference_is_refused_naming_the_module(vit, vit_feeds, vit_example):
    broken = copy.deepcopy(vit)
    with torch.no_grad():
        broken.blocks[1].mlp.fc2.bias[0] = float("inf")
    with TorchRunner(broken, vit_example) as runner, pytest.raises(BadInput, match=r"NaN/Inf.*blocks\.1\.mlp\.fc2"):
        capture_reference(runner, vit_feeds)


def test_bad_labels_and_no_batches(vit, vit_feeds, vit_example):
    with TorchRunner(vit, vit_example) as runner:
        with pytest.raises(BadInput, match="3 labels for 8"):
            capture_reference(runner, vit_feeds, labels=np.arange(3))
        with pytest.raises(BadInput, match="at least one batch"):
            capture_reference(runner, [])
