"""A detector's labels: boxes from an .npz (``y`` beside ``y_boxes``) or an image folder's COCO json, carried
through the folder's resize and center crop, and every malformed form refused (exit 2)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from vitexport.calibration import load_samples
from vitexport.calibration.boxes import box_labels, is_box_labels, per_sample
from vitexport.errors import BadInput

EX = {"pixel_values": np.zeros((1, 3, 64, 64), np.float32)}


def _npz(path, y, boxes, n=3):
    x = np.random.default_rng(0).standard_normal((n, 3, 64, 64)).astype(np.float32)
    np.savez(path, pixel_values=x, y=y, y_boxes=boxes)
    return path


def test_npz_boxes_become_one_array_and_per_sample_lists_drop_the_padding(tmp_path):
    y = np.array([[0, 2], [1, -1], [-1, -1]])
    boxes = np.zeros((3, 2, 4), np.float32)
    boxes[0, 0] = [0.5, 0.5, 0.2, 0.4]
    boxes[0, 1] = [0.25, 0.75, 0.1, 0.1]
    boxes[1, 0] = [0.1, 0.1, 0.2, 0.2]
    s = load_samples(_npz(tmp_path / "d.npz", y, boxes), EX)
    assert is_box_labels(s.labels) and s.labels.shape == (3, 2, 5)
    lists = per_sample(s.labels)
    assert [len(c) for c, _ in lists] == [2, 1, 0]
    np.testing.assert_allclose(lists[0][1][0], [0.4, 0.3, 0.6, 0.7])  # cx, cy, w, h → x0, y0, x1, y1
    assert lists[0][0].tolist() == [0, 2] and lists[1][0].tolist() == [1]
    # the boxes join the fingerprint: a moved box is other parity data
    moved = boxes.copy()
    moved[0, 0, 0] = 0.55
    assert load_samples(_npz(tmp_path / "e.npz", y, moved), EX).fingerprint() != s.fingerprint()
    # and a subset keeps each sample's own boxes
    sub = load_samples(tmp_path / "d.npz", EX, num_samples=2, seed=1)
    assert all(any(np.array_equal(r, row) for row in s.labels) for r in sub.labels)


@pytest.mark.parametrize("y, boxes, words", [
    (np.array([[0, 1]]), np.full((1, 3, 4), 0.2, np.float32), "give one class per box"),
    (np.array([[0, -2]]), np.full((1, 2, 4), 0.2, np.float32), "holds class -2"),
    (np.array([[0, 1]]), np.array([[[32.0, 32, 10, 10], [0.2, 0.2, 0.1, 0.1]]], np.float32), "not pixels"),
    (np.array([[0.5, 1]]), np.full((1, 2, 4), 0.2, np.float32), "class must be the model's class index"),
    (np.array([[0, 1]]), np.full((1, 2), 0.2, np.float32), "[N, M, 4]"),
])
def test_malformed_box_labels_name_the_key_and_the_fix(y, boxes, words):
    with pytest.raises(BadInput, match=None) as exc:
        box_labels(y, boxes, "parity.npz")
    assert words in str(exc.value) and str(exc.value).startswith("parity.npz: ")


def test_boxes_without_classes_are_refused(tmp_path):
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)
    np.savez(tmp_path / "d.npz", pixel_values=x, y_boxes=np.full((2, 1, 4), 0.2, np.float32))
    with pytest.raises(BadInput, match="'y_boxes' without 'y'"):
        load_samples(tmp_path / "d.npz", EX)


def _folder(tmp_path, annotations, images=("a.png", "sub/b.png")):
    root = tmp_path / "imgs"
    for name in images:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.random.default_rng(0).integers(0, 255, (60, 80, 3)).astype(np.uint8)).save(root / name)
    coco = {"images": [{"id": 1, "file_name": "a.png", "width": 80, "height": 60},
                       {"id": 2, "file_name": "sub/b.png", "width": 80, "height": 60}],
            "annotations": annotations, "categories": [{"id": 1, "name": "x"}, {"id": 2, "name": "y"}]}
    (root / "instances.json").write_text(json.dumps(coco))
    return root


def test_a_coco_json_in_an_image_folder_gives_boxes_through_the_resize_and_crop(tmp_path):
    root = _folder(tmp_path, [
        {"id": 1, "image_id": 1, "category_id": 2, "bbox": [30, 15, 15, 30]},
        {"id": 2, "image_id": 1, "category_id": 1, "bbox": [0, 0, 5, 5]},     # cut away by the crop: dropped
        {"id": 3, "image_id": 1, "category_id": 1, "bbox": [40, 20, 10, 10], "iscrowd": 1},  # crowd: dropped
        {"id": 4, "image_id": 2, "category_id": 1, "bbox": [60, 0, 15, 60]},  # half cut by the crop: clipped
    ])
    s = load_samples(root, EX)  # 80x60 → shorter side 64: 85x64, center crop 64x64 from x = 10
    assert is_box_labels(s.labels)
    got = {f.name: per_sample(s.labels[i : i + 1])[0] for i, f in enumerate(s.files)}
    (ca, ba), (cb, bb) = got["a.png"], got["b.png"]
    assert ca.tolist() == [2]
    sx, sy = 85 / 80, 64 / 60  # the resized image's own ratios (85 is a rounded 80 * 64 / 60)
    np.testing.assert_allclose(ba[0], [(30 * sx - 10) / 64, 15 * sy / 64, (45 * sx - 10) / 64, 45 * sy / 64], atol=1e-9)
    assert cb.tolist() == [1]
    np.testing.assert_allclose(bb[0], [(60 * sx - 10) / 64, 0.0, 1.0, 1.0], atol=1e-9)
    # the json's boxes join the fingerprint
    before = s.fingerprint()
    data = json.loads((root / "instances.json").read_text())
    data["annotations"][0]["bbox"][0] = 31
    (root / "instances.json").write_text(json.dumps(data))
    assert load_samples(root, EX).fingerprint() != before


def test_a_folder_image_the_json_does_not_list_is_exit_2(tmp_path):
    root = _folder(tmp_path, [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [30, 15, 15, 30]}],
                   images=("a.png", "sub/b.png", "c.png"))
    with pytest.raises(BadInput, match="1 of the folder's images are not among its 'images'.*c.png first"):
        load_samples(root, EX)


def test_a_json_that_is_not_coco_is_exit_2(tmp_path):
    root = _folder(tmp_path, [{"id": 1, "image_id": 1, "bbox": [30, 15, 15, 30]}])  # no category_id
    with pytest.raises(BadInput, match="not COCO annotations"):
        load_samples(root, EX)
    (root / "instances.json").write_text("{not json")
    with pytest.raises(BadInput, match="not readable json"):
        load_samples(root, EX)
