"""nms, softnms and nms_match against numpy loops written from mmcv's CPU semantics (docs/ops/nms.md):
IoU inter / (area_a + area_b - inter) in the boxes' type with widths x2 - x1 + offset, order by
descending score with equal scores lowest index first; nms drops a box whose IoU with an earlier
kept box is above the threshold (after NMSop's score_threshold, before its max_num), soft-NMS
reweights the rest after each box it takes, nms_match groups each kept box with those it suppresses
(IoU at least the threshold). Thousands of boxes (nms's grid) against a column-wise loop, and ONNX
Runtime's errors. mmcv's side is in test_nms_mmcv.py."""

import re

import numpy as np
import pytest
import torch

import opbridge
from opbridge.testing import BadInput, OpCase, OpTest, Sample, node_model


def iou(a, b, off):
    """mmcv's IoU of rows a (taken first) and b, in their type; a zero union gives NaN."""
    c = a.dtype.type
    off = c(off)
    w = max(c(0), min(a[2], b[2]) - max(a[0], b[0]) + off)
    h = max(c(0), min(a[3], b[3]) - max(a[1], b[1]) + off)
    inter = w * h
    area_a, area_b = (a[2] - a[0] + off) * (a[3] - a[1] + off), (b[2] - b[0] + off) * (b[3] - b[1] + off)
    with np.errstate(invalid="ignore", divide="ignore"):
        return inter / (area_a + area_b - inter)


def by_score(scores, candidates):
    return sorted(candidates, key=lambda i: (-scores[i], i))


def nms_reference(boxes, scores, iou_threshold, offset=0, score_threshold=0.0, max_num=-1):
    c = boxes.dtype.type
    thr, sthr = c(np.float32(iou_threshold)), c(np.float32(score_threshold))
    order = by_score(scores, [i for i in range(len(boxes)) if score_threshold <= 0 or scores[i] > sthr])
    alive = [True] * len(order)
    keep = []
    for a in range(len(order)):  # each kept box suppresses the later ones (mmcv's pass)
        if not alive[a]:
            continue
        keep.append(order[a])
        for b in range(a + 1, len(order)):
            if alive[b] and iou(boxes[order[a]], boxes[order[b]], offset) > thr:
                alive[b] = False
    return np.array(keep[:max_num] if max_num > 0 else keep, np.int64)


def softnms_reference(boxes, scores, iou_threshold=0.3, sigma=0.5, min_score=1e-3, method=1, offset=0):
    c = boxes.dtype.type
    thr, sig, low = c(np.float32(iou_threshold)), c(np.float32(sigma)), c(np.float32(min_score))
    score = {i: scores[i] for i in range(len(boxes))}
    dets, inds = [], []
    while score:
        best = by_score(score, list(score))[0]
        dets.append(list(boxes[best]) + [score.pop(best)])
        inds.append(best)
        for j in list(score):
            ovr = iou(boxes[best], boxes[j], offset)
            weight = c(1)
            if method == 0 and ovr >= thr:
                weight = c(0)
            elif method == 1 and ovr >= thr:
                weight = c(1) - ovr
            elif method == 2 and not np.isnan(ovr):
                weight = np.exp(-(ovr * ovr) / sig)
            score[j] = score[j] * weight
            if score[j] < low:
                del score[j]
    return np.array(dets, boxes.dtype).reshape(-1, 5), np.array(inds, np.int64)


def nms_match_reference(dets, iou_threshold):
    c = dets.dtype.type
    thr = c(np.float32(iou_threshold))
    order = by_score(dets[:, 4], range(len(dets)))
    done = [False] * len(order)
    matched, group = [], []
    for a in range(len(order)):
        if done[a]:
            continue
        members = [order[a]]
        for b in range(a + 1, len(order)):
            if not done[b] and iou(dets[order[a], :4], dets[order[b], :4], 0) >= thr:
                done[b] = True
                members.append(order[b])
        group += [group[-1] + 1 if group else 0] * len(members)
        matched += members
    return np.array(matched, np.int64), np.array(group, np.int64)


def boxes(n, seed, dtype=torch.float32, extent=100.0, size=(5.0, 40.0), integer=False):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * extent
    wh = size[0] + torch.rand(n, 2, generator=g, dtype=torch.float64) * (size[1] - size[0])
    out = torch.cat([xy, xy + wh], 1)
    return (out.round() if integer else out).to(dtype)


def scores(n, seed, dtype=torch.float32, levels=None):
    s = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return ((s * levels).floor() / levels if levels else s).to(dtype)


def ties(n, seed):
    """Boxes repeated, with scores on 4 levels: many exact ties of score and of IoU."""
    b = boxes(n // 2, seed)
    return torch.cat([b, b]), scores(n, seed + 1, levels=4)


def degenerate():
    """Zero-area boxes (a zero union: NaN IoU, never suppressing) beside ordinary ones."""
    b = torch.tensor([[5, 5, 5, 5], [5, 5, 5, 5], [8, 8, 8, 9], [0, 0, 10, 10], [0, 0, 10, 10.5], [3, 3, 3, 3]])
    return b.float(), torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])


def boundary():
    """Pairs whose IoU is exactly 0.5 (the third pair 1/3, and 1/2 with offset 1): at the threshold,
    nms keeps both and nms_match groups them. The first box is taken first and its partner last, after 20 boxes that
    overlap nothing, so the partner is checked against a full block of kept boxes."""
    b = torch.tensor([[0, 0, 10, 10], [20, 20, 30, 30], [20, 25, 30, 30], [40, 40, 43, 43], [40, 40, 43, 41]])
    far = torch.tensor([[100.0, 0, 105, 5]]) + torch.arange(20.0)[:, None] * torch.tensor([10.0, 0, 10, 0])
    b = torch.cat([b.float(), far, torch.tensor([[0.0, 0, 10, 5]])])
    return b, torch.cat([torch.tensor([0.99, 0.7, 0.75, 0.6, 0.5]), torch.linspace(0.95, 0.8, 20), torch.tensor([0.1])])


def nan_at(t, row):
    t = t.clone()
    t.view(-1)[row * (t.numel() // max(len(t), 1))] = float("nan")
    return t


BAD_COMMON = [
    BadInput((boxes(5, 1)[:, :3], scores(5, 2)), {"iou_threshold": 0.5}, r"boxes must be \(N, 4\)", "three_coords"),
    BadInput((boxes(5, 1), scores(4, 2)), {"iou_threshold": 0.5}, "scores must have one entry per box", "scores_len"),
    BadInput((boxes(5, 1), scores(5, 2)), {"iou_threshold": 0.5, "offset": 2}, "offset must be 0 or 1", "offset_2"),
    BadInput((boxes(5, 1), scores(5, 2)), {"iou_threshold": 0.5, "offset": -1}, "offset must be 0 or 1", "offset_neg"),
    BadInput((boxes(5, 1), nan_at(scores(5, 2), 3)), {"iou_threshold": 0.5},
             r"scores has a value that is not finite \(nan at row 3\)", "nan_score"),
    BadInput((nan_at(boxes(5, 1), 2), scores(5, 2)), {"iou_threshold": 0.5},
             r"boxes has a value that is not finite \(nan at row 2\)", "nan_box"),
    BadInput((boxes(5, 1).long(), scores(5, 2)), {"iou_threshold": 0.5}, "input 'boxes' has dtype int64", "int_boxes"),
    BadInput((boxes(5, 1), scores(5, 2)), {"iou_threshold": float("nan")}, "iou_threshold must be a number",
             "nan_threshold"),
]


class TestNms(OpTest):
    case = OpCase(
        "nms",
        reference=nms_reference,
        samples=[
            Sample((boxes(80, 1), scores(80, 2)), {"iou_threshold": 0.3}, name="float32", dynamic={0: [0], 1: [0]}),
            Sample((boxes(60, 3, torch.float64), scores(60, 4, torch.float64)), {"iou_threshold": 0.5},
                   name="float64"),
            Sample((boxes(60, 5, integer=True), scores(60, 6)), {"iou_threshold": 0.4, "offset": 1}, name="offset_1"),
            Sample(ties(60, 7), {"iou_threshold": 0.5}, name="ties"),
            Sample((boxes(0, 8), scores(0, 9)), {"iou_threshold": 0.5}, name="empty"),
            Sample((boxes(1, 8).repeat(7, 1), scores(7, 10)), {"iou_threshold": 0.5}, name="all_but_one_suppressed"),
            Sample((boxes(70, 11), scores(70, 12)), {"iou_threshold": 0.2, "score_threshold": 0.4, "max_num": 6},
                   name="score_threshold_max_num"),
            Sample((boxes(20, 13), scores(20, 14)), {"iou_threshold": 0.5, "score_threshold": 2.0}, name="none_scores"),
            Sample(degenerate(), {"iou_threshold": 0.0}, name="zero_area"),
            Sample(boundary(), {"iou_threshold": 0.5}, name="iou_at_threshold"),
            Sample((boxes(40, 15), scores(40, 16, levels=4)), {"iou_threshold": 0.3, "score_threshold": 0.5},
                   name="score_at_threshold"),
        ],
        bad_inputs=BAD_COMMON + [
            BadInput((boxes(5, 1), scores(5, 2)), {"iou_threshold": 0.5, "score_threshold": float("nan")},
                     "score_threshold must be a number", "nan_score_threshold"),
        ],
        resize=lambda s, n: Sample((boxes(n, 90), scores(n, 91)), s.attrs),
    )


class TestSoftNms(OpTest):
    case = OpCase(
        "softnms",
        reference=softnms_reference,
        samples=[
            Sample((boxes(50, 21), scores(50, 22)), {}, name="linear_defaults", dynamic={0: [0], 1: [0]}),
            Sample((boxes(50, 23), scores(50, 24)), {"method": 0, "iou_threshold": 0.4}, name="naive"),
            Sample((boxes(50, 25), scores(50, 26)), {"method": 2, "sigma": 0.3, "min_score": 0.05}, name="gaussian"),
            Sample((boxes(40, 27, torch.float64), scores(40, 28, torch.float64)), {"method": 2}, name="float64"),
            Sample((boxes(40, 29, integer=True), scores(40, 30)), {"offset": 1, "iou_threshold": 0.2}, name="offset_1"),
            Sample(ties(40, 31), {"method": 1}, name="ties"),
            Sample((boxes(0, 32), scores(0, 33)), {}, name="empty"),
            # The first box is taken whatever its score; identical ones fall to 0 (naive) and below min_score.
            Sample((boxes(1, 34).repeat(5, 1), scores(5, 35) * 1e-4), {"method": 0}, name="all_but_one_dropped"),
            Sample(degenerate(), {"method": 2}, name="zero_area"),
            Sample(boundary(), {"method": 0, "iou_threshold": 0.5}, name="iou_at_threshold"),
            Sample(boundary(), {"method": 1, "iou_threshold": 0.5}, name="linear_iou_at_threshold"),
            # Scores that end exactly at min_score stay: naive zeroes with min_score 0, and levels of 1/4.
            Sample((boxes(40, 36), scores(40, 37)), {"method": 0, "min_score": 0.0}, name="zeroed_at_min_score"),
            Sample((boxes(40, 38, extent=400.0), scores(40, 39, levels=4)), {"min_score": 0.25},
                   name="score_at_min_score"),
        ],
        bad_inputs=BAD_COMMON + [
            BadInput((boxes(5, 1), scores(5, 2)), {"method": 3}, r"method must be 0 \(naive\), 1 \(linear\) or 2",
                     "method_3"),
            BadInput((boxes(5, 1), scores(5, 2)), {"method": 2, "sigma": 0.0}, "sigma must be > 0 for the gaussian",
                     "sigma_0"),
        ],
        rtol=1e-5, atol=1e-6,
        resize=lambda s, n: Sample((boxes(n, 92), scores(n, 93)), s.attrs),
    )


def dets(n, seed, dtype=torch.float32, **kw):
    return torch.cat([boxes(n, seed, dtype), scores(n, seed + 1, dtype, **kw)[:, None]], 1)


class TestNmsMatch(OpTest):
    case = OpCase(
        "nms_match",
        reference=nms_match_reference,
        samples=[
            Sample((dets(80, 41),), {"iou_threshold": 0.3}, name="float32", dynamic={0: [0]}),
            Sample((dets(60, 43, torch.float64),), {"iou_threshold": 0.5}, name="float64"),
            Sample((torch.cat([dets(30, 45, levels=4)] * 2),), {"iou_threshold": 0.5}, name="ties"),
            Sample((dets(0, 47),), {"iou_threshold": 0.5}, name="empty"),
            Sample((torch.cat([boundary()[0], boundary()[1][:, None]], 1),), {"iou_threshold": 0.5},
                   name="iou_at_threshold"),
            Sample((torch.cat([degenerate()[0], degenerate()[1][:, None]], 1),), {"iou_threshold": 0.0},
                   name="zero_area"),
        ],
        bad_inputs=[
            BadInput((dets(5, 1)[:, :4],), {"iou_threshold": 0.5}, r"dets must be \(N, 5\)", "four_columns"),
            BadInput((nan_at(dets(5, 1), 4),), {"iou_threshold": 0.5},
                     r"dets has a value that is not finite \(nan at row 4\)", "nan"),
            BadInput((dets(5, 1),), {"iou_threshold": float("nan")}, "iou_threshold must be a number", "nan_threshold"),
        ],
        resize=lambda s, n: Sample((dets(n, 94),), s.attrs),
    )


def nms_columns(b, s, iou_threshold, offset=0):
    """nms_reference with the inner loop over numpy columns, for thousands of boxes."""
    c = b.dtype.type
    off, thr = c(offset), c(np.float32(iou_threshold))
    order = np.lexsort((np.arange(len(s)), -s))
    x1, y1, x2, y2 = (b[order, k] for k in range(4))
    area = (x2 - x1 + off) * (y2 - y1 + off)
    alive, keep = np.ones(len(order), bool), []
    for a in range(len(order)):
        if alive[a]:
            keep.append(order[a])
            rest = slice(a + 1, None)
            w = np.maximum(c(0), np.minimum(x2[a], x2[rest]) - np.maximum(x1[a], x1[rest]) + off)
            h = np.maximum(c(0), np.minimum(y2[a], y2[rest]) - np.maximum(y1[a], y1[rest]) + off)
            with np.errstate(invalid="ignore", divide="ignore"):
                alive[rest] &= ~(w * h / (area[a] + area[rest] - w * h) > thr)
    return np.array(keep, np.int64)


def test_thousands_of_boxes_match_the_loop():
    # Past 4096 candidates the kernel looks up kept boxes in a grid: boxes spanning most of the scene,
    # flipped ones (x2 < x1), points, integer corners touching with offset 1, scores with ties.
    b = boxes(6000, 51, extent=600.0, size=(1.0, 40.0), integer=True)
    b[::97, 2:] = 600
    b[::89] = b[::89][:, [2, 1, 0, 3]]
    b[::83, 2:] = b[::83, :2]
    s = scores(6000, 52, levels=50)
    for offset, thr in ((0, 0.5), (1, 0.3), (0, 0.0), (1, 0.9)):
        got = torch.ops.opbridge.nms(b, s, thr, offset)
        np.testing.assert_array_equal(got.numpy(), nms_columns(b.numpy(), s.numpy(), thr, offset), f"{offset} {thr}")
    assert len(got) > 1000
    # Boxes far smaller than offset 1: they overlap through the offset alone.
    tiny = boxes(6000, 53, extent=60.0, size=(0.0, 0.3))
    got = torch.ops.opbridge.nms(tiny, s, 0.5, 1)
    np.testing.assert_array_equal(got.numpy(), nms_columns(tiny.numpy(), s.numpy(), 0.5, 1))
    # A negative threshold: any pair suppresses, overlapping or not (the scan without the grid).
    assert torch.ops.opbridge.nms(b, s, -0.1).tolist() == nms_columns(b.numpy(), s.numpy(), -0.1).tolist()


@pytest.mark.parametrize("op, inputs, attrs, match", [
    ("nms", (boxes(6, 1), nan_at(scores(6, 2), 4)), {"iou_threshold": 0.5},
     "scores has a value that is not finite (nan at row 4)"),
    ("nms", (boxes(6, 1), scores(6, 2)), {"iou_threshold": 0.5, "offset": 2}, "offset must be 0 or 1"),
    ("nms", (boxes(6, 1), scores(5, 2)), {"iou_threshold": 0.5}, "scores must have one entry per box"),
    ("softnms", (nan_at(boxes(6, 1), 1), scores(6, 2)), {}, "boxes has a value that is not finite (nan at row 1)"),
    ("softnms", (boxes(6, 1), scores(6, 2)), {"method": 2, "sigma": -1.0}, "sigma must be > 0"),
    ("nms_match", (boxes(6, 1),), {"iou_threshold": 0.5}, "dets must be (N, 5)"),
])
def test_onnxruntime_fails_with_the_reason(op, inputs, attrs, match):
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, RuntimeException

    info = next(o for o in opbridge.all_ops() if o.name == op)
    model = node_model(info, [t.numpy() for t in inputs], attrs)
    sess = opbridge.session(model)
    feeds = {i.name: t.numpy() for i, t in zip(sess.get_inputs(), inputs)}
    with pytest.raises((Fail, InvalidArgument, RuntimeException), match=rf"opbridge::{op}.*" + re.escape(match)):
        sess.run(None, feeds)
    # The process survived: a well-formed nms node still runs and is right.
    b, s = boxes(30, 3).numpy(), scores(30, 4).numpy()
    good = node_model(next(o for o in opbridge.all_ops() if o.name == "nms"), [b, s], {"iou_threshold": 0.3})
    got = opbridge.session(good).run(None, {"boxes": b, "scores": s})[0]
    np.testing.assert_array_equal(got, nms_reference(b, s, 0.3))
