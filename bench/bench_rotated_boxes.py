"""The rotated-box ops (box_iou_rotated, nms_rotated, roi_align_rotated) against straightforward
vectorised PyTorch references of the same semantics, eager, float32, on 1 and 2 threads.

References (checked against the op before timing):
    box_iou_rotated: every pair at once. The intersection polygon's candidate vertices (each box's
        corners inside the other, and the 16 edge crossings: 24 per pair, with validity masks),
        sorted by angle about their mean, invalid ones replaced by the first valid one, and the
        shoelace formula; pairs whose circumscribed circles are apart skip the polygon.
    nms_rotated: greedy suppression with one vectorised step per kept box: that pair IoU of the
        box with every box still standing (`remaining = rest[iou(i, rest) < t]`).
    roi_align_rotated: every sample position of every bin at once, mmcv's clamping as masks, the
        four corners gathered from the (N*H*W, C) feature rows, in chunks of RoIs.
Scenes: detector-like boxes, clustered around objects of a 1024 x 1024 image.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from common import Row, interleaved, on_torch_threads, progress

SUBJECT = "opbridge"


def _corners(b):
    """(P, 5) clockwise boxes -> (P, 4, 2) corners (mmcv's order)."""
    c, s = torch.cos(b[:, 4]), torch.sin(b[:, 4])
    u = torch.stack([c, s], -1) * (b[:, 2:3] / 2)
    v = torch.stack([-s, c], -1) * (b[:, 3:4] / 2)
    ctr = b[:, None, :2]
    return ctr + torch.stack([-u - v, u - v, u + v, -u + v], 1)


def _inside(p, q):
    """Whether points p (P, K, 2) lie in rectangles q (P, 4, 2)."""
    a, ab, ad = q[:, None, 0], (q[:, 1] - q[:, 0])[:, None], (q[:, 3] - q[:, 0])[:, None]
    ap = p - a
    u, v = (ap * ab).sum(-1), (ap * ad).sum(-1)
    eps = 1e-6
    return (u >= -eps) & (u <= (ab * ab).sum(-1) + eps) & (v >= -eps) & (v <= (ad * ad).sum(-1) + eps)


def pair_iou(b1, b2):
    """IoU of the rows of b1 and b2 (P, 5), vectorised; coordinates relative to each pair's midpoint."""
    mid = (b1[:, :2] + b2[:, :2]) / 2
    b1 = torch.cat([b1[:, :2] - mid, b1[:, 2:]], 1)
    b2 = torch.cat([b2[:, :2] - mid, b2[:, 2:]], 1)
    q1, q2 = _corners(b1), _corners(b2)
    d1, d2 = q1.roll(-1, 1) - q1, q2.roll(-1, 1) - q2  # (P, 4, 2) edges
    p, r = q1[:, :, None], d1[:, :, None]
    qq, s = q2[:, None], d2[:, None]
    den = r[..., 0] * s[..., 1] - r[..., 1] * s[..., 0]
    qp = qq - p
    safe = torch.where(den.abs() > 1e-12, den, torch.ones_like(den))
    t = (qp[..., 0] * s[..., 1] - qp[..., 1] * s[..., 0]) / safe
    w = (qp[..., 0] * r[..., 1] - qp[..., 1] * r[..., 0]) / safe
    cross_ok = (den.abs() > 1e-12) & (t >= 0) & (t <= 1) & (w >= 0) & (w <= 1)
    crossings = (p + t[..., None] * r).reshape(-1, 16, 2)
    pts = torch.cat([q1, q2, crossings], 1)
    valid = torch.cat([_inside(q1, q2), _inside(q2, q1), cross_ok.reshape(-1, 16)], 1)
    count = valid.sum(1, keepdim=True).clamp(min=1)
    centre = (pts * valid[..., None]).sum(1) / count
    ang = torch.atan2(pts[..., 1] - centre[:, None, 1], pts[..., 0] - centre[:, None, 0])
    ang = torch.where(valid, ang, torch.full_like(ang, 10.0))
    order = ang.argsort(1)
    pts = pts.gather(1, order[..., None].expand(-1, -1, 2))
    valid = valid.gather(1, order)
    pts = torch.where(valid[..., None], pts, pts[:, :1])
    nxt = pts.roll(-1, 1)
    inter = ((pts[..., 0] * nxt[..., 1] - pts[..., 1] * nxt[..., 0]).sum(1) / 2).abs()
    inter = torch.where(valid.sum(1) >= 3, inter, torch.zeros_like(inter))
    a1, a2 = b1[:, 2] * b1[:, 3], b2[:, 2] * b2[:, 3]
    return inter / (a1 + a2 - inter)


def iou_matrix(b1, b2, chunk=1 << 17):
    """(N, M) IoU by pair_iou over the pairs whose circumscribed circles meet."""
    r1, r2 = b1[:, 2:4].norm(dim=1) / 2, b2[:, 2:4].norm(dim=1) / 2
    near = torch.cdist(b1[:, :2], b2[:, :2]) <= (r1[:, None] + r2[None, :]) * (1 + 1e-6)
    i, j = near.nonzero(as_tuple=True)
    out = torch.zeros(len(b1), len(b2), dtype=b1.dtype)
    vals = torch.cat([pair_iou(b1[i[k:k + chunk]], b2[j[k:k + chunk]]) for k in range(0, len(i), chunk)]
                     or [torch.zeros(0, dtype=b1.dtype)])
    out[i, j] = vals
    return out


def nms_reference(dets, scores, threshold):
    """Greedy NMS, one vectorised step per kept box: its IoU with every box still standing."""
    order = scores.argsort(descending=True, stable=True)
    boxes = dets[order]
    remaining = torch.arange(len(dets))
    keep = []
    while len(remaining):
        i, rest = remaining[0], remaining[1:]
        keep.append(i)
        remaining = rest[pair_iou(boxes[i].expand(len(rest), 5), boxes[rest]) < threshold]
    return order[torch.stack(keep)] if keep else order[:0]


def roi_align_reference(x, rois, ph, pw, scale, ratio, aligned, clockwise, chunk=128):
    """mmcv's RoIAlignRotated with a fixed sampling_ratio, vectorised over RoIs, bins and samples."""
    n, c, h, w = x.shape
    rows = x.permute(0, 2, 3, 1).reshape(-1, c)
    outs = []
    for k in range(0, len(rois), chunk):
        r = rois[k:k + chunk]
        off = 0.5 if aligned else 0.0
        cw_, ch_ = r[:, 1] * scale - off, r[:, 2] * scale - off
        rw, rh = r[:, 3] * scale, r[:, 4] * scale
        if not aligned:
            rw, rh = rw.clamp(min=1), rh.clamp(min=1)
        th = -r[:, 5] if clockwise else r[:, 5]
        iy = (torch.arange(ph)[:, None] + (torch.arange(ratio)[None, :] + 0.5) / ratio).reshape(-1)  # (ph*ratio)
        ix = (torch.arange(pw)[:, None] + (torch.arange(ratio)[None, :] + 0.5) / ratio).reshape(-1)
        yy = -rh[:, None] / 2 + iy[None, :] * (rh / ph)[:, None]  # (K, ph*ratio)
        xx = -rw[:, None] / 2 + ix[None, :] * (rw / pw)[:, None]
        cos, sin = torch.cos(th)[:, None, None], torch.sin(th)[:, None, None]
        y = yy[:, :, None] * cos - xx[:, None, :] * sin + ch_[:, None, None]  # (K, ph*ratio, pw*ratio)
        xp = yy[:, :, None] * sin + xx[:, None, :] * cos + cw_[:, None, None]
        ok = (y >= -1) & (y <= h) & (xp >= -1) & (xp <= w)
        y, xp = y.clamp(min=0), xp.clamp(min=0)
        y0, x0 = y.floor().long().clamp(max=h - 1), xp.floor().long().clamp(max=w - 1)
        y = torch.where(y0 >= h - 1, y0.to(y.dtype), y)
        xp = torch.where(x0 >= w - 1, x0.to(xp.dtype), xp)
        y1, x1 = (y0 + 1).clamp(max=h - 1), (x0 + 1).clamp(max=w - 1)
        ly, lx = y - y0, xp - x0
        base = (r[:, 0].long() * h * w)[:, None, None]
        acc = 0
        for yi, xi, wt in ((y0, x0, (1 - ly) * (1 - lx)), (y0, x1, (1 - ly) * lx), (y1, x0, ly * (1 - lx)),
                           (y1, x1, ly * lx)):
            acc = acc + rows[(base + yi * w + xi).reshape(-1)].view(*yi.shape, c) * (wt * ok)[..., None]
        kk = len(r)
        outs.append(acc.view(kk, ph, ratio, pw, ratio, c).mean(dim=(2, 4)).permute(0, 3, 1, 2))
    return torch.cat(outs)


def scene(n, seed, objects=None):
    """n detector-like rotated boxes: jittered copies of `objects` boxes in a 1024 x 1024 image."""
    g = torch.Generator().manual_seed(seed)
    objects = objects or max(1, n // 50)
    base = torch.cat([torch.rand(objects, 2, generator=g) * 1024, 20 + torch.rand(objects, 2, generator=g) * 60,
                      (torch.rand(objects, 1, generator=g) - 0.5) * math.pi], 1)
    pick = torch.randint(0, objects, (n,), generator=g)
    jitter = torch.cat([torch.randn(n, 2, generator=g) * 6, torch.randn(n, 2, generator=g) * 4,
                        torch.randn(n, 1, generator=g) * 0.1], 1)
    boxes = base[pick] + jitter
    boxes[:, 2:4] = boxes[:, 2:4].clamp(min=4)
    return boxes, torch.rand(n, generator=g)


def _case(threads: int, quick: bool) -> list[Row]:
    ops = torch.ops.opbridge
    rounds = 3 if quick else 11
    rows = []
    tail = f"float32, {threads} thread{'s' if threads > 1 else ''}"
    with torch.no_grad():
        for n in ((1000,) if quick else (1000, 3000)):
            a, _ = scene(n, 1)
            b, _ = scene(n, 2)
            want = iou_matrix(a, b)
            np.testing.assert_allclose(ops.box_iou_rotated(a, b).numpy(), want.numpy(), atol=2e-4)
            name = f"box_iou_rotated {n} x {n} boxes {tail}"
            progress(name)
            rows += interleaved(name, {SUBJECT + " box_iou_rotated": on_torch_threads(threads, lambda: ops.box_iou_rotated(a, b)),
                                       "torch vectorised polygon IoU": on_torch_threads(threads, lambda: iou_matrix(a, b))},
                                rounds=rounds, max_seconds=90)
        for n in ((1000,) if quick else (1000, 5000)):
            dets, s = scene(n, 3)
            keep = ops.nms_rotated(dets, s, iou_threshold=0.1)[1]
            want = nms_reference(dets, s, 0.1)
            assert torch.equal(keep, want), "nms_rotated and its reference disagree"
            name = f"nms_rotated {n} boxes ({len(keep)} kept), iou_threshold 0.1, {tail}"
            progress(name)
            rows += interleaved(name, {SUBJECT + " nms_rotated": on_torch_threads(threads, lambda: ops.nms_rotated(dets, s, iou_threshold=0.1)),
                                       "torch vectorised IoU + greedy steps": on_torch_threads(threads, lambda: nms_reference(dets, s, 0.1))},
                                rounds=rounds, max_seconds=90)
        g = torch.Generator().manual_seed(4)
        x = torch.randn(2, 256, 64, 64, generator=g)
        boxes, _ = scene(1000, 5)
        rois = torch.cat([torch.randint(0, 2, (1000, 1), generator=g).float(), boxes], 1)
        args = (x, rois, [7, 7], 1 / 16, 2, True, True)
        np.testing.assert_allclose(ops.roi_align_rotated(*args).numpy(),
                                   roi_align_reference(x, rois, 7, 7, 1 / 16, 2, True, True).numpy(), atol=1e-4)
        name = f"roi_align_rotated 2x256x64x64 (stride 16), 1000 RoIs, 7x7, sampling_ratio 2, {tail}"
        progress(name)
        rows += interleaved(name, {SUBJECT + " roi_align_rotated": on_torch_threads(threads, lambda: ops.roi_align_rotated(*args)),
                                   "torch vectorised gather": on_torch_threads(threads, lambda: roi_align_reference(x, rois, 7, 7, 1 / 16, 2, True, True))},
                            rounds=rounds, max_seconds=90)
    return rows


def run(quick: bool) -> list[Row]:
    import opbridge

    opbridge.load_torch()
    threads = torch.get_num_threads()
    try:
        return _case(1, quick) if quick else _case(1, quick) + _case(2, quick)
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    import sys

    for row in run("--quick" in sys.argv):
        spread = row.ratio_spread
        print(f"{row.benchmark} | {row.impl} | {row.median_ms:.2f} ms | "
              f"{'' if spread is None else f'{spread[0]:.2f} ({spread[1]:.2f}-{spread[2]:.2f})'}")
