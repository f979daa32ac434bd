"""FeedSet: samples re-cut to a model's static batch, padded and trimmed back; held-out splits."""
from __future__ import annotations

import numpy as np

from vitexport.calibration import NpzSamples
from vitexport.calibration.feeds import FeedSet, split_samples


def _samples(n=10):
    x = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    return NpzSamples({"x": x}, labels=np.arange(n)), x


def test_static_batch_pads_the_last_feed_and_trims_outputs():
    s, x = _samples(10)
    fs = FeedSet(s, batch=4)
    feeds = list(fs)
    assert [len(f["x"]) for f in feeds] == [4, 4, 4] and fs.num_batches == 3 and fs.padded == 2
    cat = np.concatenate([f["x"] for f in feeds])
    assert np.array_equal(cat[:10], x) and np.array_equal(cat[10:], np.repeat(x[-1:], 2, 0))
    assert np.array_equal(fs.trim(cat), x) and len(fs) == 10


def test_dynamic_batch_takes_batch_size_without_padding():
    s, x = _samples(10)
    feeds = list(FeedSet(s, None, batch_size=3))
    assert [len(f["x"]) for f in feeds] == [3, 3, 3, 1]


def test_split_holds_out_the_tail_disjointly():
    s, x = _samples(40)
    rest, held = split_samples(s, 8)
    a = np.concatenate([f["x"] for f in rest.batches(7)])
    b = np.concatenate([f["x"] for f in held.batches(3)])
    assert len(rest) == 32 and len(held) == 8 and np.array_equal(np.concatenate([a, b]), x)
    assert np.array_equal(held.labels, np.arange(32, 40)) and rest.fingerprint() != held.fingerprint()
    # never more than a quarter: calibration keeps most of the data
    assert len(split_samples(s, 100)[1]) == 10
    assert split_samples(_samples(3)[0], 8)[1] is None
