"""three_interpolate: pointnet2_ops' interpolation from three neighbours against numpy (the sum
((f0·w0 + f1·w1) + f2·w2) in float32 for float32 and the 16-bit types), its gradients (features
and weight) by gradcheck and against the adjoint written out, and the interpolation PointNet++'s
feature propagation computes from three_nn's distances."""

import numpy as np
import torch

from opbridge.testing import BadInput, OpCase, OpTest, Sample, random_tensor as r

three_interpolate = torch.ops.opbridge.three_interpolate


def reference(features, idx, weight):
    c = np.float64 if features.dtype == np.float64 else np.float32
    f, w = features.astype(c), weight.astype(c)
    b = np.arange(f.shape[0])[:, None, None]
    gathered = f.transpose(0, 2, 1)[b, idx.astype(np.int64)]  # (B, n, 3, c)
    out = (gathered[:, :, 0] * w[:, :, 0, None] + gathered[:, :, 1] * w[:, :, 1, None]) + gathered[:, :, 2] * w[:, :, 2, None]
    return out.transpose(0, 2, 1).astype(features.dtype)


def indices(b, n, m, seed, dtype=torch.int32):
    return torch.randint(0, m, (b, n, 3), generator=torch.Generator().manual_seed(seed)).to(dtype)


class TestThreeInterpolate(OpTest):
    case = OpCase(
        "three_interpolate",
        reference=reference,
        samples=[
            Sample((r([2, 8, 30], seed=1), indices(2, 50, 30, 2), r([2, 50, 3], seed=3, low=0, high=1)),
                   name="float32", dynamic={0: [0], 1: [0], 2: [0]}),
            Sample((r([1, 5, 20], "float64", seed=4), indices(1, 40, 20, 5, torch.int64),
                    r([1, 40, 3], "float64", seed=6, low=0, high=1)), name="float64_int64_idx"),
            Sample((r([2, 4, 1], seed=7), indices(2, 6, 1, 8), r([2, 6, 3], seed=9)), name="one_known_point"),
            Sample((r([2, 3, 16], "float16", seed=10), indices(2, 12, 16, 11), r([2, 12, 3], "float16", seed=12)),
                   name="float16"),
            Sample((r([1, 0, 5], seed=13), indices(1, 4, 5, 14), r([1, 4, 3], seed=15)), name="no_channels"),
        ],
        bad_inputs=[
            BadInput((r([1, 2, 5]), torch.tensor([[[0, 1, 5]]], dtype=torch.int32), r([1, 1, 3])), {},
                     r"idx\[0, 0, 2\] = 5 is not an index of features' 5 points", "index_past_the_end"),
            BadInput((r([1, 2, 5]), indices(1, 4, 5, 1), r([1, 3, 3])), {}, "weight must have idx's shape",
                     "weight_shape"),
            BadInput((r([2, 2, 5]), indices(1, 4, 5, 1), r([1, 4, 3])), {}, "idx must have the batch size of features",
                     "batch_sizes"),
        ],
        resize=lambda s, n: Sample((r([n, 8, 30], seed=n), indices(n, 50, 30, n + 1),
                                    r([n, 50, 3], seed=n + 2, low=0, high=1))),
    )


def test_gradient_is_the_adjoint():
    f = r([2, 3, 10], "float64", seed=20).requires_grad_()
    idx, w = indices(2, 7, 10, 21), r([2, 7, 3], "float64", seed=22).requires_grad_()
    g = r([2, 3, 7], "float64", seed=23)
    grad_f, grad_w = torch.autograd.grad(three_interpolate(f, idx, w), (f, w), g)
    want_f, want_w = np.zeros((2, 3, 10)), np.zeros((2, 7, 3))
    for b in range(2):
        for j in range(7):
            for t in range(3):
                want_f[b, :, idx[b, j, t]] += g[b, :, j].numpy() * w[b, j, t].item()
                want_w[b, j, t] = (g[b, :, j] * f[b, :, idx[b, j, t]]).sum().item()
    np.testing.assert_allclose(grad_f.numpy(), want_f, rtol=1e-12)
    np.testing.assert_allclose(grad_w.numpy(), want_w, rtol=1e-12)


def test_feature_propagation_as_pointnet2():
    # PointnetFPModule: weights 1/(dist + 1e-8), normalised, from three_nn's Euclidean distances.
    unknown, known, feats = r([2, 64, 3], seed=24), r([2, 16, 3], seed=25), r([2, 5, 16], seed=26)
    dist, idx = torch.ops.opbridge.three_nn(unknown, known)
    recip = 1.0 / (dist + 1e-8)
    weight = recip / recip.sum(dim=2, keepdim=True)
    got = three_interpolate(feats, idx, weight)
    d2 = ((unknown[:, :, None] - known[:, None]) ** 2).sum(-1)
    near = d2.argsort(dim=2, stable=True)[:, :, :3]
    want = torch.stack([(feats[b][:, near[b]] * weight[b][None]).sum(-1) for b in range(2)])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
