"""numpy loops written from the documented semantics of roi_align, roi_pool and ps_roi_align
(docs/ops/roi_align.md): one sample at a time, in the input's dtype, with the forward's gradient
taken by the chain rule through the same loops."""

import math

import numpy as np


def _tap(v, size, dt):
    """(lo, hi, w_lo, w_hi) of position v along an axis, or None when it samples nothing."""
    if size == 0 or v < -1 or v > size:
        return None
    v = max(v, dt(0))
    lo = int(v)
    if lo >= size - 1:
        lo = hi = size - 1
        v = dt(lo)
    else:
        hi = lo + 1
    l = dt(v - dt(lo))
    return lo, hi, dt(1) - l, l


def _corners(y, x, h, w, dt):
    """The (row, col, weight) neighbours of one bilinear sample (empty outside the image)."""
    ty, tx = _tap(y, h, dt), _tap(x, w, dt)
    if ty is None or tx is None:
        return []
    return [(ty[0], tx[0], ty[2] * tx[2]), (ty[0], tx[1], ty[2] * tx[3]),
            (ty[1], tx[0], ty[3] * tx[2]), (ty[1], tx[1], ty[3] * tx[3])]


def _bins(roi, scale, oh, ow, sampling_ratio, aligned, legacy, dt):
    off = dt(0.5) if aligned else dt(0)
    sw, sh = roi[1] * scale - off, roi[2] * scale - off
    rw, rh = (roi[3] * scale - off) - sw, (roi[4] * scale - off) - sh
    if legacy:
        rw, rh = max(rw, dt(1)), max(rh, dt(1))
    bh, bw = dt(rh / dt(oh)), dt(rw / dt(ow))
    gh = sampling_ratio if sampling_ratio > 0 else int(math.ceil(bh))
    gw = sampling_ratio if sampling_ratio > 0 else int(math.ceil(bw))

    def samples(ph, pw):  # the bin's sample positions, row by row
        return [(dt(sh + dt(ph) * bh + dt(iy + .5) * bh / dt(gh)), dt(sw + dt(pw) * bw + dt(ix + .5) * bw / dt(gw)))
                for iy in range(gh) for ix in range(gw)]

    return samples, gh * gw


def _align_terms(input, rois, output_size, spatial_scale, sampling_ratio, aligned, legacy, count_floor):
    """Per (k, ph, pw): the batch index, the divisor and each sample's corner list."""
    dt = input.dtype.type
    h, w = input.shape[2:]
    scale = dt(np.float32(spatial_scale))
    for k, roi in enumerate(rois):
        samples, count = _bins(roi, scale, *output_size, sampling_ratio, aligned, legacy, dt)
        count = max(count, 1) if count_floor else count
        for ph in range(output_size[0]):
            for pw in range(output_size[1]):
                yield k, int(roi[0]), ph, pw, dt(count), [_corners(y, x, h, w, dt) for y, x in samples(ph, pw)]


def _value(plane, corners, dt):
    v = dt(0)
    for r, c, wt in corners:
        v = dt(v + wt * plane[r, c])
    return v


def roi_align(input, rois, output_size=(1, 1), spatial_scale=1.0, sampling_ratio=0, pool_mode="avg", aligned=True,
              grad_output=None):
    """The output, or with grad_output the gradient of <output, grad_output> with respect to input."""
    dt = input.dtype.type
    k, c = rois.shape[0], input.shape[1]
    out = np.zeros((k, c) + tuple(output_size), input.dtype)
    grad = np.zeros_like(input)
    for n, b, ph, pw, count, samples in _align_terms(input, rois, output_size, spatial_scale, sampling_ratio,
                                                     aligned, not aligned, True):
        for ch in range(c):
            plane, g = input[b, ch], None if grad_output is None else grad_output[n, ch, ph, pw]
            if pool_mode == "avg":
                acc = dt(0)
                for corners in samples:
                    acc = dt(acc + _value(plane, corners, dt))
                    for r, col, wt in corners if g is not None else ():
                        grad[b, ch, r, col] += g * wt / count
                out[n, ch, ph, pw] = acc / count
                continue
            best, at = dt(-10000), None  # the first strict maximum wins
            for corners in samples:
                v = _value(plane, corners, dt)
                if v > best:
                    best, at = v, corners
            out[n, ch, ph, pw] = best
            for r, col, wt in at if at is not None and g is not None else ():
                grad[b, ch, r, col] += g * wt
    return out if grad_output is None else grad


def ps_roi_align(input, rois, output_size=(1, 1), spatial_scale=1.0, sampling_ratio=0, grad_output=None):
    dt = input.dtype.type
    oh, ow = output_size
    k, c_out = rois.shape[0], input.shape[1] // (oh * ow)
    out = np.zeros((k, c_out, oh, ow), input.dtype)
    mapping = np.zeros((k, c_out, oh, ow), np.int32)
    grad = np.zeros_like(input)
    with np.errstate(divide="ignore", invalid="ignore"):
        for n, b, ph, pw, count, samples in _align_terms(input, rois, output_size, spatial_scale, sampling_ratio,
                                                         True, False, False):
            for co in range(c_out):
                ci = (co * oh + ph) * ow + pw
                acc = dt(0)
                for corners in samples:
                    acc = dt(acc + _value(input[b, ci], corners, dt))
                    for r, col, wt in corners if grad_output is not None else ():
                        grad[b, ci, r, col] += grad_output[n, co, ph, pw] * wt / count
                out[n, co, ph, pw], mapping[n, co, ph, pw] = acc / count, ci
    return (out, mapping) if grad_output is None else grad


def _pool_bins(roi, scale, oh, ow, h, w, round_rois, dt):
    """Per (ph, pw): the half-open rows and columns of the bin, clamped to the image."""
    def clamp(v, size):
        return min(max(int(v), 0), size)

    if round_rois:
        # C's round(): halves away from zero
        x1, y1, x2, y2 = (int(math.copysign(math.floor(abs(float(dt(v * scale))) + 0.5), float(v))) for v in roi[1:])
        bh, bw = dt(max(y2 - y1 + 1, 1)) / dt(oh), dt(max(x2 - x1 + 1, 1)) / dt(ow)
        rows = [(clamp(math.floor(dt(ph) * bh) + y1, h), clamp(math.ceil(dt(ph + 1) * bh) + y1, h)) for ph in range(oh)]
        cols = [(clamp(math.floor(dt(pw) * bw) + x1, w), clamp(math.ceil(dt(pw + 1) * bw) + x1, w)) for pw in range(ow)]
        return rows, cols
    x1, y1 = roi[1] * scale, roi[2] * scale
    rw, rh = (roi[3] + dt(1)) * scale - x1, (roi[4] + dt(1)) * scale - y1
    if rw <= 0 or rh <= 0:
        return [(0, 0)] * oh, [(0, 0)] * ow
    bh, bw = rh / dt(oh), rw / dt(ow)
    rows = [(clamp(math.floor(dt(ph) * bh + y1), h), clamp(math.ceil(dt(ph + 1) * bh + y1), h)) for ph in range(oh)]
    cols = [(clamp(math.floor(dt(pw) * bw + x1), w), clamp(math.ceil(dt(pw + 1) * bw + x1), w)) for pw in range(ow)]
    return rows, cols


def roi_pool(input, rois, output_size=(1, 1), spatial_scale=1.0, round_rois=True):
    dt = input.dtype.type
    k, c, h, w = rois.shape[0], *input.shape[1:]
    out = np.zeros((k, c) + tuple(output_size), input.dtype)
    arg = np.full((k, c) + tuple(output_size), -1, np.int32)
    for n, roi in enumerate(rois):
        rows, cols = _pool_bins(roi, dt(np.float32(spatial_scale)), *output_size, h, w, round_rois, dt)
        for ph, (y0, y1) in enumerate(rows):
            for pw, (x0, x1) in enumerate(cols):
                for ch in range(c):
                    best = dt(0) if y1 <= y0 or x1 <= x0 else -dt(np.finfo(np.float32).max)
                    for y in range(y0, y1):
                        for x in range(x0, x1):
                            if input[int(roi[0]), ch, y, x] > best:
                                best, arg[n, ch, ph, pw] = input[int(roi[0]), ch, y, x], y * w + x
                    out[n, ch, ph, pw] = best
    return out, arg


def roi_pool_grad(input, rois, argmax, grad_output):
    grad = np.zeros_like(input)
    w = input.shape[3]
    for idx in np.ndindex(*argmax.shape):
        if argmax[idx] >= 0:
            grad[int(rois[idx[0], 0]), idx[1], argmax[idx] // w, argmax[idx] % w] += grad_output[idx]
    return grad
