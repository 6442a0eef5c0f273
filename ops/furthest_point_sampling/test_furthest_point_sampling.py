"""furthest_point_sampling in its three forms (batched, offset, ratio) against a numpy loop written
from the originals' semantics: squared distances ((dx² + dy²) + dz², in float32 for float32 and the
16-bit types), a running minimum from 1e10 (+inf for the ratio form), the argmax, ties broken as
a CUDA block of `tie_threads` threads reduces them (bit-reversed thread id, then the lower index)
or by the lower index, and pointnet2_ops' points near the origin that are never picked.
furthest_point_sampling_with_dist against a numpy model of mmcv's CUDA block (threads over strided
points from (-1, index 0), then the pairwise reduction), and against the batched form over the
same points' squared distances."""

import numpy as np
import pytest
import torch

from opbridge.testing import BadInput, OpCase, OpTest, Sample, random_tensor as r

fps = torch.ops.opbridge.furthest_point_sampling
fps_offset = torch.ops.opbridge.furthest_point_sampling_offset
fps_ratio = torch.ops.opbridge.furthest_point_sampling_ratio
fps_with_dist = torch.ops.opbridge.furthest_point_sampling_with_dist


def cuda_threads(n, cap):
    if cap <= 0:
        return 0
    t = 1
    while t * 2 <= min(n, cap):
        t *= 2
    return t


def tie_key(k, threads):
    if threads == 0:
        return (0, k)
    bits = threads.bit_length() - 1
    t = k % threads
    return (int(format(t, f"0{bits}b")[::-1], 2) if bits else 0, k)


def chain(points, samples, start=0, threads=0, skip=False, initial=1e10):
    """One segment's picks (local indices), as the originals compute them."""
    c = np.float64 if points.dtype == np.float64 else np.float32
    p = points.astype(c)
    n = len(p)
    dist = np.full(n, initial, c)
    skipped = np.zeros(n, bool)
    if skip:
        mag = np.zeros(n, c)
        for d in range(p.shape[1]):
            mag = mag + p[:, d] * p[:, d]
        skipped = mag.astype(np.float64) <= 1e-3
    picks, pick = [start], start
    for _ in range(1, samples):
        d = np.zeros(n, c)
        for col in range(p.shape[1]):
            v = p[:, col] - p[pick, col]
            d = d + v * v
        dist = np.where(skipped, dist, np.minimum(d, dist))
        if skipped.all():
            pick = 0
        else:
            best = dist[~skipped].max()
            ties = np.nonzero(~skipped & (dist == best))[0]
            pick = int(min(ties, key=lambda k: tie_key(int(k), threads)))
        picks.append(pick)
    return np.array(picks[:samples], np.int64)


def reference(xyz, npoint, tie_threads=512, skip_near_origin=True):
    b, n, _ = xyz.shape
    out = np.zeros((b, npoint), np.int32)
    for i in range(b):
        if npoint:
            out[i] = chain(xyz[i], npoint, 0, cuda_threads(n, tie_threads), skip_near_origin)
    return out


def offset_reference(xyz, offset, new_offset, tie_threads=1024):
    pb, qb = np.concatenate([[0], offset]), np.concatenate([[0], new_offset])
    threads = cuda_threads(int(np.diff(pb).max(initial=0)), tie_threads)
    out = [pb[i] + chain(xyz[pb[i]:pb[i + 1]], qb[i + 1] - qb[i], 0, threads) for i in range(len(offset))]
    return np.concatenate(out + [np.zeros(0, np.int64)]).astype(np.int32)


def ratio_reference(src, ptr, ratio=0.5, random_start=False):
    out = []
    for i in range(len(ptr) - 1):
        n = ptr[i + 1] - ptr[i]
        m = int(np.ceil(np.float32(n) * np.float32(ratio))) if n else 0
        out.append(ptr[i] + chain(src[ptr[i]:ptr[i + 1]], m, 0, 0, False, np.inf))
    return np.concatenate(out + [np.zeros(0, np.int64)]).astype(np.int64)


def dist_reference(dist, npoint, tie_threads=1024):
    """mmcv's furthest_point_sampling_with_dist_forward_cuda_kernel, step for step, in numpy."""
    c = np.float64 if dist.dtype == np.float64 else np.float32
    b, n, _ = dist.shape
    threads = max(cuda_threads(n, tie_threads), 1)
    rows = -(-n // threads)
    out = np.zeros((b, npoint), np.int32)
    for i in range(b):
        d = dist[i].astype(c)
        temp, old = np.full(n, 1e10, c), 0
        for j in range(1, npoint):
            temp = np.minimum(d[old], temp)
            # [row, thread] = point row * threads + thread; padding never beats a thread's -1.
            grid = np.full(rows * threads, -np.inf, c)
            grid[:n] = temp
            grid = grid.reshape(rows, threads)
            hit = grid > -1
            best = np.where(hit, grid, c(-1)).max(0)
            first = np.argmax(hit & (grid == best), 0)
            besti = np.where(hit.any(0), first * threads + np.arange(threads), 0)
            half = threads // 2
            while half:
                take = best[half:2 * half] > best[:half]
                best[:half] = np.where(take, best[half:2 * half], best[:half])
                besti[:half] = np.where(take, besti[half:2 * half], besti[:half])
                half //= 2
            old = out[i, j] = besti[0]
    return out


def squared_distances(xyz):
    """(B, N, N) squared distances, ((dx² + dy²) + dz²) in float32 as the batched form sums them."""
    p = xyz.float()
    d = p[:, :, None] - p[:, None]
    return (d[..., 0] * d[..., 0] + d[..., 1] * d[..., 1]) + d[..., 2] * d[..., 2]


def grid_points(n, seed, dtype="float32"):
    """Points on a coarse grid: many equal distances, so the tie rule decides picks."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-3, 4, (n, 3), generator=g).to(getattr(torch, dtype)) * 0.5)


class TestFurthestPointSampling(OpTest):
    case = OpCase(
        "furthest_point_sampling",
        reference=reference,
        samples=[
            Sample((r([2, 300, 3], seed=1),), {"npoint": 40}, name="float32", dynamic={0: [0]}),
            Sample((r([3, 70, 3], "float64", seed=2),), {"npoint": 70}, name="float64_every_point"),
            Sample((grid_points(600, 3).reshape(2, 300, 3),), {"npoint": 120}, name="grid_ties_512_threads"),
            Sample((grid_points(1500, 4).reshape(1, 1500, 3),), {"npoint": 200, "tie_threads": 1024,
                                                                  "skip_near_origin": False},
                   name="grid_ties_1024_threads"),
            Sample((grid_points(90, 5).reshape(1, 90, 3),), {"npoint": 80, "tie_threads": 0}, name="ties_lowest_index"),
            # Points within 0.0316 of the origin are never picked after point 0 (pointnet2_ops).
            Sample((r([1, 200, 3], seed=6, low=-0.05, high=0.05),), {"npoint": 30}, name="near_origin_skipped"),
            Sample((torch.zeros(1, 50, 3),), {"npoint": 5}, name="all_near_origin"),
            Sample((r([1, 12, 3], seed=7),), {"npoint": 30}, name="more_picks_than_points"),
            Sample((r([2, 64, 3], "float16", seed=8),), {"npoint": 16}, name="float16"),
            Sample((r([0, 5, 3], seed=9),), {"npoint": 3}, name="empty_batch"),
            Sample((r([2, 9, 3], seed=10),), {"npoint": 0}, name="no_picks"),
        ],
        bad_inputs=[
            BadInput((r([2, 5, 2]),), {"npoint": 2}, r"xyz must be \(B, N, 3\)", "two_coordinates"),
            BadInput((r([2, 5, 3]),), {"npoint": -1}, "npoint must be >= 0, got -1", "negative_npoint"),
            BadInput((r([2, 0, 3]),), {"npoint": 2}, "xyz has no points to sample 2 from", "no_points"),
            BadInput((torch.tensor([[[0.0, float("nan"), 1.0]]]),), {"npoint": 1},
                     r"xyz has a coordinate that is not finite \(nan at row 0, column 1\)", "nan"),
            BadInput((r([2, 5, 3]).long(),), {"npoint": 2}, "input 'xyz' has dtype int64", "wrong_dtype"),
        ],
        resize=lambda s, n: Sample((r([n, 300, 3], seed=n),), s.attrs),
    )


def offset_points(counts, seed=0, dtype="float32"):
    xyz = r([sum(counts), 3], dtype, seed=seed)
    return xyz, torch.tensor(np.cumsum(counts), dtype=torch.int32)


class TestFurthestPointSamplingOffset(OpTest):
    case = OpCase(
        "furthest_point_sampling_offset",
        reference=offset_reference,
        samples=[
            Sample((*offset_points([100, 60, 140], 1), torch.tensor([25, 40, 75], dtype=torch.int32)),
                   name="three_segments"),
            Sample((*offset_points([500], 2, "float64"), torch.tensor([500], dtype=torch.int32)), name="every_point"),
            Sample((grid_points(700, 3), torch.tensor([300, 700]), torch.tensor([100, 250])), name="grid_ties_int64"),
            Sample((*offset_points([10, 0, 20], 4), torch.tensor([4, 4, 10], dtype=torch.int32)),
                   name="empty_segment"),
            Sample((*offset_points([8], 5), torch.tensor([20], dtype=torch.int32)), name="more_picks_than_points"),
        ],
        bad_inputs=[
            BadInput((*offset_points([10, 10]), torch.tensor([5], dtype=torch.int32)), {},
                     "new_offset must have one entry per segment of offset", "segments_disagree"),
            BadInput((r([20, 3]), torch.tensor([10, 19], dtype=torch.int32), torch.tensor([2, 4], dtype=torch.int32)),
                     {}, r"the last entry of offset \(19\) must equal the number of rows of xyz \(20\)", "offset_total"),
            BadInput((*offset_points([10, 10]), torch.tensor([5, 3], dtype=torch.int32)), {},
                     r"new_offset must be non-decreasing, but new_offset\[0\] = 5 > new_offset\[1\] = 3",
                     "new_offset_decreasing"),
            BadInput((*offset_points([10, 0]), torch.tensor([5, 8], dtype=torch.int32)), {},
                     "segment 1 of xyz has no points to sample 3 from", "empty_segment_with_picks"),
        ],
    )


def ptr_of(counts):
    return torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=torch.int64)


class TestFurthestPointSamplingRatio(OpTest):
    case = OpCase(
        "furthest_point_sampling_ratio",
        reference=ratio_reference,
        samples=[
            Sample((r([300, 3], seed=1), ptr_of([120, 180])), {"ratio": 0.25}, name="float32"),
            # n = 100, ratio 0.3: float32 gives ceil(30.000002) = 31 picks, as torch_cluster does.
            Sample((r([100, 3], "float64", seed=2), ptr_of([100])), {"ratio": 0.3}, name="float32_count"),
            Sample((r([150, 5], seed=3), ptr_of([50, 0, 100])), {"ratio": 0.5}, name="five_coordinates_empty_segment"),
            Sample((grid_points(200, 4), ptr_of([200])), {"ratio": 1.0}, name="grid_ties_lowest_index"),
            Sample((r([40, 1], seed=5), ptr_of([40])), {"ratio": 0.2}, name="one_coordinate"),
        ],
        bad_inputs=[
            BadInput((r([10, 3]), ptr_of([10])), {"ratio": 0.0}, "ratio must be finite and > 0, got 0", "ratio_zero"),
            BadInput((r([10, 3]), torch.tensor([0, 5, 9])), {"ratio": 0.5},
                     r"the last entry of ptr \(9\) must equal the number of rows of src \(10\)", "ptr_total"),
            BadInput((r([10, 3]), torch.tensor([1, 10])), {"ratio": 0.5}, r"ptr\[0\] = 1; the first segment starts at row 0",
                     "ptr_start"),
        ],
    )


def test_random_start_then_the_greedy_chain():
    src, ptr = r([200, 3], seed=11), ptr_of([80, 120])
    got = fps_ratio(src, ptr, ratio=0.1, random_start=True).numpy()
    assert len(got) == 8 + 12
    for seg, (lo, hi, m) in enumerate(((0, 80, 8), (80, 200, 12))):
        part = got[sum((8, 12)[:seg]):][:m]
        assert lo <= part[0] < hi
        want = lo + chain(src.numpy()[lo:hi], m, int(part[0] - lo), 0, False, np.inf)
        np.testing.assert_array_equal(part, want)


def test_the_tie_rule_is_not_the_lowest_index():
    # Four threads, two points at the same largest distance: the CUDA reduction keeps thread 2
    # (bit-reversed 01) over thread 1 (bit-reversed 10).
    xyz = torch.tensor([[[0.0, 0, 0], [1.0, 0, 0], [-1.0, 0, 0], [0.1, 0, 0]]])
    assert fps(xyz, 2, tie_threads=4, skip_near_origin=False)[0].tolist() == [0, 2]
    assert fps(xyz, 2, tie_threads=0, skip_near_origin=False)[0].tolist() == [0, 1]


@pytest.mark.parametrize("seed", range(6))
def test_large_segments_scan_split_over_the_pool_give_the_same_picks(seed):
    # Above 16 K points a single segment's scan runs in chunks on the pool: the same picks.
    xyz = grid_points(20000, seed).reshape(1, 20000, 3) if seed % 2 else r([1, 20000, 3], seed=seed)
    torch.set_num_threads(2)
    got = fps(xyz, 60, tie_threads=1024, skip_near_origin=False)
    np.testing.assert_array_equal(got.numpy(), reference(xyz.numpy(), 60, 1024, False))


@pytest.mark.parametrize("ratio", [0.3, 0.25, 1.0])
def test_agrees_with_torch_cluster(ratio):
    torch_cluster = pytest.importorskip("torch_cluster", reason="torch_cluster is not installed (it builds from source "
                                                               "against torch: scripts/oracles.sh)")
    src = r([900, 3], seed=12)
    batch = torch.cat([torch.zeros(100, dtype=torch.int64), torch.ones(300, dtype=torch.int64),
                       torch.full((500,), 2, dtype=torch.int64)])
    want = torch_cluster.fps(src, batch, ratio=ratio, random_start=False)
    got = fps_ratio(src, ptr_of([100, 300, 500]), ratio=ratio, random_start=False)
    torch.testing.assert_close(got, want, rtol=0, atol=0)



def cloud(kind, shape, seed, dtype="float32"):
    """Uniform points, or points on a grid of step 0.25 (many equal distances at every pick)."""
    if kind == "grid":
        g = torch.Generator().manual_seed(seed)
        return (torch.randint(-12, 13, shape, generator=g) * 0.25).to(getattr(torch, dtype))
    return r(list(shape), dtype, seed=seed)


# Thousands of points and picks: the kernel groups points into blocks and skips the blocks a pick
# cannot change; the picks stay the plain loop's, ties and skipped points included.
@pytest.mark.parametrize("kind", ["uniform", "grid"])
@pytest.mark.parametrize(("dtype", "tie_threads", "skip"), [("float32", 1024, False), ("float32", 512, True),
                                                            ("float64", 0, False), ("float16", 512, True)])
def test_large_batched_clouds_give_the_plain_loops_picks(kind, dtype, tie_threads, skip):
    xyz = cloud(kind, (2, 5000, 3), 21, dtype)
    got = fps(xyz, 1200, tie_threads=tie_threads, skip_near_origin=skip)
    np.testing.assert_array_equal(got.numpy(), reference(xyz.numpy(), 1200, tie_threads, skip))


@pytest.mark.parametrize("kind", ["uniform", "grid"])
def test_large_offset_segments_give_the_plain_loops_picks(kind):
    xyz = cloud(kind, (7000, 3), 22)
    offset, new_offset = torch.tensor([4500, 7000]), torch.tensor([1500, 2300])
    got = fps_offset(xyz, offset, new_offset)
    np.testing.assert_array_equal(got.numpy(), offset_reference(xyz.numpy(), offset.numpy(), new_offset.numpy()))


@pytest.mark.parametrize(("kind", "dims"), [("uniform", 5), ("uniform", 1), ("grid", 3)])
def test_large_ratio_segments_give_the_plain_loops_picks(kind, dims):
    src, ptr = cloud(kind, (6000, dims), 23), ptr_of([3500, 2500])
    got = fps_ratio(src, ptr, ratio=0.3)
    np.testing.assert_array_equal(got.numpy(), ratio_reference(src.numpy(), ptr.numpy(), 0.3))


def test_points_without_coordinates_are_all_at_distance_zero():
    # Every distance is 0: after the start, the lowest index over and over (a division by the
    # coordinate count once crashed the process here).
    src, ptr = torch.zeros(7, 0), ptr_of([4, 3])
    got = fps_ratio(src, ptr, ratio=0.8)
    np.testing.assert_array_equal(got.numpy(), ratio_reference(src.numpy(), ptr.numpy(), 0.8))
    assert got.tolist() == [0, 0, 0, 0, 4, 4, 4]


class TestFurthestPointSamplingWithDist(OpTest):
    case = OpCase(
        "furthest_point_sampling_with_dist",
        reference=dist_reference,
        samples=[
            Sample((squared_distances(r([2, 120, 3], seed=21)),), {"npoint": 30}, name="float32", dynamic={0: [0]}),
            Sample((squared_distances(r([1, 70, 3], seed=22)).double(),), {"npoint": 70}, name="float64_every_point"),
            # Equal distances on a grid: the 512-thread block's reduction decides.
            Sample((squared_distances(grid_points(700, 23).reshape(1, 700, 3)),), {"npoint": 90}, name="grid_ties"),
            Sample((squared_distances(grid_points(90, 24).reshape(1, 90, 3)),), {"npoint": 60, "tie_threads": 0},
                   name="ties_lowest_index"),
            # Not a metric: negative and asymmetric entries (a thread whose minima are all below -1
            # offers point 0, as mmcv's does).
            Sample((r([2, 40, 40], seed=25, low=-3, high=1),), {"npoint": 25}, name="negative_entries"),
            Sample((squared_distances(r([1, 12, 3], seed=26)),), {"npoint": 20}, name="more_picks_than_points"),
            Sample((squared_distances(r([2, 48, 3], seed=27)).half(),), {"npoint": 12}, name="float16"),
            Sample((r([0, 5, 5], seed=28),), {"npoint": 3}, name="empty_batch"),
            Sample((r([2, 9, 9], seed=29),), {"npoint": 0}, name="no_picks"),
        ],
        bad_inputs=[
            BadInput((r([2, 5, 4]),), {"npoint": 2}, r"dist must be \(B, N, N\)", "not_square"),
            BadInput((r([2, 5, 5]),), {"npoint": -1}, "npoint must be >= 0, got -1", "negative_npoint"),
            BadInput((r([2, 0, 0]),), {"npoint": 2}, "dist has no points to sample 2 from", "no_points"),
            BadInput((torch.tensor([[[0.0, float("nan")], [1.0, 0.0]]]),), {"npoint": 2},
                     r"dist has a value that is not finite \(nan at batch item 0, row 0, column 1\)", "nan"),
            BadInput((r([2, 5, 5]).long(),), {"npoint": 2}, "input 'dist' has dtype int64", "wrong_dtype"),
        ],
        resize=lambda s, n: Sample((squared_distances(r([n, 120, 3], seed=n)),), s.attrs),
    )


@pytest.mark.parametrize("kind", ["uniform", "grid"])
def test_with_dist_over_squared_distances_picks_what_the_batched_form_picks(kind):
    # The same chain: the batched form computes the rows the matrix holds (mmcv's 1024 threads, no
    # skipping near the origin, as mmcv's furthest_point_sample).
    xyz = grid_points(2 * 1500, 30).reshape(2, 1500, 3) if kind == "grid" else r([2, 1500, 3], seed=31)
    want = fps(xyz, 300, tie_threads=1024, skip_near_origin=False)
    got = fps_with_dist(squared_distances(xyz), 300)
    assert torch.equal(got, want)
    np.testing.assert_array_equal(got.numpy(), dist_reference(squared_distances(xyz).numpy(), 300))
