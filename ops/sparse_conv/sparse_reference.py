"""Plain references for the sparse convolution family, shared by its tests: the rulebook as mmcv's
CPU kernel (csrc/common/utils/spconv/spconv/geometry.h, indice.h) builds it, loop for loop (C's
truncating division, its counters, a dict for its grid), the convolution and max pooling as loops
over the pairs, and random sets of distinct sites."""

import math

import numpy as np
import torch


def tdiv(a, b):
    """C's integer division (towards zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def output_shape(spatial_shape, kernel_size, stride, padding, dilation, output_padding, subm, transposed):
    """mmcv's get_conv_output_size / get_deconv_output_size (sparse_ops.py)."""
    if subm:
        return list(spatial_shape)
    if transposed:
        return [(i - 1) * s - 2 * p + k + o for i, k, s, p, o in
                zip(spatial_shape, kernel_size, stride, padding, output_padding)]
    return [(i + 2 * p - d * (k - 1) - 1) // s + 1 for i, k, s, p, d in
            zip(spatial_shape, kernel_size, stride, padding, dilation)]


def _reached(pos, ks, st, pd, dl, out_shape, transposed):
    """mmcv's getValidOutPos / getValidOutPosTranspose: (site, kernel offset) in its order."""
    n = len(pos)
    if transposed:
        lowers = [pos[i] * st[i] - pd[i] for i in range(n)]
        uppers = [lowers[i] + (ks[i] - 1) * dl[i] for i in range(n)]
    else:
        lowers = [tdiv(pos[i] - (ks[i] - 1) * dl[i] - 1 + st[i] + pd[i], st[i]) for i in range(n)]
        uppers = [tdiv(pos[i] + pd[i], st[i]) for i in range(n)]
    sizes = [tdiv(uppers[i] - lowers[i], dl[i]) + 1 for i in range(n)]
    counter = [0] * n
    found = []
    for _ in range(math.prod(sizes)):
        valid, m, offset, val = True, 1, 0, [0] * n
        for j in range(n - 1, -1, -1):
            val[j] = uppers[j] - counter[j] * dl[j]
            valid = valid and 0 <= val[j] <= out_shape[j] - 1
            step = val[j] - lowers[j] if transposed else pos[j] - val[j] * st[j] + pd[j]
            offset += tdiv(m * step, dl[j])
            m *= ks[j]
        if valid:
            found.append((tuple(val), offset))
        counter[n - 1] += 1
        for c in range(n - 1, 0, -1):
            if counter[c] == sizes[c]:
                counter[c - 1] += 1
                counter[c] = 0
    return found


def rulebook(indices, spatial_shape=(), kernel_size=(), stride=(), padding=(), dilation=(), output_padding=(),
             batch_size=-1, subm=False, transposed=False):
    """(out_indices, indice_pairs, indice_pair_num) as mmcv's CPU kernel fills them."""
    idx = np.asarray(indices).astype(np.int64).reshape(-1, np.asarray(indices).shape[1])
    d = idx.shape[1] - 1
    ks = list(kernel_size)
    st, pd = list(stride) or [1] * d, list(padding) or [0] * d
    dl, op = list(dilation) or [1] * d, list(output_padding) or [0] * d
    out_shape = output_shape(spatial_shape, ks, st, pd, dl, op, subm, transposed)
    if subm:  # mmcv's launcher: stride 1, padding kernel_size // 2
        st, pd = [1] * d, [k // 2 for k in ks]
    kv, n = math.prod(ks), len(idx)
    pairs = np.full((kv, 2, n), -1, np.int32)
    num = np.zeros(kv, np.int32)
    grid = {}

    def add(offset, j, o):
        pairs[offset, 0, num[offset]] = j
        pairs[offset, 1, num[offset]] = o
        num[offset] += 1

    if subm:
        for j, row in enumerate(idx):
            grid[tuple(row)] = j
        for j, row in enumerate(idx):
            for val, offset in _reached(list(row[1:]), ks, st, pd, dl, out_shape, False):
                if (row[0], *val) in grid:
                    add(offset, j, grid[(row[0], *val)])
        return idx.astype(np.int32), pairs, num
    outs = []
    for j, row in enumerate(idx):
        for val, offset in _reached(list(row[1:]), ks, st, pd, dl, out_shape, transposed):
            key = (row[0], *val)
            if key not in grid:
                grid[key] = len(outs)
                outs.append(key)
            add(offset, j, grid[key])
    return np.array(outs, np.int32).reshape(-1, d + 1), pairs, num


def _sides(pairs, num, k, inverse):
    a, b = pairs[k, 0, :num[k]].astype(np.int64), pairs[k, 1, :num[k]].astype(np.int64)
    return (b, a) if inverse else (a, b)


def conv(features, filters, indice_pairs, indice_pair_num, out_indices, inverse=False):
    """output[o] += features[i] @ filters[k] over every pair (i, o) of offset k, in float64."""
    cin, cout = filters.shape[-2:]
    w = filters.reshape(-1, cin, cout).astype(np.float64)
    out = np.zeros((len(out_indices), cout))
    for k in range(len(w)):
        src, dst = _sides(indice_pairs, indice_pair_num, k, inverse)
        np.add.at(out, dst, features[src].astype(np.float64) @ w[k])
    return out.astype(features.dtype)


def conv_backward(grad_output, features, filters, indice_pairs, indice_pair_num, inverse=False):
    cin, cout = filters.shape[-2:]
    w = filters.reshape(-1, cin, cout).astype(np.float64)
    g, x = grad_output.astype(np.float64), features.astype(np.float64)
    gx, gw = np.zeros(x.shape), np.zeros(w.shape)
    for k in range(len(w)):
        src, dst = _sides(indice_pairs, indice_pair_num, k, inverse)
        np.add.at(gx, src, g[dst] @ w[k].T)
        gw[k] = x[src].T @ g[dst]
    return gx.astype(features.dtype), gw.reshape(filters.shape).astype(filters.dtype)


def maxpool(features, indice_pairs, indice_pair_num, out_indices):
    """The maximum of 0 and the inputs of each output (mmcv starts at 0; `out < x` never takes NaN)."""
    out = np.zeros((len(out_indices), features.shape[1]), features.dtype)
    for k in range(len(indice_pairs)):
        src, dst = _sides(indice_pairs, indice_pair_num, k, False)
        cur = out[dst]
        out[dst] = np.where(cur < features[src], features[src], cur)
    return out


def maxpool_backward(grad_output, features, output, indice_pairs, indice_pair_num):
    gx = np.zeros(features.shape, features.dtype)
    for k in range(len(indice_pairs)):
        src, dst = _sides(indice_pairs, indice_pair_num, k, False)
        gx[src] += np.where(output[dst] == features[src], grad_output[dst], 0).astype(features.dtype)
    return gx


def sites(n, spatial_shape, batch=1, seed=0):
    """n distinct sites (batch index first) of a batch of grids, in random order, as int32."""
    g = np.random.default_rng(seed)
    volume = math.prod(spatial_shape)
    linear = g.choice(batch * volume, size=n, replace=False)
    coords = np.stack(np.unravel_index(linear, (batch, *spatial_shape)), axis=1)
    return torch.from_numpy(coords.astype(np.int32))


def clustered_sites(n, spatial_shape, batch=1, seed=0):
    """n distinct sites near a few surfaces (as a LiDAR sweep's voxels lie), in random order."""
    g = np.random.default_rng(seed)
    found = set()
    while len(found) < n:
        centre = g.integers(0, spatial_shape)
        b = int(g.integers(0, batch))
        for p in centre + np.round(g.normal(0, 3, size=(64, len(spatial_shape)))).astype(np.int64):
            if all(0 <= p[a] < spatial_shape[a] for a in range(len(spatial_shape))):
                found.add((b, *p.tolist()))
    rows = sorted(found)[:n]
    g.shuffle(rows)
    return torch.tensor(rows, dtype=torch.int32).reshape(-1, len(spatial_shape) + 1)
