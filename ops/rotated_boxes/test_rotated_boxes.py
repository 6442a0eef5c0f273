"""box_iou_rotated, box_iou_rotated_aligned and nms_rotated against numpy references written from
mmcv 2.x's documented semantics (rotated_reference.py: the intersection as the convex hull of
corners and edge crossings, in float64; the kernels clip polygons instead), plus the cases that
pin the semantics down: axis-aligned boxes against plain IoU, the clockwise flag against a mirror,
degenerate and non-finite boxes, score ties, labels. roi_align_rotated is test_roi_align_rotated.py;
mmcv's calling conventions are test_rotated_mmcv.py."""

import re

import numpy as np
import pytest
import torch

import opbridge
import rotated_reference as ref
from opbridge.testing import BadInput, OpCase, OpTest, Sample, node_model

OPS = torch.ops.opbridge


def boxes(n, seed, dtype="float32", spread=10.0, size=(0.5, 4.0), angle=np.pi, centre=0.0):
    """n random boxes: centres within `spread` of `centre`, sides in `size`, angles in ±angle."""
    g = np.random.default_rng(seed)
    b = np.concatenate([g.uniform(0, spread, (n, 2)) + centre, g.uniform(*size, (n, 2)),
                        g.uniform(-angle, angle, (n, 1))], axis=1)
    return torch.from_numpy(b.astype(dtype))


def degenerate():
    """Boxes with a zero side, a tiny one (area under 1e-14), a thin one (area above), and normal ones."""
    return torch.tensor([[0, 0, 0, 2, 0.3], [0, 0, 2, 0, 0], [0, 0, 1e-8, 1e-7, 0], [0, 0, 1e-3, 2, 0.1],
                         [0.5, 0, 2, 2, 0.2], [0, 0, 2, 2, 0]], dtype=torch.float32)


def resize_pair(s, n):
    # Export names axis 0 of every dynamic input alike: boxes1's rows vary, boxes2 stays.
    return Sample((boxes(n, 90), s.inputs[1]), s.attrs)


IOU_SAMPLES = [
    Sample((boxes(40, 1), boxes(30, 2)), name="float32", dynamic={0: [0]}),
    Sample((boxes(25, 3, "float64"), boxes(20, 4, "float64")), {"mode": "iof"}, name="float64_iof"),
    Sample((boxes(30, 5), boxes(30, 6)), {"clockwise": False}, name="counter_clockwise"),
    Sample((boxes(20, 7, spread=1.0), boxes(20, 8, spread=1.0)), {"mode": "iof", "clockwise": False},
           name="crowded_iof_counter_clockwise"),
    # Far from the origin: the midpoint shift keeps float32's digits for the overlap.
    Sample((boxes(20, 9, spread=3.0, centre=5000.0), boxes(20, 10, spread=3.0, centre=5000.0)), name="far_away"),
    Sample((boxes(12, 11), boxes(12, 11)), name="identical_sets"),
    Sample((boxes(10, 12, spread=1.0), boxes(10, 13, spread=1.0, centre=100.0)), name="disjoint"),
    Sample((degenerate(), degenerate()), name="degenerate_boxes"),
    Sample((boxes(0, 14), boxes(5, 15)), name="empty"),
]


class TestBoxIouRotated(OpTest):
    case = OpCase(
        "box_iou_rotated",
        reference=ref.box_iou_rotated,
        samples=IOU_SAMPLES,
        rtol=1e-4, atol=2e-5,
        bad_inputs=[
            BadInput((boxes(3, 1)[:, :4], boxes(3, 2)), {}, r"boxes1 must be \(N, 5\)", "four_columns"),
            BadInput((boxes(3, 1), boxes(3, 2)), {"mode": "giou"}, "mode must be 'iou' or 'iof', got 'giou'",
                     "unknown_mode"),
            BadInput((boxes(3, 1).long(), boxes(3, 2).long()), {}, "input 'boxes1' has dtype int64", "int_boxes"),
        ],
        resize=resize_pair,
    )


class TestBoxIouRotatedAligned(OpTest):
    case = OpCase(
        "box_iou_rotated_aligned",
        reference=ref.box_iou_rotated_aligned,
        samples=[Sample((boxes(40, 21, spread=2.0), boxes(40, 22, spread=2.0)), name="float32", dynamic={0: [0], 1: [0]}),
                 Sample((boxes(30, 23, "float64", spread=2.0), boxes(30, 24, "float64", spread=2.0)),
                        {"mode": "iof", "clockwise": False}, name="float64_iof_counter_clockwise"),
                 Sample((degenerate(), degenerate().flip(0)), name="degenerate_boxes"),
                 Sample((boxes(0, 25), boxes(0, 26)), name="empty")],
        rtol=1e-4, atol=2e-5,
        bad_inputs=[BadInput((boxes(3, 1), boxes(4, 2)), {}, "boxes2 must have as many rows as boxes1", "rows")],
        resize=lambda s, n: Sample((boxes(n, 92, spread=2.0), boxes(n, 93, spread=2.0)), s.attrs),
    )


def labels(n, seed, classes=3, dtype=torch.int64):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, classes, n)).to(dtype)


def scores(n, seed, dtype="float32"):
    return torch.from_numpy(np.random.default_rng(seed).uniform(0, 1, n).astype(dtype))


def crowd(n, seed, dtype="float32"):
    """Boxes crowded enough that NMS drops many."""
    return boxes(n, seed, dtype, spread=6.0, size=(1.0, 3.0))


class TestNmsRotated(OpTest):
    case = OpCase(
        "nms_rotated",
        reference=ref.nms_rotated,
        samples=[
            Sample((crowd(120, 31), scores(120, 32)), {"iou_threshold": 0.3}, name="float32", dynamic={0: [0], 1: [0]}),
            Sample((crowd(100, 33, "float64"), scores(100, 34, "float64")), {"iou_threshold": 0.1, "clockwise": False},
                   name="float64_counter_clockwise"),
            Sample((crowd(120, 35), scores(120, 36), labels(120, 37)), {"iou_threshold": 0.2}, name="labels"),
            Sample((crowd(60, 38), scores(60, 39), labels(60, 40, dtype=torch.int32)), {"iou_threshold": 0.5},
                   name="int32_labels"),
            # Equal scores: the lower index goes first, and keeps its place against the others.
            Sample((crowd(50, 41), torch.full((50,), 0.5)), {"iou_threshold": 0.25}, name="tied_scores"),
            # IoU >= 0 holds for every pair: one box is kept.
            Sample((crowd(20, 42), scores(20, 43)), {"iou_threshold": 0.0}, name="threshold_zero"),
            Sample((degenerate(), scores(6, 44)), {"iou_threshold": 0.1}, name="degenerate_boxes"),
            Sample((crowd(0, 45), scores(0, 46)), {"iou_threshold": 0.5}, name="empty"),
        ],
        rtol=1e-5, atol=1e-6,
        bad_inputs=[
            BadInput((crowd(4, 1), scores(5, 2)), {"iou_threshold": 0.5}, "scores must have one entry per row of dets",
                     "scores_length"),
            BadInput((crowd(4, 1), scores(4, 2), labels(3, 3)), {"iou_threshold": 0.5},
                     "labels must have one entry per row of dets", "labels_length"),
            BadInput((crowd(4, 1)[:, :4], scores(4, 2)), {"iou_threshold": 0.5}, r"dets must be \(N, 5\)", "columns"),
            BadInput((crowd(3, 1), torch.tensor([0.1, float("nan"), 0.3])), {"iou_threshold": 0.5},
                     r"scores\[1\] is NaN", "nan_score"),
            BadInput((torch.tensor([[0, 0, 1, 1, 0], [0, 0, float("inf"), 1, 0]]), scores(2, 2)), {"iou_threshold": 0.5},
                     r"dets\[1, 2\] = inf is not finite", "infinite_box"),
            BadInput((crowd(3, 1), scores(3, 2), torch.tensor([0.0, 1.0, 0.0])), {"iou_threshold": 0.5},
                     "input 'labels' has dtype float32", "float_labels"),
        ],
        resize=lambda s, n: Sample((crowd(n, 94), scores(n, 95)), s.attrs),
    )


def plain_iou(a, b):
    """Axis-aligned IoU of (cx, cy, w, h) boxes."""
    lo = np.maximum(a[:, None, :2] - a[:, None, 2:4] / 2, b[None, :, :2] - b[None, :, 2:4] / 2)
    hi = np.minimum(a[:, None, :2] + a[:, None, 2:4] / 2, b[None, :, :2] + b[None, :, 2:4] / 2)
    inter = np.prod(np.clip(hi - lo, 0, None), axis=-1)
    area_a, area_b = a[:, 2] * a[:, 3], b[:, 2] * b[:, 3]
    return inter / (area_a[:, None] + area_b[None, :] - inter)


def test_axis_aligned_boxes_give_plain_iou():
    a, b = boxes(30, 51, "float64", spread=4.0), boxes(25, 52, "float64", spread=4.0)
    a[:, 4] = 0
    b[:, 4] = 0
    want = plain_iou(a.numpy(), b.numpy())
    assert (want > 0).mean() > 0.2  # the sample overlaps
    for clockwise in (True, False):
        np.testing.assert_allclose(OPS.box_iou_rotated(a, b, clockwise=clockwise).numpy(), want, rtol=1e-12, atol=1e-12)
    # A quarter turn swaps w and h; half a turn changes nothing.
    a2, b2 = a.clone(), b.clone()
    a2[:, [2, 3]], a2[:, 4] = a[:, [3, 2]], np.pi / 2
    b2[:, 4] = np.pi
    np.testing.assert_allclose(OPS.box_iou_rotated(a2, b2).numpy(), want, atol=1e-12)


def test_clockwise_flag_is_the_mirror_image():
    """clockwise=False is clockwise=True with the angles negated, which is the mirror image (across
    the x axis) of the boxes with their centres mirrored and their angles kept; a mirror keeps every
    area. It differs from clockwise=True on the same boxes."""
    a, b = boxes(30, 53, "float64", spread=3.0), boxes(30, 54, "float64", spread=3.0)
    mirror = torch.tensor([1.0, -1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    ccw = OPS.box_iou_rotated(a, b, clockwise=False)
    np.testing.assert_allclose(ccw.numpy(), OPS.box_iou_rotated(a * mirror, b * mirror).numpy(), atol=1e-12)
    assert not torch.allclose(ccw, OPS.box_iou_rotated(a, b), atol=1e-3)


def test_known_overlaps():
    # Two unit squares, one turned 45 degrees about the same centre: the octagon of area 2(sqrt 2 - 1).
    sq = torch.tensor([[0.0, 0, 1, 1, 0]], dtype=torch.float64)
    turned = torch.tensor([[0.0, 0, 1, 1, np.pi / 4]], dtype=torch.float64)
    inter = 2 * (np.sqrt(2) - 1)
    assert OPS.box_iou_rotated(sq, turned).item() == pytest.approx(inter / (2 - inter), abs=1e-12)
    assert OPS.box_iou_rotated(sq, turned, mode="iof").item() == pytest.approx(inter, abs=1e-12)
    # A box inside a bigger one: iof of the small one is 1, iou the ratio of areas.
    small, big = torch.tensor([[1.0, 1, 1, 2, 0.3]]), torch.tensor([[1.0, 1, 10, 10, -0.7]])
    assert OPS.box_iou_rotated(small, big, mode="iof").item() == pytest.approx(1.0, abs=1e-6)
    assert OPS.box_iou_rotated(small, big).item() == pytest.approx(0.02, abs=1e-6)
    # Touching edges share no area.
    touching = torch.tensor([[0.0, 0, 2, 2, 0], [2.0, 0, 2, 2, 0]])
    assert OPS.box_iou_rotated(touching[:1], touching[1:]).item() == pytest.approx(0.0, abs=1e-6)


def test_a_box_that_is_not_finite_gives_nan():
    a = torch.tensor([[0.0, 0, 2, 2, 0], [0.0, float("nan"), 2, 2, 0], [0.0, 0, float("inf"), 2, 0]])
    got = OPS.box_iou_rotated(a, a[:1])
    assert got[0, 0] == 1 and torch.isnan(got[1:, 0]).all()


def test_nms_ties_go_to_the_lower_index():
    dets = torch.tensor([[0.0, 0, 2, 2, 0], [0.1, 0, 2, 2, 0], [0.2, 0, 2, 2, 0], [9.0, 9, 1, 1, 0]])
    kept, keep = OPS.nms_rotated(dets, torch.tensor([0.5, 0.5, 0.5, 0.5]), iou_threshold=0.5)
    assert keep.tolist() == [0, 3]
    kept, keep = OPS.nms_rotated(dets.flip(0), torch.tensor([0.5, 0.5, 0.5, 0.5]), iou_threshold=0.5)
    assert keep.tolist() == [0, 1]
    assert keep.dtype == torch.int64 and kept.shape == (2, 6)


def test_nms_threshold_is_inclusive_and_labels_separate():
    # A 2 x 1 box inside a 2 x 2 one: IoU exactly 0.5, so suppressed at threshold 0.5 (>=, mmcv's
    # CPU rule) and kept just above it.
    dets = torch.tensor([[0.0, 0, 2, 2, 0], [0.0, 0.5, 2, 1, 0]])
    s = torch.tensor([0.9, 0.8])
    assert OPS.box_iou_rotated(dets[:1], dets[1:]).item() == 0.5
    assert OPS.nms_rotated(dets, s, iou_threshold=0.5)[1].tolist() == [0]
    assert OPS.nms_rotated(dets, s, iou_threshold=0.5001)[1].tolist() == [0, 1]
    assert OPS.nms_rotated(dets, s, torch.tensor([0, 1]), iou_threshold=0.25)[1].tolist() == [0, 1]
    assert OPS.nms_rotated(dets, s, torch.tensor([1, 1]), iou_threshold=0.25)[1].tolist() == [0]


def test_a_large_nms_matches_the_reference():
    dets, s, lab = crowd(600, 61), scores(600, 62), labels(600, 63, classes=4)
    kept, keep = OPS.nms_rotated(dets, s, lab, iou_threshold=0.3)
    want_kept, want_keep = ref.nms_rotated(dets.numpy(), s.numpy(), lab.numpy(), 0.3)
    np.testing.assert_array_equal(keep.numpy(), want_keep)
    np.testing.assert_allclose(kept.numpy(), want_kept)


@pytest.mark.parametrize("scores_in, match", [
    ([0.1, float("nan"), 0.3], r"scores\[1\] is NaN"),
])
def test_onnxruntime_refuses_what_eager_refuses(scores_in, match):
    info = opbridge.builtin.op("nms_rotated")
    dets, bad = crowd(3, 71).numpy(), np.array(scores_in, np.float32)
    sess = opbridge.session(node_model(info, [dets, bad, None], {"iou_threshold": 0.5}))
    with pytest.raises(Exception, match=re.escape("opbridge::nms_rotated") + ".*" + match):
        sess.run(None, {"dets": dets, "scores": bad})
    good = np.array([0.1, 0.2, 0.3], np.float32)  # the session survives and runs
    got = sess.run(None, {"dets": dets, "scores": good})
    np.testing.assert_array_equal(got[1], ref.nms_rotated(dets, good, None, 0.5)[1])
