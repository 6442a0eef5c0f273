"""gather_points and group_points: pointnet2_ops' gather_operation and grouping_operation against
numpy fancy indexing (a gather copies: bit for bit), their gradients by gradcheck and against a
loop that adds each output's gradient to the point it came from, and the errors for indices
outside the points."""

import numpy as np
import pytest
import torch

from opbridge.testing import BadInput, OpCase, OpTest, Sample, random_tensor as r

gather_points = torch.ops.opbridge.gather_points
group_points = torch.ops.opbridge.group_points


def reference(features, idx):
    """features[b][:, idx[b]] per batch item: (B, C, M) or (B, C, M, K)."""
    return np.stack([features[b][:, idx[b].astype(np.int64)] for b in range(features.shape[0])])


def indices(shape, n, seed, dtype=torch.int32):
    return torch.randint(0, n, shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


class TestGatherPoints(OpTest):
    case = OpCase(
        "gather_points",
        reference=reference,
        rtol=0, atol=0,
        samples=[
            Sample((r([2, 6, 40], seed=1), indices((2, 16), 40, 2)), name="float32",
                   dynamic={0: [0], 1: [0]}),
            Sample((r([1, 3, 9], "float64", seed=3), indices((1, 20), 9, 4, torch.int64)), name="float64_int64_idx"),
            Sample((r([2, 5, 12], "float16", seed=5), indices((2, 7), 12, 6)), name="float16"),
            Sample((r([2, 0, 4], seed=7), indices((2, 3), 4, 8)), name="no_channels"),
            Sample((r([2, 3, 4], seed=9), indices((2, 0), 4, 10)), name="no_picks"),
        ],
        bad_inputs=[
            BadInput((r([1, 2, 5]), torch.tensor([[0, 5]], dtype=torch.int32)), {},
                     r"idx\[0\] entry 1 \(row-major\) = 5 is not an index of features' 5 points", "index_past_the_end"),
            BadInput((r([1, 2, 5]), torch.tensor([[-1]], dtype=torch.int64)), {},
                     r"idx\[0\] entry 0 \(row-major\) = -1 is not an index", "negative_index"),
            BadInput((r([2, 2, 5]), indices((1, 3), 5, 1)), {}, "idx must have the batch size of features",
                     "batch_sizes"),
        ],
        resize=lambda s, n: Sample((r([n, 6, 40], seed=n), indices((n, 16), 40, n + 1))),
    )


class TestGroupPoints(OpTest):
    case = OpCase(
        "group_points",
        reference=reference,
        rtol=0, atol=0,
        samples=[
            Sample((r([2, 6, 40], seed=11), indices((2, 8, 5), 40, 12)), name="float32",
                   dynamic={0: [0], 1: [0]}),
            Sample((r([1, 3, 9], "float64", seed=13), indices((1, 4, 3), 9, 14, torch.int64)),
                   name="float64_int64_idx"),
            Sample((r([2, 4, 16], "float16", seed=15), indices((2, 5, 6), 16, 16)), name="float16"),
            Sample((r([1, 2, 3], seed=17), indices((1, 6, 1), 3, 18)), name="one_per_group"),
        ],
        bad_inputs=[
            BadInput((r([1, 2, 5]), torch.tensor([[[0, 1], [2, 7]]], dtype=torch.int32)), {},
                     r"idx\[0\] entry 3 \(row-major\) = 7 is not an index of features' 5 points", "index_past_the_end"),
            BadInput((r([2, 2, 5]), indices((3, 2, 2), 5, 1)), {}, "idx must have the batch size of features",
                     "batch_sizes"),
        ],
        resize=lambda s, n: Sample((r([n, 6, 40], seed=n), indices((n, 8, 5), 40, n + 1))),
    )


@pytest.mark.parametrize("op,shape", [(gather_points, (2, 9)), (group_points, (2, 4, 3))])
def test_gradient_adds_each_output_to_its_point(op, shape):
    """Repeated indices add up; points no index names get 0."""
    f = r([2, 3, 6], "float64", seed=20).requires_grad_()
    idx = indices(shape, 6, 21)
    g = torch.randn(op(f, idx).shape, dtype=torch.float64, generator=torch.Generator().manual_seed(22))
    (grad,) = torch.autograd.grad(op(f, idx), f, g)
    want = np.zeros((2, 3, 6))
    flat_idx, flat_g = idx.reshape(2, -1).numpy(), g.reshape(2, 3, -1).numpy()
    for b in range(2):
        for j in range(flat_idx.shape[1]):
            want[b, :, flat_idx[b, j]] += flat_g[b, :, j]
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-12)
    assert torch.autograd.gradcheck(lambda x: op(x, idx), (f,))


def test_grouping_then_pooling_as_pointnet2():
    """PointNet++'s set abstraction: features of each ball's points, then a max over the ball."""
    xyz = r([2, 50, 3], seed=30)
    feats = r([2, 4, 50], seed=31)
    centres = gather_points(xyz.transpose(1, 2).contiguous(), torch.ops.opbridge.furthest_point_sampling(xyz, 8))
    ball = torch.ops.opbridge.ball_query(xyz, centres.transpose(1, 2).contiguous(), 0.4, 6)
    pooled = group_points(feats, ball).amax(-1)
    want = np.stack([feats[b].numpy()[:, ball[b].long().numpy()].max(-1) for b in range(2)])
    np.testing.assert_array_equal(pooled.numpy(), want)


def test_bfloat16_copies_bits():
    f = r([2, 5, 12], seed=5).to(torch.bfloat16)
    idx = indices((2, 7), 12, 6)
    got = gather_points(f, idx)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.view(torch.int16), torch.stack([f[b][:, idx[b].long()] for b in range(2)]).view(torch.int16))
