"""three_nn (knn_query's family): pointnet2_ops' three nearest known points against a numpy scan
(squared distances in float32 for float32 and the 16-bit types, nearest first, ties to the lower
index, Euclidean distances returned; fewer than three known points: index 0 at +inf)."""

import numpy as np
import torch

from opbridge.testing import BadInput, OpCase, OpTest, Sample, random_tensor as r

three_nn = torch.ops.opbridge.three_nn


def reference(unknown, known):
    c = np.float64 if unknown.dtype == np.float64 else np.float32
    u, k = unknown.astype(c), known.astype(c)
    b, n = u.shape[:2]
    dist = np.full((b, n, 3), np.inf, c)
    idx = np.zeros((b, n, 3), np.int32)
    for i in range(b):
        for j in range(n):
            d2 = ((u[i, j, 0] - k[i, :, 0]) ** 2 + (u[i, j, 1] - k[i, :, 1]) ** 2) + (u[i, j, 2] - k[i, :, 2]) ** 2
            order = np.lexsort((np.arange(len(d2)), d2))[:3]  # by distance, then index
            idx[i, j, :len(order)] = order
            dist[i, j, :len(order)] = np.sqrt(d2[order])
    return dist.astype(unknown.dtype), idx


def grid(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, shape, generator=g).float() * 0.5


class TestThreeNN(OpTest):
    case = OpCase(
        "three_nn",
        reference=reference,
        samples=[
            Sample((r([2, 200, 3], seed=1), r([2, 50, 3], seed=2)), name="float32", dynamic={0: [1]}),
            Sample((r([1, 300, 3], "float64", seed=3), r([1, 120, 3], "float64", seed=4)), name="float64"),
            Sample((grid([2, 60, 3], 5), grid([2, 40, 3], 6)), name="grid_ties_lower_index"),
            Sample((r([2, 10, 3], seed=7), r([2, 2, 3], seed=8)), name="two_known_points"),
            Sample((r([1, 5, 3], seed=9), r([1, 0, 3])), name="no_known_points"),
            Sample((r([2, 30, 3], "float16", seed=10), r([2, 20, 3], "float16", seed=11)), name="float16"),
        ],
        bad_inputs=[
            BadInput((r([2, 5, 3]), r([3, 4, 3])), {}, "known must have the batch size of unknown", "batch_sizes"),
            BadInput((r([2, 5, 2]), r([2, 4, 3])), {}, r"unknown must be \(B, n, 3\)", "two_coordinates"),
        ],
        resize=lambda s, n: Sample((r([2, n, 3], seed=n), r([2, 50, 3], seed=n + 1))),
    )


def test_a_large_cloud_matches_the_scan():
    unknown, known = r([1, 4000, 3], seed=12), r([1, 1000, 3], seed=13)
    got = three_nn(unknown, known)
    for g, w in zip(got, reference(unknown.numpy(), known.numpy())):
        np.testing.assert_array_equal(g.numpy(), w)
