"""Issue 29's dense bench cases: the scene generator's labels agree with its pixels, and a detector's / segmenter's
figures (vs FP32 and vs labels) move the way a worse model moves them."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # ``bench`` is a top-level folder, not part of the installed package
    sys.path.insert(0, str(ROOT))

from bench.dense import CLASSES, SCENE, coco_ground_truth, scene, scenes  # noqa: E402
from bench.dense_case import _label_split, _widen, labels_map, labels_miou, score_dense  # noqa: E402
from bench.dense import label_arrays  # noqa: E402


def test_scene_is_a_function_of_its_seed_and_its_labels_match_its_pixels():
    a, b = scene(7), scene(7)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(scene(8)[0], a[0])
    for seed in range(40):
        img, boxes, classes, mask = scene(seed)
        assert img.shape == (3, SCENE["size"], SCENE["size"]) and 0 <= img.min() and img.max() <= 1
        assert 1 <= len(boxes) <= SCENE["max_objects"] and len(boxes) == len(classes)
        for (x0, y0, x1, y1), c in zip(boxes.astype(int), classes):
            inside = mask[y0:y1, x0:x1]
            # the box is tight: its border rows / columns hold the shape's class, and it has pixels of it
            assert (inside == c + 1).any(axis=1)[[0, -1]].all() and (inside == c + 1).any(axis=0)[[0, -1]].all()
        # every labelled pixel lies in a box of its class
        for k in range(1, len(CLASSES) + 1):
            ys, xs = np.nonzero(mask == k)
            for y, x in zip(ys, xs):
                assert any(b[0] <= x < b[2] and b[1] <= y < b[3] and c + 1 == k for b, c in zip(boxes, classes))
    gt = coco_ground_truth(*(lambda d: (d["boxes"], d["classes"]))(scenes(3, 0)))
    assert {a["category_id"] for a in gt["annotations"]} <= {1, 2, 3} and len(gt["images"]) == 3


def _perfect_detector(lab: dict, queries: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """Logits / cx-cy-w-h boxes that state the labels exactly (other queries: confident "no object")."""
    n = len(lab["classes"])
    logits = np.full((n, queries, len(CLASSES) + 1), -8.0, np.float32)
    logits[..., -1] = 8.0
    boxes = np.full((n, queries, 4), 0.1, np.float32)
    for i in range(n):
        for j, (c, b) in enumerate(zip(lab["classes"][i], lab["boxes"][i])):
            if c < 0:
                continue
            logits[i, j, :] = -8.0
            logits[i, j, c] = 8.0
            boxes[i, j] = [(b[0] + b[2]) / 2, (b[1] + b[3]) / 2, b[2] - b[0], b[3] - b[1]]
    return logits, boxes


def test_detection_figures_vs_fp32_and_vs_labels():
    lab = label_arrays(scenes(24, 5), SCENE["max_objects"])
    logits, boxes = _perfect_detector(lab)
    assert labels_map(logits, boxes, lab)[1] > 0.99  # AP50: the boxes are the labels
    ref = {"logits": logits, "pred_boxes": boxes, **lab}
    same = score_dense("detection", {"logits": logits, "pred_boxes": boxes}, ref)
    assert same["map_vs_fp32"] > 0.99 and same["map_labels"] == same["fp32_map_labels"]
    shifted = boxes.copy()
    shifted[..., 0] += 0.08  # every box moved 5 pixels: a worse detector by both measures
    worse = score_dense("detection", {"logits": logits, "pred_boxes": shifted}, ref)
    assert worse["map_vs_fp32"] < same["map_vs_fp32"] - 0.2 and worse["map_labels"] < same["map_labels"] - 0.2
    assert worse["class_agreement"] == 1.0 and worse["box_iou_mean"] < 0.9


def test_a_split_gets_its_box_labels_in_the_form_vitexport_reads(tmp_path):
    from vitexport.calibration import load_samples
    from vitexport.calibration.boxes import per_sample

    d = scenes(6, 11)
    np.savez(tmp_path / "parity.npz", pixel_values=d["x"])
    np.savez(tmp_path / "labels_parity.npz", **label_arrays(d, SCENE["max_objects"]))
    _label_split(tmp_path, "parity")
    s = load_samples(tmp_path / "parity.npz", {"pixel_values": np.zeros((1, 3, SCENE["size"], SCENE["size"]), np.float32)})
    for (classes, xyxy), boxes, want in zip(per_sample(s.labels), d["boxes"], d["classes"]):
        assert classes.tolist() == list(want)
        np.testing.assert_allclose(xyxy, boxes / SCENE["size"], atol=1e-6)  # the pixel boxes, normalised
    stamp = (tmp_path / "parity.npz").stat().st_mtime_ns
    _label_split(tmp_path, "parity")  # labelled already: left alone
    assert (tmp_path / "parity.npz").stat().st_mtime_ns == stamp


@pytest.mark.parametrize("split", ["parity", "score"])
def test_a_split_widens_from_its_own_seeds_keeping_its_first_scenes(tmp_path, split):
    """The detector's labelled mAP gate and its held-out comparison want thousands of scenes: the training
    script's stay as they were and the next ones come from the same seed range (never trained or calibrated on),
    labels beside them."""
    from bench.dense import SPLIT_SEEDS

    d = scenes(4, SPLIT_SEEDS[split])
    np.savez(tmp_path / f"{split}.npz", pixel_values=d["x"])
    np.savez(tmp_path / f"labels_{split}.npz", **label_arrays(d, SCENE["max_objects"]))
    _widen(tmp_path, split, 7)
    with np.load(tmp_path / f"{split}.npz") as z, np.load(tmp_path / f"labels_{split}.npz") as lab:
        assert len(z["pixel_values"]) == 7 and len(lab["classes"]) == 7
        np.testing.assert_array_equal(z["pixel_values"][:4], d["x"])
        wide = scenes(7, SPLIT_SEEDS[split])
        assert lab["classes"][6][lab["classes"][6] >= 0].tolist() == list(wide["classes"][6])
    stamp = (tmp_path / f"{split}.npz").stat().st_mtime_ns
    _widen(tmp_path, split, 5)  # wide enough already: left alone
    assert (tmp_path / f"{split}.npz").stat().st_mtime_ns == stamp


def test_segmentation_figures_vs_fp32_and_vs_labels():
    lab = label_arrays(scenes(8, 9), SCENE["max_objects"])
    s = SCENE["size"] // 4
    # logits at 1/4 resolution, as SegFormer's, that state the labels (the mask's every 4th pixel)
    small = lab["mask"][:, 1::4, 1::4].astype(np.int64)
    logits = np.eye(len(CLASSES) + 1, dtype=np.float32)[small].transpose(0, 3, 1, 2) * 10
    assert logits.shape[-1] == s
    miou, acc = labels_miou(logits, lab["mask"])
    assert miou > 0.6 and acc > 0.9
    ref = {"logits": logits, **lab}
    same = score_dense("segmentation", {"logits": logits}, ref)
    assert same["miou_vs_fp32"] == 1.0 and same["pixel_agreement"] == 1.0
    flipped = logits.copy()
    flipped[:, :, : s // 2] = flipped[:, ::-1, : s // 2]  # top half: classes swapped around
    worse = score_dense("segmentation", {"logits": flipped}, ref)
    assert worse["miou_vs_fp32"] < 0.9 and worse["miou_labels"] < same["miou_labels"]


def test_yolos_detection_tokens_start_apart():
    """Hugging Face leaves YOLOS's detection tokens all zero when built from a config: every query then predicts
    the same box for ever (the detector that trained to mAP 0.001). build_yolos draws them apart."""
    import torch

    from bench.dense import build_yolos

    model = build_yolos(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).eval()
    with torch.no_grad():
        tokens = model.vit(torch.from_numpy(scenes(2, 0)["x"])).last_hidden_state[0, -model.config.num_detection_tokens :]
    # the detection tokens' last hidden states (what the heads read): all alike (distance 0) when left at zeros
    assert torch.cdist(tokens, tokens).fill_diagonal_(1.0).min() > 0.1


def _train_detector():
    scripts = str(ROOT / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    import train_detector

    return train_detector


def test_detector_tokens_answer_for_the_cell_of_a_centre_and_collisions_move_to_the_nearest_free_cell():
    import torch

    td = _train_detector()
    # centres in cells 0 (top-left), 5 (second row, second column) and 15 (bottom-right) of a 4 × 4 tiling
    boxes = torch.tensor([[0.1, 0.1, 0.2, 0.2], [0.3, 0.3, 0.2, 0.2], [0.9, 0.9, 0.2, 0.2]])
    assert td.grid_assign(boxes, 4).tolist() == [0, 5, 15]
    # two centres in cell 0: the second goes to the free cell nearest its centre (right of it: cell 1)
    crowded = torch.tensor([[0.1, 0.1, 0.2, 0.2], [0.2, 0.12, 0.2, 0.2]])
    assert td.grid_assign(crowded, 4).tolist() == [0, 1]


def test_detector_loss_falls_when_the_assigned_token_states_its_object():
    import torch

    td = _train_detector()
    labels = [{"class_labels": torch.tensor([2]), "boxes": torch.tensor([[0.4, 0.4, 0.2, 0.3]])}]
    logits = torch.zeros(1, 16, 4)
    logits[..., -1] = 4.0  # every token says "no object"
    boxes = torch.full((1, 16, 4), 0.5)
    before = td.grid_loss(logits, boxes, labels, 4)
    slot = int(td.grid_assign(labels[0]["boxes"], 4)[0])
    logits[0, slot] = torch.tensor([0.0, 0.0, 4.0, 0.0])
    boxes[0, slot] = labels[0]["boxes"][0]
    after = td.grid_loss(logits, boxes, labels, 4)
    assert after < before - 1.0
    wrong = logits.clone()
    wrong[0, slot], wrong[0, (slot + 1) % 16] = wrong[0, (slot + 1) % 16].clone(), wrong[0, slot].clone()
    assert td.grid_loss(wrong, boxes, labels, 4) > after + 1.0  # the right answer from another token does not count


def test_attention_window_hint_prefers_looking_near_the_cell():
    import torch

    td = _train_detector()
    window = td.attention_window(64, 8, 4)  # 16 cells × 64 patches
    assert window.shape == (16, 64) and (window.sum(1) > 0).all()
    assert window[0, 0] == 1 and window[0, 63] == 0  # the top-left cell sees the top-left patch, not the far corner
    tokens = 1 + 64 + 16
    uniform = torch.full((1, 1, 1, tokens, tokens), 1.0 / tokens)
    focused = torch.zeros(1, 1, 1, tokens, tokens)
    focused[..., -16:, 1:65] = window / window.sum(1, keepdim=True)
    assert td.window_loss((focused[0],), window) < 1e-5 < td.window_loss((uniform[0],), window)
