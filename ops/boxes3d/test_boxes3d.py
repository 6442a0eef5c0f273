"""The 3-D box ops against the numpy references of boxes3d_reference.py (mmcv 2.x's semantics,
docs/ops/boxes3d.md): points_in_boxes step by step in the points' type, the footprints' common
area as a convex hull in float64, NMS as a plain greedy loop. mmcv's side is in
test_boxes3d_mmcv.py."""

import re

import numpy as np
import pytest
import torch

import boxes3d_reference as ref
import opbridge
from opbridge.testing import BadInput, OpCase, OpTest, Sample, node_model

OPS = torch.ops.opbridge


def boxes(n, seed, dtype="float32", spread=10.0, batch=None):
    """(n, 7) boxes (or (batch, n, 7)): centres in [-spread, spread]^2, sides 1-5 by 1-3 by 1-2."""
    g = np.random.default_rng(seed)
    shape = (n,) if batch is None else (batch, n)
    b = np.stack([g.uniform(-spread, spread, shape), g.uniform(-spread, spread, shape), g.uniform(-2, 0, shape),
                  g.uniform(1, 5, shape), g.uniform(1, 3, shape), g.uniform(1, 2, shape),
                  g.uniform(-np.pi, np.pi, shape)], -1)
    return torch.from_numpy(b.astype(dtype))


def points(batch, n, seed, dtype="float32", spread=10.0):
    g = np.random.default_rng(seed)
    p = np.stack([g.uniform(-spread, spread, (batch, n)), g.uniform(-spread, spread, (batch, n)),
                  g.uniform(-2.5, 2.5, (batch, n))], -1)
    return torch.from_numpy(p.astype(dtype))


def scores(n, seed, dtype="float32"):
    return torch.from_numpy(np.random.default_rng(seed).uniform(0, 1, n).astype(dtype))


def on_faces():
    """A box at the origin (2 x 4 x 2, heading 0) and points on and just off its faces: the bottom
    and top faces are in (|z - cz| <= dz / 2), the side faces out (strict)."""
    box = torch.tensor([[[0.0, 0, 0, 2, 4, 2, 0]]])
    pts = torch.tensor([[[0, 0, 0], [0, 0, 2], [0, 0, 2.0001], [0, 0, -1e-4], [1, 0, 1], [0.9999, 0, 1],
                         [-1, 0, 1], [0, 2, 1], [0, -1.9999, 1], [0, 0, 1], [float("nan"), 0, 1], [0, 0, float("nan")]]])
    return pts, box


def stacked():
    """Overlapping boxes: the part op gives each point its first box."""
    b = torch.tensor([[[0.0, 0, -1, 4, 4, 2, 0.3], [0.5, 0, -1, 4, 4, 2, -0.2], [0.5, 0.5, -1, 1, 1, 2, 0]]])
    return points(1, 200, 3, spread=3.0), b


def pib_samples(op):
    return [
        Sample((points(2, 300, 1), boxes(8, 2, batch=2)), name="float32", dynamic={0: [1]}),
        Sample((points(1, 200, 3, "float64"), boxes(6, 4, "float64", batch=1)), name="float64"),
        Sample(on_faces(), name="on_the_faces"),
        Sample(stacked(), name="overlapping_boxes"),
        Sample((points(2, 0, 5), boxes(3, 6, batch=2)), name="no_points"),
        Sample((points(2, 20, 7), boxes(0, 8, batch=2)), name="no_boxes"),
    ]


PIB_BAD = [
    BadInput((points(1, 5, 1)[..., :2], boxes(2, 1, batch=1)), {}, r"points must be \(B, N, 3\)", "point_columns"),
    BadInput((points(1, 5, 1), boxes(2, 1, batch=1)[..., :6]), {}, r"boxes must be \(B, M, 7\)", "box_columns"),
    BadInput((points(2, 5, 1), boxes(2, 1, batch=1)), {}, "boxes must have the batch size of points", "batch"),
]


def resize_points(s, n):
    return Sample((points(s.inputs[0].shape[0], n, 90, str(s.inputs[0].dtype).split(".")[1]), s.inputs[1]), s.attrs)


class TestPointsInBoxesPart(OpTest):
    case = OpCase("points_in_boxes_part", reference=ref.points_in_boxes_part, samples=pib_samples("part"),
                  bad_inputs=PIB_BAD, resize=resize_points)


class TestPointsInBoxesAll(OpTest):
    case = OpCase("points_in_boxes_all", reference=ref.points_in_boxes_all, samples=pib_samples("all"),
                  bad_inputs=PIB_BAD, resize=resize_points)


def degenerate():
    """A flat box and a box with a negative side beside ordinary ones (NaN rows: a test below)."""
    return torch.tensor([[0.0, 0, 0, 2, 2, 1, 0], [0.0, 0, 0, 0, 2, 1, 0.3], [0.5, 0, 0, -2, 2, 1, 0],
                         [1.0, 1, 0, 2, 2, 1, 0.7]])


class TestBoxesOverlapBev(OpTest):
    case = OpCase(
        "boxes_overlap_bev",
        reference=ref.boxes_overlap_bev,
        samples=[
            Sample((boxes(40, 11, spread=4.0), boxes(30, 12, spread=4.0)), name="float32", dynamic={0: [0]}),
            Sample((boxes(25, 13, "float64", spread=3.0), boxes(20, 14, "float64", spread=3.0)), name="float64"),
            Sample((boxes(10, 15), boxes(10, 15)), name="identical"),
            Sample((degenerate(), degenerate()), name="degenerate"),
            Sample((boxes(0, 16), boxes(5, 17)), name="empty"),
        ],
        rtol=1e-4, atol=1e-4,
        bad_inputs=[BadInput((boxes(3, 1)[:, :5], boxes(2, 2)), {}, r"boxes_a must be \(N, 7\)", "columns")],
        resize=lambda s, n: Sample((boxes(n, 91, spread=4.0), s.inputs[1]), s.attrs),
    )


def crowd(n, seed, dtype="float32"):
    return boxes(n, seed, dtype, spread=6.0)


def nms_case(op, reference):
    return OpCase(
        op,
        reference=reference,
        samples=[
            Sample((crowd(120, 21), scores(120, 22)), {"iou_threshold": 0.3}, name="float32", dynamic={0: [0], 1: [0]}),
            Sample((crowd(80, 23, "float64"), scores(80, 24, "float64")), {"iou_threshold": 0.1}, name="float64"),
            Sample((crowd(60, 25), None), {"iou_threshold": 0.2}, name="in_given_order"),
            Sample((crowd(50, 26), torch.full((50,), 0.5)), {"iou_threshold": 0.25}, name="tied_scores"),
            Sample((crowd(30, 27), scores(30, 28)), {"iou_threshold": 0.0}, name="threshold_zero"),
            Sample((crowd(0, 29), scores(0, 30)), {"iou_threshold": 0.5}, name="empty"),
        ],
        bad_inputs=[
            BadInput((crowd(4, 1), scores(5, 2)), {"iou_threshold": 0.5}, "scores must have one entry per box",
                     "scores_length"),
            BadInput((crowd(4, 1)[:, :5], scores(4, 2)), {"iou_threshold": 0.5}, r"boxes must be \(N, 7\)", "columns"),
            BadInput((crowd(3, 1), torch.tensor([0.1, float("nan"), 0.3])), {"iou_threshold": 0.5},
                     r"scores\[1\] is NaN", "nan_score"),
            BadInput((torch.tensor([[0.0, 0, 0, 1, 1, 1, 0], [0, 0, 0, float("inf"), 1, 1, 0]]), scores(2, 2)),
                     {"iou_threshold": 0.5}, r"boxes\[1\] has a value that is not finite", "infinite_box"),
        ],
        resize=lambda s, n: Sample((crowd(n, 94), scores(n, 95)), s.attrs),
    )


class TestNms3d(OpTest):
    case = nms_case("nms3d", ref.nms3d)


class TestNms3dNormal(OpTest):
    case = nms_case("nms3d_normal", ref.nms3d_normal)


# ---- beyond the suites ------------------------------------------------------------------------------

def test_known_overlaps():
    sq = torch.tensor([[0.0, 0, 0, 1, 1, 1, 0]], dtype=torch.float64)
    turned = torch.tensor([[0.0, 0, 5, 1, 1, 3, np.pi / 4]], dtype=torch.float64)  # z and dz play no part
    assert OPS.boxes_overlap_bev(sq, turned).item() == pytest.approx(2 * (np.sqrt(2) - 1), abs=1e-12)
    # Corner convention: a 4 x 1 box turned a quarter turn covers x in [-0.5, 0.5], y in [-2, 2].
    long = torch.tensor([[0.0, 0, 0, 4, 1, 1, np.pi / 2]], dtype=torch.float64)
    probe = torch.tensor([[0.0, 1.5, 0, 1, 1, 1, 0], [1.5, 0, 0, 1, 1, 1, 0]], dtype=torch.float64)
    np.testing.assert_allclose(OPS.boxes_overlap_bev(long, probe).numpy(), [[1.0, 0.0]], atol=1e-12)
    # Touching edges share nothing; a box inside another shares its own area.
    touching = torch.tensor([[0.0, 0, 0, 2, 2, 1, 0], [2.0, 0, 0, 2, 2, 1, 0], [0.3, 0.2, 0, 0.5, 0.4, 1, 0.4]])
    got = OPS.boxes_overlap_bev(touching, touching)
    assert got[0, 1].item() == pytest.approx(0.0, abs=1e-6) and got[0, 2].item() == pytest.approx(0.2, rel=1e-6)


def test_a_box_that_is_not_finite_overlaps_as_nan():
    a = torch.tensor([[0.0, 0, 0, 2, 2, 1, 0], [0.0, float("nan"), 0, 2, 2, 1, 0], [0.0, 0, 0, float("inf"), 2, 1, 0],
                      [0.0, 0, float("nan"), 2, 2, float("inf"), 0]])  # z and dz play no part
    got = OPS.boxes_overlap_bev(a, a[:1])
    assert got[0, 0] == 4 and torch.isnan(got[1:3, 0]).all() and got[3, 0] == 4


def test_points_in_a_turned_box_follow_the_heading():
    # A 4 x 1 box turned a quarter turn about +z lies along y: (0, 1.5) is in, (1.5, 0) is out.
    box = torch.tensor([[[0.0, 0, 0, 4, 1, 1, np.pi / 2]]])
    pts = torch.tensor([[[0.0, 1.5, 0.5], [1.5, 0.0, 0.5], [0.0, -1.9, 0.5]]])
    assert OPS.points_in_boxes_part(pts, box).tolist() == [[0, -1, 0]]


def test_a_large_cloud_matches_the_reference():
    pts, bx = points(2, 1500, 41, spread=20.0), boxes(40, 42, batch=2, spread=20.0)
    want = ref.points_in_boxes_all(pts.numpy(), bx.numpy())
    assert want.sum() > 50
    np.testing.assert_array_equal(OPS.points_in_boxes_all(pts, bx).numpy(), want)
    np.testing.assert_array_equal(OPS.points_in_boxes_part(pts, bx).numpy(),
                                  ref.points_in_boxes_part(pts.numpy(), bx.numpy()))


@pytest.mark.parametrize("op, reference", [("nms3d", ref.nms3d), ("nms3d_normal", ref.nms3d_normal)])
@pytest.mark.parametrize("n, spread", [(1500, 40.0), (6000, 400.0)])
def test_a_large_nms_matches_the_greedy_loop(op, reference, n, spread):
    # More candidates than one chunk, many kept: the pass against earlier chunks decides; past 4096
    # kept boxes it runs on the threads.
    b, s = boxes(n, 51, spread=spread), scores(n, 52)
    got = getattr(OPS, op)(b, s, iou_threshold=0.2)
    want = reference(b.numpy(), s.numpy(), 0.2)
    assert n / 5 < len(want) < n - 20
    assert n < 5000 or len(want) > 4096 + 512
    np.testing.assert_array_equal(got.numpy(), want)


def test_nms_threshold_is_strict_and_ties_go_to_the_lower_index():
    # A 2 x 1 footprint inside a 2 x 2 one: IoU exactly 0.5, kept at threshold 0.5 (above, strictly).
    b = torch.tensor([[0.0, 0, 0, 2, 2, 1, 0], [0.0, 0.5, 0, 2, 1, 1, 0], [9.0, 9, 0, 1, 1, 1, 0]])
    for op in (OPS.nms3d, OPS.nms3d_normal):
        assert op(b, torch.tensor([0.9, 0.8, 0.1]), iou_threshold=0.5).tolist() == [0, 1, 2]
        assert op(b, torch.tensor([0.9, 0.8, 0.1]), iou_threshold=0.4999).tolist() == [0, 2]
        assert op(b, torch.tensor([0.5, 0.5, 0.5]), iou_threshold=0.4).tolist() == [0, 2]
        assert op(b.flip(0), torch.tensor([0.5, 0.5, 0.5]), iou_threshold=0.4).tolist() == [0, 1]


def test_nms3d_normal_ignores_the_heading():
    b = torch.tensor([[0.0, 0, 0, 4, 1, 1, 0], [0.0, 0, 0, 4, 1, 1, np.pi / 2]])
    s = torch.tensor([0.9, 0.8])
    assert OPS.nms3d_normal(b, s, iou_threshold=0.5).tolist() == [0]  # the same rectangle
    assert OPS.nms3d(b, s, iou_threshold=0.5).tolist() == [0, 1]  # a cross: IoU 1/7


@pytest.mark.parametrize("op", ["nms3d", "nms3d_normal"])
def test_onnxruntime_refuses_what_eager_refuses(op):
    info = opbridge.builtin.op(op)
    b, bad = crowd(3, 71).numpy(), np.array([0.1, float("nan"), 0.3], np.float32)
    sess = opbridge.session(node_model(info, [b, bad], {"iou_threshold": 0.5}))
    with pytest.raises(Exception, match=re.escape(f"opbridge::{op}") + r".*scores\[1\] is NaN"):
        sess.run(None, {"boxes": b, "scores": bad})
    good = np.array([0.1, 0.2, 0.3], np.float32)  # the session survives and runs
    got = sess.run(None, {"boxes": b, "scores": good})
    np.testing.assert_array_equal(got[0], getattr(ref, op)(b, good, 0.5))


@pytest.mark.parametrize("op", ["points_in_boxes_part", "points_in_boxes_all"])
def test_no_point_in_a_huge_empty_batch_allocates_nothing(op):
    # 2^32 + 1 batch items of no point and no box: nothing to answer, and nothing may be sized by
    # the batch count (the boxes were prepared per item: ~100 GB of empty lists).
    items = 2 ** 32 + 1
    got = getattr(torch.ops.opbridge, op)(torch.empty(items, 0, 3), torch.empty(items, 0, 7))
    assert got.shape[:2] == (items, 0) and got.dtype == torch.int32
