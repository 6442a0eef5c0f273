"""ball_query: pointnet2_ops' ball query against a numpy scan over every point (squared distance
below radius², in float32 for float32 and the 16-bit types; the first nsample hits by index; the
first hit repeated into the slots left; an empty ball all zeros; with min_radius, mmcv's shell).
ball_query_offset: pointops' offset-layout ball query against a numpy scan that follows its kernel
step by step (candidates by index, its heap-sort pass, every sep-th when they overflow the slots)."""

import numpy as np
import pytest
import torch

from opbridge.testing import BadInput, OpCase, OpTest, Sample, random_tensor as r

ball_query = torch.ops.opbridge.ball_query


def reference(xyz, new_xyz, radius, nsample, min_radius=0.0):
    c = np.float64 if xyz.dtype == np.float64 else np.float32
    p, q = xyz.astype(c), new_xyz.astype(c)
    rr = np.float32(radius).astype(c)  # float attributes are float32
    r2 = rr * rr
    lo = np.float32(min_radius).astype(c)
    lo2 = lo * lo
    b, m = q.shape[0], q.shape[1]
    out = np.zeros((b, m, nsample), np.int32)
    for i in range(b):
        for j in range(m):
            d = (q[i, j, 0] - p[i, :, 0]) ** 2 + (q[i, j, 1] - p[i, :, 1]) ** 2 + (q[i, j, 2] - p[i, :, 2]) ** 2
            inside = (d < r2) if lo2 == 0 else (d == 0) | ((d >= lo2) & (d < r2))  # mmcv's shell
            hits = np.nonzero(inside)[0][:nsample]
            if len(hits):
                out[i, j, :len(hits)] = hits
                out[i, j, len(hits):] = hits[0]
    return out


def grid(n, seed, step=0.5, dtype="float32"):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, (n, 3), generator=g).to(getattr(torch, dtype)) * step


class TestBallQuery(OpTest):
    case = OpCase(
        "ball_query",
        reference=reference,
        samples=[
            Sample((r([2, 300, 3], seed=1), r([2, 40, 3], seed=2)), {"radius": 0.6, "nsample": 8}, name="float32",
                   dynamic={0: [0], 1: [0]}),
            Sample((r([1, 500, 3], "float64", seed=3), r([1, 30, 3], "float64", seed=4)), {"radius": 1.1, "nsample": 32},
                   name="float64_nsample_32"),
            # Points on a grid, radius exactly one step: points at that distance are outside
            # (strict <), and many centres sit on points.
            Sample((grid(400, 5).reshape(2, 200, 3), grid(60, 6).reshape(2, 30, 3)), {"radius": 0.5, "nsample": 16},
                   name="grid_boundary"),
            Sample((r([1, 200, 3], seed=7), r([1, 20, 3], seed=8)), {"radius": 1e-4, "nsample": 4}, name="empty_balls"),
            Sample((r([1, 100, 3], seed=9), r([1, 10, 3], seed=10)), {"radius": 100.0, "nsample": 16},
                   name="every_point_in_every_ball"),
            Sample((r([1, 50, 3], seed=11), r([1, 10, 3], seed=12, low=20, high=30)), {"radius": 1.0, "nsample": 3},
                   name="centres_far_away"),
            Sample((r([2, 80, 3], "float16", seed=13), r([2, 12, 3], "float16", seed=14)), {"radius": 0.8, "nsample": 6},
                   name="float16"),
            Sample((r([1, 0, 3]), r([1, 5, 3], seed=15)), {"radius": 1.0, "nsample": 2}, name="no_points"),
            Sample((r([3, 20, 3], seed=16), r([3, 0, 3])), {"radius": 1.0, "nsample": 2}, name="no_centres"),
            Sample((r([1, 30, 3], seed=17), r([1, 5, 3], seed=18)), {"radius": -1.0, "nsample": 2},
                   name="negative_radius"),
            # A shell (mmcv's min_radius): points closer than min_radius are left out, those on the
            # centre (distance 0) kept; on the grid, points at exactly min_radius are in.
            Sample((r([2, 300, 3], seed=19), r([2, 40, 3], seed=20)), {"radius": 0.6, "nsample": 8, "min_radius": 0.3},
                   name="shell", dynamic={0: [0], 1: [0]}),
            Sample((grid(400, 21).reshape(2, 200, 3), grid(60, 22).reshape(2, 30, 3)),
                   {"radius": 1.0, "nsample": 24, "min_radius": 0.5}, name="shell_grid_boundary"),
            Sample((r([1, 300, 3], "float64", seed=23), r([1, 20, 3], "float64", seed=24)),
                   {"radius": 1.2, "nsample": 40, "min_radius": 0.7}, name="shell_float64"),
        ],
        bad_inputs=[
            BadInput((r([2, 5, 3]), r([3, 4, 3])), {"radius": 1.0, "nsample": 2},
                     "new_xyz must have the batch size of xyz", "batch_sizes"),
            BadInput((r([2, 5, 2]), r([2, 4, 3])), {"radius": 1.0, "nsample": 2}, r"xyz must be \(B, N, 3\)",
                     "two_coordinates"),
            BadInput((r([2, 5, 3]), r([2, 4, 3])), {"radius": 1.0, "nsample": 0}, "nsample must be >= 1, got 0",
                     "nsample_zero"),
            BadInput((torch.tensor([[[0.0, 0.0, float("inf")]]]), r([1, 4, 3])), {"radius": 1.0, "nsample": 2},
                     r"xyz has a coordinate that is not finite \(inf at row 0\)", "infinite_point"),
            BadInput((r([2, 5, 3]), r([2, 4, 3])), {"radius": 0.5, "nsample": 2, "min_radius": 0.5},
                     r"min_radius \(0.5\) must be below radius \(0.5\)", "empty_shell"),
            BadInput((r([2, 5, 3]), r([2, 4, 3])), {"radius": 0.5, "nsample": 2, "min_radius": -0.1},
                     "min_radius must be >= 0", "negative_min_radius"),
        ],
        resize=lambda s, n: Sample((r([n, 300, 3], seed=n), r([n, 40, 3], seed=n + 1)), s.attrs),
    )


@pytest.mark.parametrize("radius", [0.05, 0.3, 2.0])
def test_a_large_cloud_matches_the_scan(radius):
    # Many points per cell, cells wider than the radius on a sparse cloud, and the 27-cell search.
    torch.set_num_threads(2)
    xyz, centres = r([1, 20000, 3], seed=21, low=-1, high=1), r([1, 300, 3], seed=22, low=-1.2, high=1.2)
    got = ball_query(xyz, centres, radius=radius, nsample=24)
    np.testing.assert_array_equal(got.numpy(), reference(xyz.numpy(), centres.numpy(), radius, 24))


def test_coordinates_far_from_the_radius_scale():
    # Coordinates around 1e4 with a radius of 0.01: cell indices and distances round, and the
    # margins keep every point that the scan finds.
    base = torch.full((1, 1, 3), 1e4)
    xyz = base + r([1, 3000, 3], seed=23, low=-0.05, high=0.05)
    centres = base + r([1, 50, 3], seed=24, low=-0.05, high=0.05)
    got = ball_query(xyz, centres, radius=0.01, nsample=8)
    np.testing.assert_array_equal(got.numpy(), reference(xyz.numpy(), centres.numpy(), 0.01, 8))


# ---- ball_query_offset ----------------------------------------------------------------------------


def pointops_order(d, idx):
    """pointops' candidate order: heap sort's extraction loop run on an array that was never made
    a heap (swap the first and the last, then sift the first down by the larger child)."""
    d, idx = list(d), list(idx)
    for last in range(len(d) - 1, 0, -1):
        d[0], d[last], idx[0], idx[last] = d[last], d[0], idx[last], idx[0]
        root, child = 0, 1
        while child < last:
            if child + 1 < last and d[child + 1] > d[child]:
                child += 1
            if d[root] > d[child]:
                break
            d[root], d[child], idx[root], idx[child] = d[child], d[root], idx[child], idx[root]
            root, child = child, 2 * child + 1
    return d, idx


def offset_reference(xyz, offset, new_xyz=None, new_offset=None, nsample=1, max_radius=1.0, min_radius=0.0):
    if new_xyz is None:
        new_xyz, new_offset = xyz, offset
    c = np.float64 if xyz.dtype == np.float64 else np.float32
    p, q = xyz.astype(c), new_xyz.astype(c)
    hi, lo = np.float32(max_radius).astype(c), np.float32(min_radius).astype(c)
    max2, min2 = hi * hi, lo * lo
    pb, qb = np.concatenate([[0], offset]), np.concatenate([[0], new_offset])
    idx = np.full((len(q), nsample), -1, np.int32)
    dist = np.full((len(q), nsample), 1e5, c)
    for s in range(len(offset)):
        for t in range(qb[s], qb[s + 1]):
            d = p[pb[s]:pb[s + 1]] - q[t]
            d2 = (d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1]) + d[:, 2] * d[:, 2]
            keep = np.nonzero((d2.astype(np.float64) <= 1e-5) | ((d2 >= min2) & (d2 < max2)))[0]
            cd, ci = pointops_order(d2[keep], keep + pb[s])
            if len(cd) <= nsample:
                idx[t, :len(cd)], dist[t, :len(cd)] = ci, np.sqrt(np.array(cd, c))
            else:
                sep = np.float32(len(cd)) / np.float32(nsample)
                for k in range(nsample):
                    at = int(sep * np.float32(k))
                    idx[t, k], dist[t, k] = ci[at], np.sqrt(cd[at])
    with np.errstate(over="ignore"):  # float16: the padding's 1e5 is +inf
        return idx, dist.astype(xyz.dtype)


def off(*ends, dtype=torch.int32):
    return torch.tensor(ends, dtype=dtype)


class TestBallQueryOffset(OpTest):
    case = OpCase(
        "ball_query_offset",
        reference=offset_reference,
        samples=[
            Sample((r([300, 3], seed=31), off(120, 300), r([50, 3], seed=32), off(20, 50)),
                   {"nsample": 16, "max_radius": 0.5}, name="float32"),
            # Balls that hold more points than slots: every sep-th of pointops' order.
            Sample((r([400, 3], seed=33), off(400), r([20, 3], seed=34), off(20)),
                   {"nsample": 12, "max_radius": 1.5, "min_radius": 0.2}, name="subsampled_shell"),
            Sample((r([200, 3], "float64", seed=35), off(90, 200, dtype=torch.int64)),
                   {"nsample": 8, "max_radius": 0.6, "min_radius": 0.3}, name="float64_self_queries"),
            # A grid: many equal distances, the centres on points (kept within 1e-5 despite min_radius).
            Sample((grid(300, 36), off(100, 300), grid(40, 37), off(10, 40)),
                   {"nsample": 10, "max_radius": 0.75, "min_radius": 0.5}, name="grid_ties_and_centres"),
            Sample((r([100, 3], seed=38), off(0, 100), r([10, 3], seed=39), off(4, 10)),
                   {"nsample": 4, "max_radius": 0.8}, name="empty_segment"),
            Sample((r([80, 3], "float16", seed=40), off(80), r([10, 3], "float16", seed=41), off(10)),
                   {"nsample": 6, "max_radius": 0.7}, name="float16"),
        ],
        bad_inputs=[
            BadInput((r([10, 3]), off(10)), {"nsample": 2, "max_radius": 0.5, "min_radius": 0.5},
                     r"min_radius \(0.5\) must be below max_radius \(0.5\)", "empty_shell"),
            BadInput((r([10, 3]), off(4, 9)), {"nsample": 2, "max_radius": 0.5},
                     r"the last entry of offset \(9\) must equal the number of rows of xyz \(10\)", "offset_short"),
            BadInput((r([10, 3]), off(10), None, off(3)), {"nsample": 2, "max_radius": 0.5},
                     "new_xyz and new_offset must be given together", "half_a_pair"),
            BadInput((r([10, 3]), off(10)), {"nsample": 0, "max_radius": 0.5}, "nsample must be >= 1", "nsample_zero"),
        ],
    )


def test_offset_layout_on_a_large_cloud_matches_the_scan():
    xyz, centres = r([6000, 3], seed=42, low=-1, high=1), r([400, 3], seed=43, low=-1, high=1)
    offset, new_offset = off(2500, 6000), off(150, 400)
    got = torch.ops.opbridge.ball_query_offset(xyz, offset, centres, new_offset, nsample=32, max_radius=0.3,
                                               min_radius=0.05)
    want = offset_reference(xyz.numpy(), offset.numpy(), centres.numpy(), new_offset.numpy(), 32, 0.3, 0.05)
    np.testing.assert_array_equal(got[0].numpy(), want[0])
    np.testing.assert_array_equal(got[1].numpy(), want[1])
