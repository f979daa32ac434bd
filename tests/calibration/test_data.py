"""Calibration data: npz files (one or several inputs), image folders in every common format,
seeded sampling, and every kind of bad input (BadInput, exit code 2)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from PIL import Image

from vitexport.calibration import (
    ImageFolderSamples,
    UnreadableImagesWarning,
    load_samples,
    random_samples,
)
from vitexport.errors import BadInput
from vitexport.recipe import PreprocessSpec
from vitexport.sources.base import Preprocess

EX = {"x": np.zeros((1, 3, 32, 32), np.float32)}


def _images(n: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((n, 3, 32, 32)).astype(np.float32)
TEXT = {"input_ids": np.zeros((1, 16), np.int64), "attention_mask": np.ones((1, 16), np.int64)}


def _img(path, mode="RGB", size=(40, 48), seed=0, fmt=None):
    rng = np.random.default_rng(seed)
    if mode == "I;16":
        a = rng.integers(0, 65535, size=size[::-1]).astype(np.uint16)
        im = Image.fromarray(a)
    elif mode == "L":
        im = Image.fromarray(rng.integers(0, 255, size=size[::-1]).astype(np.uint8), mode="L")
    elif mode == "RGBA":
        im = Image.fromarray(rng.integers(0, 255, size=(*size[::-1], 4)).astype(np.uint8), mode="RGBA")
    elif mode == "CMYK":
        im = Image.fromarray(rng.integers(0, 255, size=(*size[::-1], 3)).astype(np.uint8)).convert("CMYK")
    elif mode == "P":
        im = Image.fromarray(rng.integers(0, 255, size=(*size[::-1], 3)).astype(np.uint8)).convert("P")
    else:
        im = Image.fromarray(rng.integers(0, 255, size=(*size[::-1], 3)).astype(np.uint8))
    im.save(path, format=fmt)
    return path


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "imgs"
    d.mkdir()
    _img(d / "a.jpg")
    _img(d / "b.png", "L", seed=1)
    _img(d / "c.bmp", seed=2)
    _img(d / "d.webp", seed=3)
    _img(d / "e.png", "RGBA", seed=4)
    _img(d / "f.jpg", "CMYK", seed=5)
    _img(d / "g.png", "I;16", seed=6)
    _img(d / "h.png", "P", seed=7)
    (d / "notes.txt").write_text("not an image")
    return d


def test_npz_single_input(tmp_path):
    x = np.random.default_rng(0).standard_normal((10, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(10))
    s = load_samples(tmp_path / "d.npz", EX)
    assert len(s) == 10 and s.input_names == ["x"] and s.labels.tolist() == list(range(10))
    got = np.concatenate([b["x"] for b in s.batches(4)])
    np.testing.assert_array_equal(got, x)


def test_head_is_the_first_samples_across_batches(tmp_path):
    x = np.random.default_rng(0).standard_normal((10, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(10))
    s = load_samples(tmp_path / "d.npz", EX)
    h = s.head(7)
    assert len(h) == 7 and h.labels.tolist() == list(range(7)) and h.input_names == ["x"]
    got = [b["x"] for b in h.batches(3)]
    assert [len(b) for b in got] == [3, 3, 1]
    np.testing.assert_array_equal(np.concatenate(got), x[:7])
    assert h.fingerprint() != s.fingerprint() and h.fingerprint() == s.head(7).fingerprint()
    assert s.head(10) is s and s.head(50) is s


def test_npz_multi_input_with_padding_mask(tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 100, (12, 16))
    mask = (np.arange(16)[None] < rng.integers(4, 17, 12)[:, None]).astype(np.int32)
    np.savez(tmp_path / "t.npz", input_ids=ids, attention_mask=mask)
    s = load_samples(tmp_path / "t.npz", TEXT, num_samples=5, seed=3)
    assert len(s) == 5 and set(s.input_names) == {"input_ids", "attention_mask"}
    b = next(s.batches(5))
    assert b["attention_mask"].dtype == np.int64 and b["input_ids"].shape == (5, 16)
    again = load_samples(tmp_path / "t.npz", TEXT, num_samples=5, seed=3)
    assert s.fingerprint() == again.fingerprint()
    other = load_samples(tmp_path / "t.npz", TEXT, num_samples=5, seed=4)
    assert s.fingerprint() != other.fingerprint()


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"other": np.zeros((4, 16)), "input_ids": np.zeros((4, 16), np.int64)}, "attention_mask"),
        ({"input_ids": np.zeros((4, 8), np.int64), "attention_mask": np.ones((4, 8), np.int64)}, "shape"),
        ({"input_ids": np.zeros((4, 16), np.int64), "attention_mask": np.ones((3, 16), np.int64)}, "sample counts"),
        ({"input_ids": np.zeros((0, 16), np.int64), "attention_mask": np.ones((0, 16), np.int64)}, "no samples"),
        ({"input_ids": np.full((4, 16), 0.5), "attention_mask": np.ones((4, 16), np.int64)}, "integers"),
    ],
)
def test_bad_npz(tmp_path, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(BadInput, match=message) as e:
        load_samples(tmp_path / "bad.npz", TEXT)
    assert e.value.exit_code == 2


def test_nan_corrupt_missing_and_unsupported(tmp_path):
    np.savez(tmp_path / "nan.npz", x=np.full((2, 3, 32, 32), np.nan, np.float32))
    with pytest.raises(BadInput, match="NaN"):
        load_samples(tmp_path / "nan.npz", EX)
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 garbage")
    with pytest.raises(BadInput, match="readable"):
        load_samples(tmp_path / "broken.npz", EX)
    with pytest.raises(BadInput, match="not found"):
        load_samples(tmp_path / "nope.npz", EX)
    (tmp_path / "data.csv").write_text("1,2,3")
    with pytest.raises(BadInput, match="unsupported"):
        load_samples(tmp_path / "data.csv", EX)


def test_image_folder_all_formats(folder):
    s = load_samples(folder, EX)
    assert isinstance(s, ImageFolderSamples) and len(s) == 8 and not s.skipped
    batches = list(s.batches(3))
    assert [b["x"].shape[0] for b in batches] == [3, 3, 2]
    for b in batches:
        assert b["x"].shape[1:] == (3, 32, 32) and b["x"].dtype == np.float32 and np.isfinite(b["x"]).all()
    # the 16-bit image is scaled to 8 bits, not clipped to white
    idx = [p.name for p in s.files].index("g.png")
    g = np.concatenate([b["x"] for b in batches])[idx]
    assert g.std() > 0.1


def test_image_folder_sampling_is_seeded(folder):
    a = load_samples(folder, EX, num_samples=4, seed=1)
    b = load_samples(folder, EX, num_samples=4, seed=1)
    c = load_samples(folder, EX, num_samples=4, seed=2)
    assert a.files == b.files and a.fingerprint() == b.fingerprint()
    assert a.files != c.files
    np.testing.assert_array_equal(next(a.batches(4))["x"], next(b.batches(4))["x"])


def test_unreadable_images_are_skipped_and_counted(folder):
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")
    (folder / "empty.png").write_bytes(b"")
    with pytest.warns(UnreadableImagesWarning, match="skipped 2 unreadable"):
        s = load_samples(folder, EX)
    assert len(s) == 8 and len(s.skipped) == 2


def test_no_readable_image_is_bad_input(tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "a.jpg").write_bytes(b"junk")
    (d / "b.png").write_bytes(b"junk")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(BadInput, match="none of the 2") as e:
            load_samples(d, EX)
    assert e.value.exit_code == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.txt").write_text("x")
    with pytest.raises(BadInput, match="no image files"):
        load_samples(empty, EX)


def test_image_folder_needs_a_single_image_input(folder):
    with pytest.raises(BadInput, match="single-input"):
        load_samples(folder, TEXT)


def test_preprocess_from_model_and_recipe_override(folder):
    # a solid-colour image normalises to (v/255 - mean) / std per channel
    d = folder.parent / "solid"
    d.mkdir()
    Image.new("RGB", (64, 40), (255, 0, 128)).save(d / "s.png")
    pre = Preprocess(input_size=(3, 32, 32), resize=36, crop=32, interpolation="bicubic", mean=(0.5, 0.5, 0.5),
                     std=(0.5, 0.5, 0.5))
    x = next(load_samples(d, EX, preprocess=pre).batches(1))["x"][0]
    np.testing.assert_allclose(x[:, 5, 5], [1.0, -1.0, (128 / 255 - 0.5) / 0.5], atol=1e-5)
    spec = PreprocessSpec(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    y = next(load_samples(d, EX, preprocess=pre, spec=spec).batches(1))["x"][0]
    np.testing.assert_allclose(y[:, 5, 5], [1.0, 0.0, 128 / 255], atol=1e-5)
    s = load_samples(d, EX, preprocess=pre, spec=PreprocessSpec(resize=48))
    assert s.pipeline.resize == 48 and s.pipeline.interpolation == "bicubic"
    with pytest.raises(BadInput, match="crop"):
        load_samples(d, EX, spec=PreprocessSpec(crop=48))


def test_image_labels_from_integer_folders(tmp_path):
    for label in (3, 17):
        (tmp_path / str(label)).mkdir()
        _img(tmp_path / str(label) / "x.png", seed=label)
    s = load_samples(tmp_path, EX)
    assert sorted(s.labels.tolist()) == [3, 17]


def test_random_samples_exercise_padding():
    s = random_samples(TEXT, 32, seed=0)
    m = s.arrays["attention_mask"]
    assert m.dtype == np.int64 and m.min() == 0 and m.max() == 1 and (m[:, 0] == 1).all()
    assert random_samples(TEXT, 32, seed=0).fingerprint() == s.fingerprint()


def test_fifo_among_images_is_skipped_not_opened(folder):
    """Opening a FIFO waits for a writer forever: only regular files are read."""
    import os

    os.mkfifo(folder / "stream.jpg")
    with pytest.warns(UnreadableImagesWarning, match=r"stream.jpg \(not a regular file\)"):
        s = load_samples(folder, EX)
    assert len(s) == 8 and folder / "stream.jpg" not in s.files


def test_skipped_images_say_why(folder):
    from hostile import forged_png

    forged_png(folder / "huge.png", 100_000, 100_000)
    (folder / "junk.jpg").write_bytes(b"junk")
    with pytest.warns(UnreadableImagesWarning) as rec:
        load_samples(folder, EX)
    text = str(rec[0].message)
    assert "huge.png (too large: over" in text and "pixels" in text and "junk.jpg (not an image)" in text


@pytest.mark.parametrize("labels,message", [
    (np.array(["cat", "dog", "cat", "dog"]), "'y' holds strings"),
    (np.array([0.5, 1.0, 2.0, 3.0]), "integer class indices"),
    (np.eye(4, 3), "not one-hot"),
    (np.array([0, -1, 2, 1]), "negative labels"),
    (np.array([{"a": 1}] * 4, dtype=object), "not a readable"),
])
def test_labels_must_be_class_indices(tmp_path, labels, message):
    np.savez(tmp_path / "d.npz", x=_images(4), y=labels)
    with pytest.raises(BadInput, match=message):
        load_samples(tmp_path / "d.npz", EX)


def test_a_segmenters_label_maps_are_labels_too(tmp_path):
    maps = np.random.default_rng(0).integers(0, 3, (4, 8, 8))
    maps[0, 0, 0] = 255  # unlabelled
    np.savez(tmp_path / "d.npz", x=_images(4), y=maps)
    s = load_samples(tmp_path / "d.npz", EX, num_samples=2, seed=1)
    assert s.labels.shape == (2, 8, 8) and s.labels.dtype == np.int64
    np.savez(tmp_path / "e.npz", x=_images(4), y=np.zeros((4, 2, 8, 8), np.int64))
    with pytest.raises(BadInput, match=r"'y' has shape \(4, 2, 8, 8\).*one label map \[N, H, W\] per sample"):
        load_samples(tmp_path / "e.npz", EX)


def test_integral_float_labels_become_integers(tmp_path):
    np.savez(tmp_path / "d.npz", x=_images(4), y=np.array([[0.0], [1.0], [2.0], [1.0]]))
    s = load_samples(tmp_path / "d.npz", EX)
    assert s.labels.dtype == np.int64 and s.labels.tolist() == [0, 1, 2, 1]


def test_data_files_are_told_by_content(tmp_path):
    np.savez(tmp_path / "d.npz", x=_images(4))
    (tmp_path / "d.npz").rename(tmp_path / "calibration.data")  # an .npz under any name is an .npz
    assert len(load_samples(tmp_path / "calibration.data", EX)) == 4
    with open(tmp_path / "single.npz", "wb") as fh:
        np.save(fh, np.zeros((4, 3, 32, 32), np.float32))
    with pytest.raises(BadInput, match="single .npy array"):
        load_samples(tmp_path / "single.npz", EX)


@pytest.mark.parametrize("value", [0.0, 0.5])
def test_constant_data_is_refused(tmp_path, value):
    """All-zero (or any single-valued) data would calibrate every range to 0 and make every parity
    gate vacuous: refused at load, naming the array and the value."""
    np.savez(tmp_path / "d.npz", x=np.full((6, 3, 32, 32), value, np.float32))
    with pytest.raises(BadInput, match=f"the data is constant \\(every value of 'x' is {value:g} in all 6 sample"):
        load_samples(tmp_path / "d.npz", EX)


def test_a_constant_float_input_beside_a_varying_one_is_data(tmp_path):
    ex = {"x": np.zeros((1, 3, 32, 32), np.float32), "gain": np.ones((1, 1), np.float32)}
    np.savez(tmp_path / "d.npz", x=_images(4), gain=np.ones((4, 1), np.float32))
    assert len(load_samples(tmp_path / "d.npz", ex)) == 4
