"""numpy references for the rotated-box ops, written from mmcv 2.x's documented semantics and
independent of the kernels' method: the intersection of two boxes is the convex hull of the corners
of each inside the other and of their edges' crossings (the kernel clips one box by the other's
edges instead), in float64.

Boxes are (cx, cy, w, h, angle); with clockwise=True corner A = centre + R(a) (-w/2, -h/2), with
R(a) = [[cos a, -sin a], [sin a, cos a]] (mmcv's box_iou_rotated docstring), B, C, D going round by
(+w/2, -h/2), (+w/2, +h/2), (-w/2, +h/2); clockwise=False uses R(-a)."""

import numpy as np


def corners(box, clockwise=True):
    cx, cy, w, h, a = (float(v) for v in box)
    a = a if clockwise else -a
    rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    local = np.array([[-w / 2, -h / 2], [w / 2, -h / 2], [w / 2, h / 2], [-w / 2, h / 2]])
    return local @ rot.T + np.array([cx, cy])


def _inside(p, rect):
    """Whether p lies in the rectangle with corners rect (A, B, C, D), up to rounding."""
    a, ab, ad = rect[0], rect[1] - rect[0], rect[3] - rect[0]
    tol = 1e-9
    u = np.dot(p - a, ab) / max(np.dot(ab, ab), 1e-300)
    v = np.dot(p - a, ad) / max(np.dot(ad, ad), 1e-300)
    return -tol <= u <= 1 + tol and -tol <= v <= 1 + tol


def _crossings(r1, r2):
    pts = []
    for i in range(4):
        p, d = r1[i], r1[(i + 1) % 4] - r1[i]
        for j in range(4):
            q, e = r2[j], r2[(j + 1) % 4] - r2[j]
            den = d[0] * e[1] - d[1] * e[0]
            if abs(den) < 1e-300:
                continue  # parallel edges: their common part ends at corners found below
            t = ((q[0] - p[0]) * e[1] - (q[1] - p[1]) * e[0]) / den
            s = ((q[0] - p[0]) * d[1] - (q[1] - p[1]) * d[0]) / den
            if -1e-12 <= t <= 1 + 1e-12 and -1e-12 <= s <= 1 + 1e-12:
                pts.append(p + t * d)
    return pts


def intersection_area(b1, b2, clockwise=True):
    r1, r2 = corners(b1, clockwise), corners(b2, clockwise)
    pts = [p for p in r1 if _inside(p, r2)] + [p for p in r2 if _inside(p, r1)] + _crossings(r1, r2)
    if len(pts) < 3:
        return 0.0
    pts = np.array(pts)
    centre = pts.mean(axis=0)
    pts = pts[np.argsort(np.arctan2(pts[:, 1] - centre[1], pts[:, 0] - centre[0]))]
    x, y = pts[:, 0], pts[:, 1]
    return abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))) / 2


def overlap(b1, b2, mode="iou", clockwise=True):
    """mmcv's single-pair overlap: NaN for a non-finite box, 0 when either area w*h < 1e-14."""
    if not (np.all(np.isfinite(b1)) and np.all(np.isfinite(b2))):
        return np.nan
    a1, a2 = float(b1[2]) * float(b1[3]), float(b2[2]) * float(b2[3])
    if a1 < 1e-14 or a2 < 1e-14:
        return 0.0
    inter = intersection_area(b1, b2, clockwise)
    return inter / (a1 if mode == "iof" else a1 + a2 - inter)


def box_iou_rotated(boxes1, boxes2, mode="iou", clockwise=True):
    out = np.array([[overlap(a, b, mode, clockwise) for b in boxes2] for a in boxes1], np.float64)
    return out.reshape(len(boxes1), len(boxes2)).astype(boxes1.dtype)


def box_iou_rotated_aligned(boxes1, boxes2, mode="iou", clockwise=True):
    return np.array([overlap(a, b, mode, clockwise) for a, b in zip(boxes1, boxes2)], np.float64).astype(boxes1.dtype)


def nms_rotated(dets, scores, labels=None, iou_threshold=0.5, clockwise=True):
    """Greedy NMS: by descending score (ties: lower index first), a box is dropped when a kept box
    of its label has IoU >= the threshold (a float32 attribute) with it."""
    order = sorted(range(len(dets)), key=lambda i: (-float(scores[i]), i))
    threshold = float(np.float32(iou_threshold))
    keep = []
    for i in order:
        if all(labels is not None and labels[k] != labels[i] or overlap(dets[k], dets[i], "iou", clockwise) < threshold
               for k in keep):
            keep.append(i)
    keep = np.array(keep, np.int64)
    kept = np.concatenate([dets[keep].reshape(-1, 5), scores[keep].reshape(-1, 1)], axis=1)
    return kept.astype(dets.dtype), keep


def _bilinear(img, y, x):
    """mmcv's sample of img (C, H, W) at (y, x): 0 beyond a pixel outside, clamped to the edge."""
    h, w = img.shape[1:]
    if y < -1 or y > h or x < -1 or x > w:
        return np.zeros(img.shape[0])
    y, x = max(float(y), 0.0), max(float(x), 0.0)
    y0, x0 = int(y), int(x)
    if y0 >= h - 1:
        y0 = y1 = h - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= w - 1:
        x0 = x1 = w - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    im = img.astype(np.float64)
    return ((1 - ly) * (1 - lx) * im[:, y0, x0] + (1 - ly) * lx * im[:, y0, x1] + ly * (1 - lx) * im[:, y1, x0]
            + ly * lx * im[:, y1, x1])


def roi_align_rotated(input, rois, output_size=(1, 1), spatial_scale=1.0, sampling_ratio=0, aligned=True,
                      clockwise=False):
    """mmcv's RoIAlignRotated: the RoI's frame in the input's dtype (as mmcv computes it), the
    samples' values in float64."""
    t = input.dtype.type
    ph_n, pw_n = output_size
    c = input.shape[1]
    out = np.zeros((len(rois), c, ph_n, pw_n))
    scale = t(np.float32(spatial_scale))
    for k, roi in enumerate(rois.astype(input.dtype)):
        img = input[int(roi[0])]
        off = t(0.5) if aligned else t(0)
        cw, ch = roi[1] * scale - off, roi[2] * scale - off
        rw, rh = roi[3] * scale, roi[4] * scale
        theta = -roi[5] if clockwise else roi[5]
        cos, sin = t(np.cos(theta)), t(np.sin(theta))
        if not aligned:
            rw, rh = max(rw, t(1)), max(rh, t(1))
        bh, bw = rh / t(ph_n), rw / t(pw_n)
        gh = sampling_ratio if sampling_ratio > 0 else int(np.ceil(np.float32(rh / t(ph_n))))
        gw = sampling_ratio if sampling_ratio > 0 else int(np.ceil(np.float32(rw / t(pw_n))))
        sh, sw = t(-rh / 2), t(-rw / 2)
        for ph in range(ph_n):
            for pw in range(pw_n):
                acc = np.zeros(c)
                for iy in range(gh):
                    yy = sh + t(ph) * bh + t(iy + 0.5) * bh / t(gh)
                    for ix in range(gw):
                        xx = sw + t(pw) * bw + t(ix + 0.5) * bw / t(gw)
                        acc += _bilinear(img, yy * cos - xx * sin + ch, yy * sin + xx * cos + cw)
                out[k, :, ph, pw] = acc / max(gh * gw, 1)
    return out.astype(input.dtype)
