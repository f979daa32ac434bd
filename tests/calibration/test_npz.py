"""``.npz`` members read by row: the same values as ``np.load``, and memory that does not grow with the file."""
from __future__ import annotations

import numpy as np
import pytest

from vitexport.calibration import NpzSamples, load_samples
from vitexport.calibration.npz import NpzMember, open_members
from vitexport.errors import BadInput
from vitexport.memory import PeakMeter

EX = {"x": np.zeros((1, 3, 32, 32), np.float32)}


def test_stored_members_are_read_by_row(tmp_path):
    rng = np.random.default_rng(0)
    x, m = rng.standard_normal((10, 3, 4, 4)).astype(np.float32), rng.random((10, 5)) > 0.5
    np.savez(tmp_path / "a.npz", x=x, m=m, y=np.arange(10), f=np.asfortranarray(rng.random((10, 3))))
    got = open_members(tmp_path / "a.npz")
    assert isinstance(got["x"], NpzMember) and isinstance(got["m"], NpzMember)
    assert isinstance(got["f"], np.ndarray)  # Fortran order cannot be read by row: loaded whole
    np.testing.assert_array_equal(got["x"].rows([1, 2, 3, 7, 9]), x[[1, 2, 3, 7, 9]])
    np.testing.assert_array_equal(got["m"].rows(slice(2, 5)), m[2:5])
    np.testing.assert_array_equal(np.asarray(got["y"]), np.arange(10))


def test_compressed_members_are_loaded_whole(tmp_path):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.savez_compressed(tmp_path / "c.npz", x=x)
    got = open_members(tmp_path / "c.npz")["x"]
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, x)


def test_lazy_samples_match_eager_ones(tmp_path):
    x = np.random.default_rng(1).standard_normal((20, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(20))
    lazy = load_samples(tmp_path / "d.npz", EX, num_samples=12, seed=3)
    assert isinstance(lazy.members["x"], NpzMember)
    rows = np.concatenate([b["x"] for b in lazy.batches(5)])
    idx = np.sort(np.random.default_rng(3).permutation(20)[:12])
    np.testing.assert_array_equal(rows, x[idx])
    assert lazy.labels.tolist() == idx.tolist()
    assert lazy.fingerprint() == NpzSamples({"x": x[idx]}, idx).fingerprint()
    # other labels score other accuracies: a stage recorded under them must not be resumed
    assert lazy.fingerprint() != NpzSamples({"x": x[idx]}, idx[::-1].copy()).fingerprint()
    assert NpzSamples({"x": x[idx]}).fingerprint() not in (lazy.fingerprint(), NpzSamples({"x": x[idx]}, idx).fingerprint())


def test_nan_in_any_row_is_refused(tmp_path):
    x = np.zeros((40, 3, 32, 32), np.float32)
    x[37, 1, 2, 3] = np.nan
    np.savez(tmp_path / "nan.npz", x=x)
    with pytest.raises(BadInput, match="NaN"):
        load_samples(tmp_path / "nan.npz", EX)


def test_memory_does_not_grow_with_the_file(tmp_path):
    """A 96 MB file is validated, fingerprinted and iterated with a few MB of resident memory."""
    n = 800  # 800 × 3×32×32 float32 × 32 = 96 MB
    big = np.random.default_rng(2).standard_normal((n, 3, 32, 32)).astype(np.float32)
    ex = {"x": np.zeros((1, 3, 32, 32), np.float32)}
    with open(tmp_path / "big.npz", "wb") as f:
        np.savez(f, x=np.tile(big, (32, 1, 1, 1)))
    del big
    with PeakMeter() as m:
        s = load_samples(tmp_path / "big.npz", ex)
        s.fingerprint()
        total = sum(len(b["x"]) for b in s.batches(64))
    assert total == n * 32
    if not m.exact:
        pytest.skip("the kernel's high-water mark cannot be reset here")
    from vitexport.memory import resident_bytes

    assert m.peak_bytes - resident_bytes() < 32 << 20


@pytest.mark.parametrize("compressed", [False, True])
def test_a_header_claiming_more_rows_than_the_file_holds_is_refused(tmp_path, compressed):
    """numpy allocates what a header declares before reading: 40 M rows must not be attempted."""
    from hostile import npz_with_header

    path = npz_with_header(tmp_path / "forged.npz", (40_000_000, 3, 32, 32), 4, compressed)
    with PeakMeter() as meter:
        with pytest.raises(BadInput, match="forged header"):
            load_samples(path, EX)
    assert meter.peak_bytes is None or meter.peak_bytes < 4 << 30


def test_a_decompression_bomb_is_refused_before_inflating(tmp_path, monkeypatch):
    x = np.zeros((4096, 3, 32, 32), np.float32)
    x[0, 0, 0, 0] = 1.0  # not constant data (refused for another reason)
    np.savez_compressed(tmp_path / "bomb.npz", x=x)  # 48 MB in ~50 KB
    assert (tmp_path / "bomb.npz").stat().st_size < 1 << 20
    monkeypatch.setenv("VITEXPORT_MEMORY_LIMIT", "16M")
    from vitexport.errors import ResourceLimit

    with pytest.raises(ResourceLimit, match=r"inflation.*VITEXPORT_MEMORY_LIMIT=16M allows 16.0 MB; save the data with np.savez"):
        load_samples(tmp_path / "bomb.npz", EX)
    monkeypatch.setenv("VITEXPORT_MEMORY_LIMIT", "1G")
    assert len(load_samples(tmp_path / "bomb.npz", EX)) == 4096
