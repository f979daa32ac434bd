"""Task metrics on arrays whose answer is known, and the task gates they feed (issue 29, item 3)."""
from __future__ import annotations

import numpy as np
import pytest

from vitexport.errors import BadInput
from vitexport.parity import check_stage
from vitexport.parity.advice import failure_advice
from vitexport.parity.reference import GoldenReference
from vitexport.parity.tasks import (IGNORE_LABEL, check_label_maps, coco_map, depth_metrics, detection_metrics,
                                    embedding_metrics, labels_miou, map_drop_spread, miou_drop_spread,
                                    segmentation_metrics, task_checks,
                                    task_outputs)
from vitexport.recipe import Int8Tolerance, Recipe, Tolerance

from replay import replayed

pytest.importorskip("pycocotools")


def _detector_outputs(n: int = 3, q: int = 6, c: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Logits [n, q, c+1] where the first 3 queries of each sample are confident (class q % c, score ~0.99)
    and the rest say "no object"; boxes [n, q, 4] (cx, cy, w, h) well apart."""
    rng = np.random.default_rng(seed)
    logits = np.full((n, q, c + 1), -4.0)
    logits[:, :, -1] = 4.0  # no object
    for i in range(n):
        for j in range(3):
            logits[i, j, -1] = -4.0
            logits[i, j, (i + j) % c] = 5.0
    centres = np.stack([np.linspace(0.15, 0.85, q), np.linspace(0.2, 0.8, q)], -1)
    boxes = np.concatenate([np.broadcast_to(centres, (n, q, 2)), np.full((n, q, 2), 0.1)], -1)
    return logits + 0.01 * rng.standard_normal(logits.shape), boxes.copy()


def test_identical_detections_score_map_one():
    logits, boxes = _detector_outputs()
    m = detection_metrics(logits, boxes, logits, boxes)
    assert m.map == pytest.approx(1.0) and m.ap50 == pytest.approx(1.0)
    assert m.detections == 9 and m.matched == 9
    assert m.box_iou_mean == pytest.approx(1.0) and m.class_agreement == 1.0 and m.score_mae == pytest.approx(0.0)


def test_sigmoid_scored_detections_have_no_no_object_class():
    logits, boxes = _detector_outputs()
    sig = logits[..., :-1]  # RT-DETR's layout: one logit per class, each scored by a sigmoid
    m = detection_metrics(sig, boxes, sig, boxes, scores="sigmoid")
    assert m.detections == 9 and m.map == pytest.approx(1.0)
    assert detection_metrics(sig, boxes, sig, boxes).detections < 9  # read as softmax, class 3 would be "no object"


def test_one_shifted_box_lowers_map_and_iou():
    logits, boxes = _detector_outputs()
    moved = boxes.copy()
    moved[0, 0, 0] += 0.03  # a 0.1-wide box moved by 30 % of its width: IoU 0.54, a miss at IoU >= 0.55
    m = detection_metrics(logits, boxes, logits, moved)
    assert m.map < 1.0 and m.ap50 == pytest.approx(1.0)  # still a hit at IoU 0.5
    assert m.box_iou_min == pytest.approx(0.07 / 0.13, rel=1e-6)
    assert m.box_iou_mean == pytest.approx((8 + 0.07 / 0.13) / 9, rel=1e-6)
    gone = boxes.copy()
    gone[0, 0, :2] = (0.95, 0.95)  # moved onto empty image: a lost detection and a false positive
    worse = detection_metrics(logits, boxes, logits, gone)
    assert worse.ap50 < 1.0 and worse.matched == 8


def test_a_flipped_class_counts_against_agreement_and_map():
    logits, boxes = _detector_outputs()
    flipped = logits.copy()
    flipped[1, 2, [(1 + 2) % 4, 0]] = flipped[1, 2, [0, (1 + 2) % 4]]
    m = detection_metrics(logits, boxes, flipped, boxes)
    assert m.class_agreement == pytest.approx(8 / 9) and m.map < 1.0


def test_coco_map_needs_ground_truth():
    assert coco_map([(np.zeros(0, int), np.zeros((0, 4)))], [(np.ones(1), np.zeros(1, int), np.ones((1, 4)))], 2) is None
    logits, boxes = _detector_outputs()
    m = detection_metrics(logits * 0, boxes, logits, boxes)  # a flat reference: no query is confident
    assert m.map is None and "no reference query scored" in m.note


def _labels_of(logits: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Box labels [n, 3, 5] that are the confident queries of :func:`_detector_outputs` exactly."""
    return np.concatenate([logits[:, :3, :-1].argmax(-1)[..., None].astype(np.float64), boxes[:, :3]], -1)


def test_detections_against_box_labels_gate_the_drop_not_the_map_against_fp32():
    logits, boxes = _detector_outputs()
    labels = _labels_of(logits, boxes)
    moved = boxes.copy()
    moved[0, 0, 0] += 0.03  # one box of nine moved: a miss at IoU >= 0.55
    m = detection_metrics(logits, boxes, logits, moved, labels=labels)
    assert m.reference_map_labels == pytest.approx(1.0) and m.map_labels < 1.0
    assert m.map_labels_drop == pytest.approx(1.0 - m.map_labels) and m.map_labels == pytest.approx(m.map)  # labels = FP32
    tol = Int8Tolerance()
    _, checks, notes = task_checks("detect", {"logits": logits, "pred_boxes": boxes}, {"logits": logits, "pred_boxes": moved},
                                   tol, labels=labels)
    by = {c.metric.split("[")[0]: c for c in checks}
    assert by["map_labels_drop"].limit == 0.005 and not by["map_labels_drop"].passed and not notes
    assert "map" not in by  # against FP32: measured, not gated, where labels decide
    # a recipe's own map_min still gates beside the labels
    _, checks, _ = task_checks("detect", {"logits": logits, "pred_boxes": boxes}, {"logits": logits, "pred_boxes": moved},
                               tol.model_copy(update={"map_min": 0.5}), labels=labels)
    assert {c.metric.split("[")[0] for c in checks} >= {"map", "map_labels_drop"}
    # a segmenter ignores boxes (and says so)
    _, _, notes = task_checks("segment", {"logits": np.zeros((3, 2, 4, 4))}, {"logits": np.zeros((3, 2, 4, 4))}, tol,
                              labels=labels)
    assert notes and "box labels are read by detectors only" in notes[0]


def test_a_failed_labelled_map_gate_says_how_far_its_images_pin_the_drop_down():
    logits, boxes = _detector_outputs(n=12)
    labels = _labels_of(logits, boxes)
    moved = boxes.copy()
    moved[:3, 0, 0] += 0.03  # three images of twelve lose a box
    se, made = map_drop_spread(logits, boxes, logits, moved, labels)
    assert made >= 8 and 0 < se < 0.2
    assert map_drop_spread(logits, boxes, logits, boxes, labels)[0] == 0.0  # the same detections: no spread
    outs = ({"logits": logits, "pred_boxes": boxes}, {"logits": logits, "pred_boxes": moved})
    m, checks, _ = task_checks("detect", *outs, Int8Tolerance(), labels=labels, explain=True)
    drop = next(c for c in checks if c.metric.startswith("map_labels_drop"))
    assert not drop.passed and m.map_labels_drop_se == pytest.approx(se)
    assert f"± {100 * se:.2f}" in drop.why and "12 parity images" in drop.why
    advice = failure_advice("quantize_int8", drop, Recipe(name="r", target="cpu"), calib_samples=128)
    assert advice.startswith(drop.why) and "map_labels_drop_max=" in advice
    _, checks, _ = task_checks("detect", *outs, Int8Tolerance(), labels=labels)  # the fallback's verdicts: no bootstrap
    assert next(c for c in checks if c.metric.startswith("map_labels_drop")).why is None


def test_box_labels_the_detector_cannot_be_scored_on_are_bad_input():
    logits, boxes = _detector_outputs()  # 4 classes and "no object"
    outs = {"logits": logits, "pred_boxes": boxes}
    labels = _labels_of(logits, boxes)
    check_label_maps("detect", outs, labels)
    labels[0, 0, 0] = 4
    with pytest.raises(BadInput, match="hold class 4, but the model detects 4 classes"):
        check_label_maps("detect", outs, labels)
    with pytest.raises(BadInput, match="the model's task is classify: boxes are a detector's"):
        check_label_maps("classify", {"output": np.zeros((3, 4))}, labels)


def test_segment_maps_with_k_flipped_pixels():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 3, 8, 8))
    labels = ref.argmax(1)
    out = ref.copy()
    flips = [(0, 1, 1), (0, 2, 5), (1, 7, 7), (1, 3, 0)]
    for b, y, x in flips:  # make another class win at k = 4 pixels
        out[b, (labels[b, y, x] + 1) % 3, y, x] = ref[b, :, y, x].max() + 1.0
    m = segmentation_metrics(ref, out)
    assert m.pixel_agreement == pytest.approx(1 - 4 / 128)
    assert segmentation_metrics(ref, ref).miou == 1.0
    conf = np.zeros((3, 3))
    for r, o in zip(labels.ravel(), out.argmax(1).ravel()):
        conf[r, o] += 1
    iou = np.diag(conf) / (conf.sum(0) + conf.sum(1) - np.diag(conf))
    assert m.miou == pytest.approx(iou.mean()) and m.classes == 3


def test_segment_against_label_maps_upsamples_skips_unlabelled_and_gates_the_drop():
    labels = np.zeros((1, 8, 8), np.int64)
    labels[0, :, 4:] = 1  # left half class 0, right half class 1
    labels[0, 0, 0] = IGNORE_LABEL  # nobody labelled this pixel
    ref = np.zeros((1, 2, 4, 4))
    ref[0, 0, :, :2] = ref[0, 1, :, 2:] = 5.0  # a half-resolution decoder that gets it right
    out = ref.copy()
    out[0, 0, :, 1], out[0, 1, :, 1] = 0.0, 5.0  # INT8 moves column 1 to class 1
    assert labels_miou(ref, labels) == (1.0, 1.0)  # upsampled (bilinear) to the labels' 8x8 before the argmax
    miou, acc = labels_miou(out, labels)
    # upsampled, low-res column 1 decides full-res columns 2 and 3: 16 pixels wrong of 63 labelled
    assert acc == pytest.approx(1 - 16 / 63)
    assert miou == pytest.approx(np.mean([15 / 31, 32 / 48]))  # class 0 keeps 15 of its 31; class 1 gains 16
    m = segmentation_metrics(ref, out, labels=labels)
    assert m.reference_miou_labels == 1.0 and m.miou_labels_drop == pytest.approx(1 - miou)
    tol = Int8Tolerance()
    _, checks, _ = task_checks("segment", {"logits": ref}, {"logits": out}, tol, labels=labels)
    drop = next(c for c in checks if c.metric == "miou_labels_drop")
    assert drop.limit == 0.005 and not drop.passed
    _, checks, notes = task_checks("segment", {"logits": ref}, {"logits": ref}, tol, labels=labels)
    assert next(c for c in checks if c.metric == "miou_labels_drop").passed and not notes


def test_a_failed_labelled_miou_gate_says_how_far_its_images_pin_the_drop_down():
    labels = np.zeros((6, 8, 8), np.int64)
    labels[:, :, 4:] = 1
    ref = np.zeros((6, 2, 8, 8))
    ref[:, 0, :, :4] = ref[:, 1, :, 4:] = 5.0  # FP32 right everywhere
    out = ref.copy()
    out[:2, 1, :, 2:4] = 9.0  # INT8 moves two columns to class 1 on two images of six
    se, made = miou_drop_spread(ref, out, labels)
    assert made == 200 and 0 < se < 0.2
    assert miou_drop_spread(ref, ref, labels)[0] == 0.0
    m, checks, _ = task_checks("segment", {"logits": ref}, {"logits": out}, Int8Tolerance(), labels=labels, explain=True)
    drop = next(c for c in checks if c.metric == "miou_labels_drop")
    assert not drop.passed and m.miou_labels_drop_se == pytest.approx(se)
    assert "points of mIoU lost against the labels" in drop.why and "6 parity images" in drop.why


def test_label_maps_the_model_cannot_be_scored_on_are_bad_input():
    ref = {"logits": np.zeros((2, 3, 4, 4))}
    with pytest.raises(BadInput, match="holds class 7, but the model segments 3 classes"):
        check_label_maps("segment", ref, np.full((2, 4, 4), 7))
    check_label_maps("segment", ref, np.full((2, 4, 4), IGNORE_LABEL))  # unlabelled everywhere: fine
    with pytest.raises(BadInput, match="the model's task is classify: label maps are a segmenter's"):
        check_label_maps("classify", {"output": np.zeros((2, 3))}, np.zeros((2, 4, 4), np.int64))


def test_segment_flips_on_near_ties_are_excused_as_top1_flips_are():
    ref = np.zeros((1, 2, 16, 16))
    ref[0, 0] = 1.0  # class 0 everywhere, by a margin of 1 ...
    ref[0, 1, 0, 0] = 0.999  # ... except one pixel where class 1 nearly ties
    out = ref.copy()
    out[0, 1, 0, 0] = 1.001  # the near tie flips
    out += 0.001 * np.random.default_rng(0).standard_normal(out.shape)  # the error that explains it
    m = segmentation_metrics(ref, out, z=3.0)
    assert m.pixel_agreement == pytest.approx(255 / 256) and m.pixel_agreement_gated == 1.0 and m.miou_gated == 1.0
    assert m.near_ties == pytest.approx(1 / 256)
    out[0, 1, 3, 3] = 1.5  # a flip where FP32 was sure (margin 1, far above 3·√2·σ, σ ~0.07): it counts
    m = segmentation_metrics(ref, out, z=3.0)
    assert m.pixel_agreement_gated == pytest.approx(255 / 256) and m.miou_gated < 1.0


def test_depth_absrel_and_delta1():
    ref = np.full((2, 4, 4), 2.0)
    out = ref.copy()
    out[0, 0, 0] = 3.0  # 50 % off: outside δ < 1.25
    out[1] *= 1.01
    m = depth_metrics(ref, out)
    assert m.abs_rel == pytest.approx((0.5 + 16 * 0.01) / 32)
    assert m.delta1 == pytest.approx(31 / 32)


def test_embedding_recall_at_k():
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((10, 16))
    assert embedding_metrics(emb, emb * 3.0).recall_at_k == 1.0  # scale does not change neighbours
    m = embedding_metrics(emb, rng.standard_normal((10, 16)), k=3)
    assert m.k == 3 and m.recall_at_k < 0.8


def test_task_outputs_by_name_then_shape():
    assert task_outputs("detect", {"logits": (1, 5, 4), "pred_boxes": (1, 5, 4)}) == ["logits", "pred_boxes"]
    assert task_outputs("segment", {"output": (1, 5, 8, 8)}) == ["output"]
    assert task_outputs("embed", {"last_hidden_state": (1, 5, 8), "pooler_output": (1, 8)}) == ["pooler_output"]
    with pytest.raises(ValueError, match="detect needs"):
        task_outputs("detect", {"output": (1, 10)})


def _ref(outputs: dict, task: str) -> GoldenReference:
    n = next(iter(outputs.values())).shape[0]
    ref = GoldenReference(outputs, [{"x": np.zeros((n, 2), np.float32)}])
    ref.meta["task"] = task
    return ref


def test_a_detector_stage_is_gated_on_map_and_fails_naming_it():
    logits, boxes = _detector_outputs()
    ref = _ref({"logits": logits, "pred_boxes": boxes}, "detect")
    good = check_stage("quantize_int8", replayed({"logits": logits, "pred_boxes": boxes}), ref, Int8Tolerance())
    assert good.passed and good.task_metrics.map == pytest.approx(1.0)
    assert [c.metric for c in good.checks][-1] == "map[logits,pred_boxes]"
    moved = boxes.copy()
    moved[:, :3, 0] += 0.012  # every detection moved by 12 % of its width: IoU ~0.79, cosine still ~0.999
    bad = check_stage("quantize_int8", replayed({"logits": logits, "pred_boxes": moved}), ref, Int8Tolerance())
    assert not bad.passed and bad.failed_check.metric == "map[logits,pred_boxes]"
    assert bad.checks[0].passed  # the outputs' cosine held: only the task gate saw it
    advice = failure_advice("quantize_int8", bad.failed_check, Recipe(name="r", target="cpu"), calib_samples=8)
    assert "parity.quantize_int8.map_min=" in advice
    # the float stages report the metric ungated; a recipe may loosen the INT8 one
    assert not any(c.metric.startswith("map") for c in check_stage("simplify", replayed({"logits": logits, "pred_boxes": moved}),
                                                                     ref, Tolerance(max_abs=1.0)).checks)
    loose = Int8Tolerance(map_min=bad.task_metrics.map)
    assert check_stage("quantize_int8", replayed({"logits": logits, "pred_boxes": moved}), ref, loose).passed
    back = type(bad).from_dict(bad.to_dict())  # parity.json read back
    assert back.task_metrics.map == bad.task_metrics.map


def test_a_segmenter_single_output_names_its_checks_plainly():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((3, 4, 6, 6))
    res = check_stage("quantize_int8", replayed({"output": ref}), _ref({"output": ref}, "segment"), Int8Tolerance())
    assert [c.metric for c in res.checks] == ["cosine_min", "miou_gated", "pixel_agreement_gated"]
    assert res.passed and "top1_agreement_gated" not in [c.metric for c in res.checks]


def test_a_classifier_stage_reads_as_before():
    ref = _ref({"output": np.array([[1.0, 2.0], [2.0, 1.0], [0.0, 3.0]])}, "classify")
    d = check_stage("quantize_int8", replayed({"output": ref.output}), ref, Int8Tolerance()).to_dict()
    assert "task_metrics" not in d and [c["metric"] for c in d["checks"]] == ["cosine_min", "top1_agreement_gated"]
    assert not any(k.endswith(("_min", "_max")) and k not in ("cosine_min",) for k in d["tolerance"])


def test_per_output_cosine_gate_and_an_unknown_output_is_bad_input():
    logits, boxes = _detector_outputs()
    ref = _ref({"logits": logits, "pred_boxes": boxes}, "detect")
    noisy = boxes + 0.02 * np.random.default_rng(0).standard_normal(boxes.shape)
    tol = Int8Tolerance(cosine_min=0.9999, map_min=0.0, outputs={"pred_boxes": {"cosine_min": 0.9}})
    res = check_stage("quantize_int8", replayed({"logits": logits, "pred_boxes": noisy}), ref, tol)
    limits = {c.metric: c.limit for c in res.checks}
    assert limits["cosine_min[pred_boxes]"] == 0.9 and limits["cosine_min[logits]"] == 0.9999
    with pytest.raises(BadInput, match="no output 'boxes'; did you mean 'pred_boxes'"):
        check_stage("quantize_int8", replayed({}), ref, Int8Tolerance(outputs={"boxes": {"cosine_min": 0.9}}))


def test_task_checks_say_why_nothing_was_measured():
    m, checks, notes = task_checks("detect", {"output": np.zeros((2, 10))}, {"output": np.zeros((2, 10))}, Int8Tolerance())
    assert m is None and not checks and "detect needs" in notes[0]


def test_an_embedder_reports_recall_at_k_ungated_by_default():
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((10, 16))
    hidden = rng.standard_normal((10, 4, 16))
    ref = _ref({"last_hidden_state": hidden, "pooler_output": emb}, "embed")
    res = check_stage("quantize_int8", replayed({"last_hidden_state": hidden, "pooler_output": emb}), ref, Int8Tolerance())
    assert res.task_metrics.outputs == ["pooler_output"] and res.task_metrics.recall_at_k == 1.0
    assert res.task_metrics.k == 5
    assert not any(c.metric.startswith("recall") for c in res.checks)  # null: reported, not gated
    gated = check_stage("quantize_int8", replayed({"last_hidden_state": hidden, "pooler_output": emb[::-1].copy()}), ref,
                        Int8Tolerance(recall_at_k_min=0.9, cosine_min=-1.0))
    assert gated.failed_check.metric == "recall_at_k[pooler_output]"


def test_a_classifier_report_has_no_task_section_and_a_detector_one_has():
    from vitexport.parity.report import render_markdown

    base = {"passed": True, "stages": [{"stage": "quantize_int8", "engine": "onnxruntime", "passed": True,
                                        "metrics": {"cosine_min": 0.99}, "checks": []}]}
    assert "Task" not in render_markdown({**base, "task": "classify"})
    logits, boxes = _detector_outputs()
    stage = check_stage("quantize_int8", replayed({"logits": logits, "pred_boxes": boxes}),
                        _ref({"logits": logits, "pred_boxes": boxes}, "detect"), Int8Tolerance()).to_dict()
    md = render_markdown({"passed": True, "task": "detect", "task_source": "--task", "stages": [stage]})
    assert "## Task: detect" in md and "task: detect (from --task)" in md and "| quantize\\_int8 |" not in md
    assert "| quantize_int8 | fixed | 1 | 1 |" in md  # mAP and AP50 of identical detections
