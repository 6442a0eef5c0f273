"""numpy references for the 3-D box ops, written from mmcv 2.x's semantics (docs/ops/boxes3d.md).

points_in_boxes: mmcv's test step by step in the inputs' type (numpy float32 scalars round every
operation, as mmcv's CPU code does). The footprints' common area: the convex hull of the corners of
each rectangle inside the other and of their edges' crossings, in float64 (rotated_boxes'
rotated_reference.py; the kernel clips one rectangle by the other's edges instead). NMS: a plain
greedy loop over the pairwise IoUs.

A box is (x, y, z, dx, dy, dz, heading); its footprint's corners are the centre plus
R(heading) (+-dx/2, +-dy/2), R(h) = [[cos h, -sin h], [sin h, cos h]] (mmcv's iou3d kernel)."""

import sys
from pathlib import Path

import numpy as np

# The rotated-box family's reference hull: a footprint is that family's (cx, cy, w, h, angle) box
# with mmcv's clockwise=True, R(angle) as here.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rotated_boxes"))
import rotated_reference  # noqa: E402


def _inside(point, box):
    c = box.dtype.type
    x, y, z = point
    cz = c(np.float64(box[2]) + np.float64(box[5]) / 2.0)
    if np.float64(abs(c(z - cz))) > np.float64(box[5]) / 2.0:
        return False
    cosa, sina = c(np.cos(-np.float64(box[6]))), c(np.sin(-np.float64(box[6])))
    sx, sy = c(x - box[0]), c(y - box[1])
    lx = c(c(sx * cosa) + c(sy * c(-sina)))
    ly = c(c(sx * sina) + c(sy * cosa))
    hx, hy = np.float64(box[3]) / 2.0, np.float64(box[4]) / 2.0
    return bool(-hx < np.float64(lx) < hx and -hy < np.float64(ly) < hy)


def points_in_boxes_all(points, boxes):
    b, n, m = points.shape[0], points.shape[1], boxes.shape[1]
    out = np.zeros((b, n, m), np.int32)
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(b):
            for p in range(n):
                for k in range(m):
                    out[i, p, k] = _inside(points[i, p], boxes[i, k])
    return out


def points_in_boxes_part(points, boxes):
    mask = points_in_boxes_all(points, boxes)
    if mask.shape[2] == 0:
        return np.full(points.shape[:2], -1, np.int32)
    first = np.where(mask.any(axis=2), mask.argmax(axis=2), -1)
    return first.astype(np.int32).reshape(points.shape[:2])


def common_area(a, b):
    """The area common to two boxes' footprints (float64); NaN for a box not finite in x, y, dx,
    dy or heading, 0 for one with dx or dy not positive."""
    used = [0, 1, 3, 4, 6]
    if not (np.all(np.isfinite(a[used])) and np.all(np.isfinite(b[used]))):
        return np.nan
    if not (a[3] > 0 and a[4] > 0 and b[3] > 0 and b[4] > 0):
        return 0.0
    reach = np.hypot(a[3], a[4]) / 2 + np.hypot(b[3], b[4]) / 2  # circumscribed circles apart: nothing
    if np.hypot(float(a[0]) - float(b[0]), float(a[1]) - float(b[1])) > reach * (1 + 1e-9):
        return 0.0
    return rotated_reference.intersection_area(a[[0, 1, 3, 4, 6]], b[[0, 1, 3, 4, 6]], clockwise=True)


def boxes_overlap_bev(boxes_a, boxes_b):
    out = np.array([[common_area(a, b) for b in boxes_b] for a in boxes_a], np.float64)
    return out.reshape(len(boxes_a), len(boxes_b)).astype(boxes_a.dtype)


def iou_bev(a, b):
    inter = common_area(a, b)
    return inter / max(float(a[3]) * float(a[4]) + float(b[3]) * float(b[4]) - inter, 1e-8)


def iou_normal(kept, b):
    """mmcv's iou_normal of the rows `kept` with b, in the boxes' type, operand for operand (numpy
    rounds each elementwise operation as the scalar one)."""
    c = b.dtype.type
    two = c(2)
    left = np.maximum(kept[:, 0] - kept[:, 3] / two, b[0] - b[3] / two)
    right = np.minimum(kept[:, 0] + kept[:, 3] / two, b[0] + b[3] / two)
    top = np.maximum(kept[:, 1] - kept[:, 4] / two, b[1] - b[4] / two)
    bottom = np.minimum(kept[:, 1] + kept[:, 4] / two, b[1] + b[4] / two)
    inter = np.maximum(right - left, c(0)) * np.maximum(bottom - top, c(0))
    return inter / np.maximum(kept[:, 3] * kept[:, 4] + b[3] * b[4] - inter, c(np.float32(1e-8)))


def iou_bev(kept, b):
    """The rotated footprints' IoU of the rows `kept` with b (float64); rows whose circumscribed
    circle is apart from b's are 0 without a hull."""
    k = kept.astype(np.float64)
    out = np.zeros(len(kept))
    reach = np.hypot(k[:, 3], k[:, 4]) / 2 + np.hypot(float(b[3]), float(b[4])) / 2
    near = np.hypot(k[:, 0] - float(b[0]), k[:, 1] - float(b[1])) <= reach * (1 + 1e-6)
    for j in np.nonzero(near)[0]:
        inter = common_area(kept[j], b)
        out[j] = inter / max(k[j, 3] * k[j, 4] + float(b[3]) * float(b[4]) - inter, 1e-8)
    return out


def greedy_nms(boxes, scores, iou_threshold, iou, inclusive=False):
    """Each box by descending score (ties: lower index first; no scores: in order) is kept unless a
    kept box has an IoU above the (float32) threshold with it (at least the threshold: inclusive)."""
    n = len(boxes)
    order = list(range(n)) if scores is None else sorted(range(n), key=lambda i: (-scores[i], i))
    thr = boxes.dtype.type(np.float32(iou_threshold))
    keep = []
    for i in order:
        ious = iou(boxes[keep], boxes[i])
        if not np.any(ious >= thr if inclusive else ious > thr):
            keep.append(i)
    return np.array(keep, np.int64)


def nms3d(boxes, scores=None, iou_threshold=0.5):
    return greedy_nms(boxes, scores, iou_threshold, iou_bev)


def nms3d_normal(boxes, scores=None, iou_threshold=0.5):
    return greedy_nms(boxes, scores, iou_threshold, iou_normal)
