"""radius (ball_query's family): torch_cluster's radius against a numpy scan: per row of y, the
rows of x in the same batch item whose squared distance (summed over the coordinates in order,
float32 for float32 and the 16-bit types) is below r² (r² squared in float64, then rounded to that
type), the max_num_neighbors lowest; edge_index row 0 the rows of y, row 1 those of x. Against the
real torch_cluster too, where it is installed (as sets: its CPU search returns a ball's points in
its k-d tree's order)."""

import numpy as np
import pytest
import torch

from opbridge.testing import BadInput, OpCase, OpTest, Sample, random_tensor as r

radius = torch.ops.opbridge.radius


def reference(x, y, batch_x=None, batch_y=None, r=1.0, max_num_neighbors=32):
    c = np.float64 if x.dtype == np.float64 else np.float32
    px, py = x.astype(c), y.astype(c)
    bx = np.zeros(len(x), np.int64) if batch_x is None else batch_x
    by = np.zeros(len(y), np.int64) if batch_y is None else batch_y
    r2 = c(np.float64(np.float32(r)) ** 2)  # the float32 attribute, squared in float64
    rows, cols = [], []
    for j in range(len(y)):
        candidates = np.nonzero(bx == by[j])[0]
        d2 = np.zeros(len(candidates), c)
        for a in range(x.shape[1]):
            diff = py[j, a] - px[candidates, a]
            d2 = d2 + diff * diff
        hits = candidates[d2 < r2][:max_num_neighbors]
        rows += [j] * len(hits)
        cols += list(hits)
    return np.array([rows, cols], np.int64).reshape(2, -1)


def batch(*sizes):
    return torch.cat([torch.full((n,), i, dtype=torch.int64) for i, n in enumerate(sizes)])


def grid(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, (n, d), generator=g).float() * 0.5


class TestRadius(OpTest):
    case = OpCase(
        "radius",
        reference=reference,
        samples=[
            Sample((r([200, 3], seed=1), r([50, 3], seed=2)), {"r": 0.3, "max_num_neighbors": 8}, name="float32"),
            Sample((r([300, 3], seed=3), r([60, 3], seed=4), batch(100, 0, 200), batch(20, 25, 15)),
                   {"r": 0.4, "max_num_neighbors": 64}, name="batched_with_an_empty_item"),
            Sample((r([150, 2], "float64", seed=5), r([40, 2], "float64", seed=6)), {"r": 0.25}, name="float64_2d"),
            Sample((r([120, 5], seed=7), r([30, 5], seed=8)), {"r": 0.9, "max_num_neighbors": 6}, name="five_coordinates"),
            # Points on a grid, r exactly one step: pairs at that distance are out (strict <).
            Sample((grid(200, 3, 9), grid(40, 3, 10)), {"r": 0.5, "max_num_neighbors": 100}, name="grid_boundary"),
            Sample((r([100, 3], seed=11), r([20, 3], seed=12)), {"r": 1e-4}, name="no_pairs"),
            Sample((r([60, 3], "float16", seed=13), r([20, 3], "float16", seed=14)), {"r": 0.5, "max_num_neighbors": 4},
                   name="float16"),
            Sample((r([50, 3], seed=15), r([10, 3], seed=16), batch(50), batch(4, 6)), {"r": 0.6},
                   name="queries_of_an_item_without_points"),
        ],
        bad_inputs=[
            BadInput((r([5, 3]), r([4, 2])), {"r": 1.0}, "y must have x's number of coordinates", "coordinates"),
            BadInput((r([5, 3]), r([4, 3]), torch.tensor([0, 1, 0, 1, 1])), {"r": 1.0},
                     r"batch_x must be sorted, but batch_x\[1\] = 1 > batch_x\[2\] = 0", "unsorted_batch"),
            BadInput((r([5, 3]), r([4, 3]), None, torch.tensor([0, 0, -1, 0])), {"r": 1.0},
                     r"batch_y\[2\] = -1 is negative", "negative_batch"),
            BadInput((r([5, 3]), r([4, 3]), torch.zeros(4, dtype=torch.int64)), {"r": 1.0},
                     "batch_x must have one entry per row of x", "batch_length"),
            BadInput((r([5, 3]), r([4, 3])), {"r": 1.0, "max_num_neighbors": 0}, "max_num_neighbors must be >= 1",
                     "no_neighbours"),
            BadInput((torch.tensor([[0.0, float("nan"), 0.0]]), r([4, 3])), {"r": 1.0},
                     r"x has a coordinate that is not finite \(nan at row 0\)", "nan_point"),
        ],
    )


def test_a_large_batched_cloud_matches_the_scan():
    x, y = r([8000, 3], seed=17, low=-1, high=1), r([2000, 3], seed=18, low=-1, high=1)
    bx, by = batch(3000, 5000), batch(900, 1100)
    got = radius(x, y, bx, by, r=0.15, max_num_neighbors=16)
    np.testing.assert_array_equal(got.numpy(), reference(x.numpy(), y.numpy(), bx.numpy(), by.numpy(), 0.15, 16))


def test_agrees_with_torch_cluster():
    torch_cluster = pytest.importorskip("torch_cluster", reason="torch_cluster is not installed (it builds from "
                                                               "source against torch: scripts/oracles.sh)")
    x, y = r([2000, 3], seed=19), r([500, 3], seed=20)
    bx, by = batch(800, 1200), batch(200, 300)
    want = torch_cluster.radius(x, y, 0.2, bx, by, max_num_neighbors=1000)
    got = radius(x, y, bx, by, r=0.2, max_num_neighbors=1000)
    # No ball holds 1000 points: the same pairs, which torch_cluster lists in its tree's order.
    assert sorted(map(tuple, got.t().tolist())) == sorted(map(tuple, want.t().tolist()))
