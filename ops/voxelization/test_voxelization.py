"""hard_voxelize and dynamic_voxelize against numpy loops written from mmcv's CPU kernel: a
point's voxel per axis floor((p - min) / size) in float32 (float64 for float64 points), kept in
[0, round((max - min) / size)) (the grid in float32, rounded half away from zero); hard
voxelization walks the points in order, a voxel's id given at its first point, at most max_points
points per voxel and max_voxels voxels."""

import math

import numpy as np
import pytest
import torch

from opbridge.testing import BadInput, OpCase, OpTest, Sample

KITTI = [0.0, -40.0, -3.0, 70.4, 40.0, 1.0]
SECOND = [0.05, 0.05, 0.1]
PILLAR = [0.16, 0.16, 4.0]
GRID = {"voxel_size": SECOND, "point_cloud_range": KITTI}  # the two required attributes


def voxel_of(points, voxel_size, point_cloud_range):
    """(N, 3) int64 (z, y, x) per point, -1 rows outside the grid (a loop, one axis at a time)."""
    c = np.float64 if points.dtype == np.float64 else np.float32
    out = np.full((len(points), 3), -1, np.int64)
    for i, p in enumerate(points):
        cell = []
        for a in range(3):
            size = np.float32(voxel_size[a])
            lo, hi = np.float32(point_cloud_range[a]), np.float32(point_cloud_range[a + 3])
            grid = math.floor(float(np.float32((hi - lo) / size)) + 0.5)  # C's round, in float32
            with np.errstate(invalid="ignore", over="ignore"):
                v = np.floor((c(p[a]) - c(lo)) / c(size))
            if not (v >= 0 and v < grid):
                break
            cell.append(int(v))
        else:
            out[i] = cell[::-1]
    return out


def dynamic_reference(points, voxel_size=SECOND, point_cloud_range=KITTI):
    return voxel_of(points, voxel_size, point_cloud_range).astype(np.int32)


def hard_reference(points, voxel_size=SECOND, point_cloud_range=KITTI, max_points=35, max_voxels=20000):
    cells = voxel_of(points, voxel_size, point_cloud_range)
    ids, voxels, coors, num = {}, [], [], []
    for i, cell in enumerate(cells):
        if cell[0] < 0:
            continue
        key = tuple(cell)
        if key not in ids:
            if len(coors) >= max_voxels:
                continue
            ids[key] = len(coors)
            coors.append(cell)
            num.append(0)
            voxels.append(np.zeros((max_points, points.shape[1]), points.dtype))
        v = ids[key]
        if num[v] < max_points:
            voxels[v][num[v]] = points[i]
            num[v] += 1
    m = len(coors)
    return (np.array(voxels, points.dtype).reshape(m, max_points, points.shape[1]),
            np.array(coors, np.int32).reshape(m, 3), np.array(num, np.int32))


def cloud(n, seed, dtype=torch.float32, features=4, spread=1.0):
    """Points over the KITTI range and beyond it (some dropped), `features` columns."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = torch.tensor([-4.0, -44.0, -3.5]), torch.tensor([74.0, 44.0, 1.5])
    xyz = (lo + (hi - lo) * torch.rand(n, 3, generator=g)) * spread
    return torch.cat([xyz, torch.rand(n, features - 3, generator=g)], 1).to(dtype)


def crowded(n, seed, voxel_size, cells=6):
    """Points in a few voxels of the grid (each holding many), on voxel boundaries as often as not."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, cells, (n, 3), generator=g).float()
    frac = torch.where(torch.rand(n, 3, generator=g) < 0.5, 0.0, torch.rand(n, 3, generator=g))
    xyz = torch.tensor(KITTI[:3]) + (idx + frac) * torch.tensor(voxel_size)
    return torch.cat([xyz, torch.rand(n, 1, generator=g)], 1)


def non_finite(n, seed):
    p = cloud(n, seed)
    p[::7, 0], p[3::11, 1], p[5::13, 2] = float("nan"), float("inf"), -float("inf")
    p[2::17, 0] = 1e30  # far outside: its voxel index overflows int32
    return p


def sizes(s, n):
    return Sample((cloud(n, n),), s.attrs)


class TestHardVoxelize(OpTest):
    case = OpCase(
        "hard_voxelize",
        reference=hard_reference,
        samples=[
            Sample((cloud(400, 1),), {"voxel_size": PILLAR, "point_cloud_range": KITTI, "max_points": 3,
                                     "max_voxels": 1000}, name="float32_pillars", dynamic={0: [0]}),
            Sample((crowded(300, 2, PILLAR),), {"voxel_size": PILLAR, "point_cloud_range": KITTI, "max_points": 5,
                                                "max_voxels": 20}, name="full_voxels", dynamic={0: [0]}),
            # A grid of 90M voxels: the hash table, not a dense one.
            Sample((crowded(500, 3, SECOND, cells=9),), {"voxel_size": SECOND, "point_cloud_range": KITTI,
                                                         "max_points": 4, "max_voxels": 60}, name="second_grid_hashed"),
            Sample((cloud(300, 4, features=5),), {"voxel_size": SECOND, "point_cloud_range": KITTI, "max_points": 2,
                                                  "max_voxels": 40}, name="max_voxels_reached"),
            Sample((cloud(250, 5, torch.float64),), {"voxel_size": [2.0, 3.0, 0.5], "point_cloud_range": KITTI,
                                                     "max_points": 3, "max_voxels": 500}, name="float64"),
            Sample((non_finite(200, 6),), {"voxel_size": [4.0, 4.0, 1.0], "point_cloud_range": KITTI,
                                           "max_points": 6, "max_voxels": 300}, name="non_finite_points_dropped"),
            Sample((cloud(0, 7),), {"voxel_size": PILLAR, "point_cloud_range": KITTI}, name="empty_cloud"),
            Sample((cloud(50, 8, spread=10.0),), {"voxel_size": PILLAR, "point_cloud_range": KITTI, "max_points": 2,
                                                  "max_voxels": 10}, name="mostly_out_of_range"),
        ],
        bad_inputs=[
            BadInput((cloud(10, 9),), {**GRID, "max_voxels": 0}, "max_voxels must be >= 1", "no_voxels"),
            BadInput((cloud(10, 9),), {**GRID, "max_points": 0}, "max_points must be >= 1", "no_points"),
            BadInput((cloud(10, 9)[:, :2],), {**GRID}, r"points must be \(N, C\) with C >= 3", "two_columns"),
            BadInput((cloud(10, 9).long(),), {**GRID}, "input 'points' has dtype int64", "wrong_dtype"),
            BadInput((cloud(10, 9),), {**GRID, "voxel_size": [0.1, 0.1]}, "voxel_size must hold 3 values", "short_size"),
            BadInput((cloud(10, 9),), {**GRID, "voxel_size": [0.1, -0.1, 0.1]}, "voxel_size must be positive and finite",
                     "negative_size"),
            BadInput((cloud(10, 9),), {**GRID, "point_cloud_range": [0, 0, 0, 1, 1]}, "point_cloud_range must hold 6 values",
                     "short_range"),
            BadInput((cloud(10, 9),), {**GRID, "point_cloud_range": [0, 0, 0, 0.01, 1, 1]}, "has no voxel along x",
                     "empty_range"),
            BadInput((cloud(10, 9),), {**GRID, "point_cloud_range": [0, 0, float("nan"), 1, 1, 1]},
                     "point_cloud_range must be finite", "nan_range"),
            BadInput((cloud(10, 9),), {**GRID, "voxel_size": [1e-9, 1e-9, 1e-9]}, "at most 2\\^30 are supported", "huge_grid"),
            BadInput((cloud(10, 9),), {**GRID, "max_points": 1 << 40, "voxel_size": PILLAR}, "max_points is too large",
                     "huge_voxels"),
        ],
        resize=sizes,
    )


class TestDynamicVoxelize(OpTest):
    case = OpCase(
        "dynamic_voxelize",
        reference=dynamic_reference,
        samples=[
            Sample((cloud(300, 10),), {"voxel_size": SECOND, "point_cloud_range": KITTI}, name="float32",
                   dynamic={0: [0]}),
            Sample((crowded(200, 11, PILLAR),), {"voxel_size": PILLAR, "point_cloud_range": KITTI},
                   name="on_voxel_boundaries"),
            Sample((cloud(100, 12, torch.float64, features=3),), {"voxel_size": [0.3, 0.7, 0.2],
                                                                  "point_cloud_range": KITTI}, name="float64"),
            Sample((non_finite(120, 13),), {"voxel_size": PILLAR, "point_cloud_range": KITTI}, name="non_finite"),
            Sample((cloud(0, 14),), GRID, name="empty_cloud"),
        ],
        bad_inputs=[
            BadInput((cloud(10, 9)[:, :1],), {**GRID}, r"points must be \(N, C\) with C >= 3", "one_column"),
            BadInput((cloud(10, 9),), {**GRID, "voxel_size": [0.1, 0.1, 0.0]}, "voxel_size must be positive and finite",
                     "zero_size"),
            BadInput((cloud(10, 9),), {**GRID, "point_cloud_range": [0, 0, 0, 1, 1, -1]}, "has no voxel along z",
                     "inverted_range"),
        ],
        resize=sizes,
    )


def test_hard_voxelization_matches_the_loop_on_a_large_cloud_with_both_tables():
    # 120k points: the PointPillars grid (220k cells) takes the dense table, SECOND's (90M) the hash.
    points = cloud(120_000, 15)
    for voxel_size, max_points, max_voxels in ((PILLAR, 32, 16000), (SECOND, 5, 16000)):
        got = torch.ops.opbridge.hard_voxelize(points, voxel_size, KITTI, max_points, max_voxels)
        want = hard_reference(points.numpy(), voxel_size, KITTI, max_points, max_voxels)
        assert got[0].shape[0] == max_voxels  # the limit was reached
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), w)


def test_voxel_ids_follow_the_first_point_not_the_coordinates():
    pts = torch.tensor([[5.0, 0.5, 0.0, 1.0], [0.5, 0.5, 0.0, 2.0], [5.1, 0.6, 0.1, 3.0], [5.2, 0.7, 0.2, 4.0]])
    voxels, coors, num = torch.ops.opbridge.hard_voxelize(pts, [1.0, 1.0, 4.0], [0, 0, -3, 10, 10, 1], 2, 10)
    assert coors.tolist() == [[0, 0, 5], [0, 0, 0]]
    assert num.tolist() == [2, 1]
    assert voxels[0, :, 3].tolist() == [1.0, 3.0] and voxels[1, :, 3].tolist() == [2.0, 0.0]  # the 4th point dropped


def test_after_max_voxels_the_hash_table_keeps_taken_voxels_and_refuses_new_ones():
    # SECOND's grid (90M cells) takes the hash table. Voxels a and b are taken (max_voxels 2); c
    # comes after the limit: refused, at its first point and its second; a's later point is kept.
    a, b, c = [10.01, 0.01, 0.01], [20.01, 0.01, 0.01], [30.01, 0.01, 0.01]
    pts = torch.tensor([a + [1.0], b + [2.0], c + [3.0], a + [4.0], c + [5.0], b + [6.0], a + [7.0]])
    voxels, coors, num = torch.ops.opbridge.hard_voxelize(pts, SECOND, KITTI, 2, 2)
    assert coors.tolist() == [[30, 800, 200], [30, 800, 400]]
    assert num.tolist() == [2, 2]
    assert voxels[:, :, 3].tolist() == [[1.0, 4.0], [2.0, 6.0]]  # a's third point past max_points
