"""knn_points (knn_query's family): pytorch3d's batched kNN against a numpy scan written from its
CPU kernel: squared distances ((dx² + dy²) + dz² in float32 for float32 and the 16-bit types),
nearest first, ties to the lower index, indices into each batch item's own points, and index 0 at
distance 0 for a missing neighbour (fewer than K points) or a padded query (beyond lengths1).
Gradients by gradcheck and against PyTorch's autograd through the gathered differences."""

import numpy as np
import pytest
import torch

from opbridge.testing import BadInput, OpCase, OpTest, Sample, random_tensor as r

knn_points = torch.ops.opbridge.knn_points


def reference(p1, p2, lengths1=None, lengths2=None, K=1):
    c = np.float64 if p1.dtype == np.float64 else np.float32
    q, p = p1.astype(c), p2.astype(c)
    b, m = q.shape[:2]
    len1 = [m] * b if lengths1 is None else lengths1
    len2 = [p.shape[1]] * b if lengths2 is None else lengths2
    dists, idx = np.zeros((b, m, K), c), np.zeros((b, m, K), np.int64)
    for i in range(b):
        pts = p[i, :len2[i]]
        for j in range(len1[i]):
            d = q[i, j] - pts
            d2 = (d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1]) + d[:, 2] * d[:, 2]
            order = np.lexsort((np.arange(len(d2)), d2))[:K]  # by distance, then index
            idx[i, j, :len(order)] = order
            dists[i, j, :len(order)] = d2[order]
    return dists.astype(p1.dtype), idx


def grid(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, shape, generator=g).float() * 0.5


def lengths(*v, dtype=torch.int64):
    return torch.tensor(v, dtype=dtype)


class TestKnnPoints(OpTest):
    case = OpCase(
        "knn_points",
        reference=reference,
        samples=[
            Sample((r([2, 150, 3], seed=1), r([2, 80, 3], seed=2)), {"K": 5}, name="float32", dynamic={0: [1]}),
            Sample((r([1, 100, 3], "float64", seed=3), r([1, 120, 3], "float64", seed=4)), {"K": 8}, name="float64"),
            Sample((r([3, 40, 3], seed=5), r([3, 30, 3], seed=6), lengths(40, 7, 0), lengths(30, 2, 12)), {"K": 4},
                   name="ragged_lengths"),
            Sample((r([2, 20, 3], "float64", seed=7), r([2, 25, 3], "float64", seed=8), None,
                    lengths(3, 25, dtype=torch.int32)), {"K": 6}, name="fewer_points_than_K"),
            Sample((grid([2, 60, 3], 9), grid([2, 40, 3], 10)), {"K": 7}, name="grid_ties_lower_index",
                   no_gradcheck="ties"),
            Sample((r([2, 30, 3], "float16", seed=11), r([2, 20, 3], "float16", seed=12)), {"K": 3}, name="float16"),
            Sample((r([1, 5, 3], seed=13), r([1, 0, 3])), {"K": 2}, name="no_points"),
        ],
        bad_inputs=[
            BadInput((r([2, 5, 3]), r([3, 4, 3])), {"K": 1}, "p2 must have the batch size of p1", "batch_sizes"),
            BadInput((r([2, 5, 2]), r([2, 4, 2])), {"K": 1}, r"p1 must be \(N, P1, 3\): only 3-D points are supported",
                     "two_coordinates"),
            BadInput((r([2, 5, 3]), r([2, 4, 3]), None, lengths(4, 5)), {"K": 1},
                     r"lengths2\[1\] = 5 is not a length of p2 \(4 points per batch item\)", "length_past_the_end"),
            BadInput((r([2, 5, 3]), r([2, 4, 3]), lengths(1, 2, 3)), {"K": 1},
                     "lengths1 must have one entry per batch item", "lengths_of_another_batch"),
            BadInput((r([2, 5, 3]), r([2, 4, 3])), {"K": 0}, "K must be >= 1", "k_zero"),
        ],
        resize=lambda s, n: Sample((r([2, n, 3], seed=n), r([2, 80, 3], seed=n + 1)), s.attrs),
    )


def test_a_large_cloud_matches_the_scan():
    p1, p2 = r([2, 2000, 3], seed=14), r([2, 3000, 3], seed=15)
    got = knn_points(p1, p2, None, None, 16)
    for g, w in zip(got, reference(p1.numpy(), p2.numpy(), K=16)):
        np.testing.assert_array_equal(g.numpy(), w)


@pytest.mark.parametrize("ragged", [False, True])
def test_gradients_match_autograd_through_the_gathered_points(ragged):
    p1 = r([2, 30, 3], "float64", seed=16).requires_grad_()
    p2 = r([2, 40, 3], "float64", seed=17).requires_grad_()
    len1, len2 = (lengths(30, 11), lengths(40, 4)) if ragged else (None, None)
    dists, idx = knn_points(p1, p2, len1, len2, 6)
    grad = r([2, 30, 6], "float64", seed=18)
    got = torch.autograd.grad(dists, (p1, p2), grad)
    # The same squared distances from the indices, differentiated by PyTorch; padded slots are
    # constants (pytorch3d gives them no gradient either).
    near = torch.stack([p2[i][idx[i]] for i in range(2)])  # (2, 30, 6, 3)
    want_d = ((p1[:, :, None, :] - near) ** 2).sum(-1)
    if ragged:
        valid = (torch.arange(30)[None, :, None] < len1[:, None, None]) & (torch.arange(6) < len2[:, None, None])
        want_d = torch.where(valid, want_d, torch.zeros_like(want_d))
    torch.testing.assert_close(dists, want_d.detach())
    want = torch.autograd.grad(want_d, (p1, p2), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
