"""dynamic_scatter against numpy loops written from mmcv's kernels (dynamic_point_to_voxel): the
voxels are the distinct coordinate rows without a negative entry, sorted (np.unique over rows);
each voxel's features summed in point order, averaged, or their maximum; the backward gives a
point its voxel's gradient (sum), that over the count (mean), or, per value, to the first point
holding the maximum (max)."""

import numpy as np
import pytest
import torch

from opbridge.testing import BadInput, OpCase, OpTest, Sample

scatter = torch.ops.opbridge.dynamic_scatter


def reference(feats, coors, reduce="max"):
    n, c = feats.shape
    kept = (coors >= 0).all(1)
    rows = np.unique(coors[kept], axis=0).reshape(-1, coors.shape[1])
    index = {tuple(r): v for v, r in enumerate(rows)}
    p2v = np.array([index[tuple(coors[i])] if kept[i] else -1 for i in range(n)], np.int32)
    out = np.full((len(rows), c), -np.inf if reduce == "max" else 0, feats.dtype)
    count = np.zeros(len(rows), np.int32)
    for i in range(n):
        v = p2v[i]
        if v < 0:
            continue
        count[v] += 1
        for j in range(c):
            if reduce == "max":
                if not np.isnan(out[v, j]) and (feats[i, j] > out[v, j] or np.isnan(feats[i, j])):
                    out[v, j] = feats[i, j]
            else:
                out[v, j] += feats[i, j]
    if reduce == "mean":
        out /= count[:, None].astype(feats.dtype)
    return out, rows, p2v, count


def backward_reference(grad, feats, voxel_feats, p2v, count, reduce):
    out = np.zeros_like(feats)
    for i, v in enumerate(p2v):
        if v >= 0 and reduce != "max":
            out[i] = grad[v] / (count[v] if reduce == "mean" else 1)
    if reduce == "max":
        for v in range(len(voxel_feats)):
            for j in range(feats.shape[1]):
                first = next(i for i in range(len(p2v)) if p2v[i] == v and feats[i, j] == voxel_feats[v, j])
                out[first, j] = grad[v, j]
    return out


def points(n, c, seed, dtype=torch.float64, ties=False):
    g = torch.Generator().manual_seed(seed)
    if ties:
        return torch.randint(0, 3, (n, c), generator=g).to(dtype)
    return torch.randn(n, c, generator=g, dtype=dtype)


def coords(n, d, seed, high=4, dropped=0.2, dtype=torch.int32):
    g = torch.Generator().manual_seed(seed)
    co = torch.randint(0, high, (n, d), generator=g)
    drop = torch.rand(n, generator=g) < dropped
    co[drop, torch.randint(0, d, (n,), generator=g)[drop]] = -1  # one negative entry drops the row
    return co.to(dtype)


def sizes(s, n):
    return Sample((points(n, s.inputs[0].shape[1], n), coords(n, s.inputs[1].shape[1], n + 1)), s.attrs)


class TestDynamicScatter(OpTest):
    case = OpCase(
        "dynamic_scatter",
        reference=reference,
        samples=[
            Sample((points(60, 5, 1), coords(60, 3, 2)), {"reduce": "max"}, name="max", dynamic={0: [0], 1: [0]}),
            Sample((points(60, 4, 3), coords(60, 3, 4)), {"reduce": "mean"}, name="mean", dynamic={0: [0], 1: [0]}),
            Sample((points(50, 3, 5), coords(50, 4, 6, high=3, dtype=torch.int64)), {"reduce": "sum"},
                   name="sum_batch_first_int64"),
            Sample((points(40, 3, 7, torch.float32), coords(40, 3, 8, high=1000)), {"reduce": "mean"},
                   name="float32_sparse"),
            Sample((points(30, 2, 9), coords(30, 3, 10, dropped=1.0)), {"reduce": "max"}, name="every_row_dropped"),
            Sample((points(0, 3, 11), coords(0, 3, 12)), {"reduce": "mean"}, name="empty"),
            Sample((points(40, 3, 13, ties=True), coords(40, 2, 14, high=2)), {"reduce": "max"}, name="max_ties",
                   no_gradcheck="equal values tie for the maximum: no derivative there"),
        ],
        bad_inputs=[
            BadInput((points(5, 3, 1), coords(4, 3, 2)), {}, "coors must have one row per row of feats", "rows"),
            BadInput((points(5, 3, 1), coords(5, 3, 2)), {"reduce": "min"}, "reduce must be \"sum\", \"mean\" or "
                     "\"max\", got \"min\"", "min"),
            BadInput((points(5, 3, 1), coords(5, 3, 2).float()), {}, "input 'coors' has dtype float32", "float_coors"),
            # No coordinate column: no voxel to name (found by the sanitizer campaign: a null row copy).
            BadInput((points(3, 4, 1), torch.zeros(3, 0, dtype=torch.int32)), {}, r"coors must be \(N, D\) with D >= 1",
                     "no_columns"),
        ],
        resize=sizes,
    )


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_gradient_matches_the_numpy_rule_with_ties(reduce):
    feats = points(80, 4, 20, ties=True).requires_grad_()  # integer values: many ties for the maximum
    co = coords(80, 3, 21, high=2)
    vf, vc, p2v, count = scatter(feats, co, reduce)
    grad = points(vf.shape[0], 4, 22)
    (vf * grad).sum().backward()
    want = backward_reference(grad.numpy(), feats.detach().numpy(), vf.detach().numpy(), p2v.numpy(), count.numpy(),
                              reduce)
    np.testing.assert_allclose(feats.grad.numpy(), want, rtol=1e-12)
    if reduce == "max":  # one point per value takes the gradient, however many tie
        assert int((feats.grad != 0).sum()) == vf.numel()


def test_a_nan_feature_makes_its_voxel_nan_and_takes_the_gradient():
    feats = torch.tensor([[1.0], [float("nan")], [3.0], [float("nan")]], dtype=torch.float64, requires_grad=True)
    vf, _, _, _ = scatter(feats, torch.zeros(4, 3, dtype=torch.int32), "max")
    assert torch.isnan(vf).all()
    vf.sum().backward()
    assert feats.grad.flatten().tolist() == [0.0, 1.0, 0.0, 0.0]


def test_backward_refuses_a_point2voxel_out_of_range():
    feats = points(4, 2, 23)
    vf, vc, p2v, count = scatter(feats, torch.zeros(4, 3, dtype=torch.int32), "mean")
    with pytest.raises(RuntimeError, match=r"point2voxel\[2\] = 5 is not a voxel \(there are 1\)"):
        torch.ops.opbridge.dynamic_scatter_backward(vf, feats, vf, torch.tensor([0, 0, 5, 0], dtype=torch.int32), count,
                                                    "mean")


def test_a_large_cloud_matches_the_loop():
    feats, co = points(20_000, 4, 24, torch.float32), coords(20_000, 4, 25, high=40, dtype=torch.int64)
    for reduce in ("sum", "mean", "max"):
        got = scatter(feats, co, reduce)
        want = reference(feats.numpy(), co.numpy(), reduce)
        np.testing.assert_allclose(got[0].numpy(), want[0], rtol=1e-5, atol=1e-5)
        for g, w in zip(got[1:], want[1:]):
            np.testing.assert_array_equal(g.numpy(), w)
