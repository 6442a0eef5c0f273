"""opbridge.compat's pointnet2_ops, pointops and mmcv modules: signatures as the real packages'
(pointnet2_ops 3.0, Pointcept's pointops, mmcv 2.2), values against numpy loops, convolutions
against torch's own conv2d (zero offsets) and shifted inputs (integer offsets)."""

from __future__ import annotations

import collections
import inspect

import numpy as np
import pytest
import torch

import opbridge
from opbridge.compat import mmcv, pointops
from opbridge.compat.pointnet2_ops import pointnet2_utils as pu

SIGNATURES = {
    pu.furthest_point_sample: "(xyz, npoint)",
    pu.gather_operation: "(features, idx)",
    pu.ball_query: "(radius, nsample, xyz, new_xyz)",
    pu.grouping_operation: "(features, idx)",
    pu.three_nn: "(unknown, known)",
    pu.three_interpolate: "(features, idx, weight)",
    pu.QueryAndGroup: "(radius, nsample, use_xyz=True)",
    pu.QueryAndGroup.forward: "(self, xyz, new_xyz, features=None)",
    pu.GroupAll: "(use_xyz=True)",
    pu.GroupAll.forward: "(self, xyz, new_xyz, features=None)",
    pointops.knn_query: "(nsample, xyz, offset, new_xyz=None, new_offset=None)",
    pointops.ball_query: "(nsample, max_radius, min_radius, xyz, offset, new_xyz=None, new_offset=None)",
    pointops.farthest_point_sampling: "(xyz, offset, new_offset)",
    pointops.grouping: "(idx, feat, xyz, new_xyz=None, with_xyz=False)",
    pointops.interpolation: "(xyz, new_xyz, feat, offset, new_offset, k=3)",
    pointops.knn_query_and_group: "(feat, xyz, offset=None, new_xyz=None, new_offset=None, idx=None, nsample=None, "
                                  "with_xyz=False)",
    pointops.ball_query_and_group: "(feat, xyz, offset=None, new_xyz=None, new_offset=None, idx=None, max_radio=None, "
                                   "min_radio=0, nsample=None, with_xyz=False)",
    mmcv.ops.deform_conv2d: "(input, offset, weight, stride=1, padding=0, dilation=1, groups=1, deform_groups=1, "
                            "bias=False, im2col_step=32)",
    mmcv.ops.modulated_deform_conv2d: "(input, offset, mask, weight, bias=None, stride=1, padding=0, dilation=1, "
                                      "groups=1, deform_groups=1)",
    mmcv.ops.DeformConv2d: "(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, "
                           "deform_groups=1, bias=False, im2col_step=32)",
    mmcv.ops.ModulatedDeformConv2d: "(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, "
                                    "groups=1, deform_groups=1, bias=True)",
}


@pytest.mark.parametrize("fn", list(SIGNATURES), ids=lambda f: f.__qualname__)
def test_signatures_are_the_packages(fn):
    sig = inspect.signature(fn)
    bare = sig.replace(return_annotation=inspect.Signature.empty,
                       parameters=[p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()])
    assert str(bare) == SIGNATURES[fn]


def _clouds(b=2, n=64, m=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, n, 3, generator=g) + 0.5, torch.rand(b, m, 3, generator=g) + 0.5  # away from the origin


def test_pointnet2_sampling_and_gathering_are_the_loops():
    xyz, _ = _clouds()
    idx = pu.FurthestPointSampling.apply(xyz, 10)
    assert idx.dtype == torch.int32 and idx.shape == (2, 10)
    for b in range(2):
        pts = xyz[b].numpy().astype(np.float64)
        chosen, dist = [0], ((pts - pts[0]) ** 2).sum(1)
        for _ in range(9):
            chosen.append(int(np.argmax(dist)))
            dist = np.minimum(dist, ((pts - pts[chosen[-1]]) ** 2).sum(1))
        assert idx[b].tolist() == chosen
    feats = torch.randn(2, 5, 64)
    assert torch.equal(pu.gather_operation(feats, idx), torch.stack([feats[b][:, idx[b].long()] for b in range(2)]))


def _ball(xyz, new, radius, nsample):
    """pointnet2_ops' ball query: the first nsample points in index order closer than radius,
    padded with the first found (0 when none is)."""
    out = np.zeros(new.shape[:2] + (nsample,), dtype=np.int32)
    for b in range(xyz.shape[0]):
        for j in range(new.shape[1]):
            hits = np.nonzero(((xyz[b] - new[b, j]) ** 2).sum(1) < radius * radius)[0][:nsample]
            if len(hits):
                out[b, j] = np.concatenate([hits, np.full(nsample - len(hits), hits[0])])
    return out


@pytest.mark.parametrize("use_xyz", [True, False])
def test_query_and_group_is_centred_neighbourhoods(use_xyz):
    xyz, new = _clouds(seed=1)
    feats = torch.randn(2, 4, 64)
    got = pu.QueryAndGroup(0.3, 8, use_xyz=use_xyz)(xyz, new, feats)
    idx = _ball(xyz.numpy(), new.numpy(), 0.3, 8)
    np.testing.assert_array_equal(pu.ball_query(0.3, 8, xyz, new).numpy(), idx)
    rel = np.stack([xyz[b].numpy()[idx[b]] - new[b].numpy()[:, None] for b in range(2)]).transpose(0, 3, 1, 2)
    grouped = np.stack([feats[b].numpy()[:, idx[b]] for b in range(2)])
    want = np.concatenate([rel, grouped], 1) if use_xyz else grouped
    np.testing.assert_allclose(got.numpy(), want, atol=1e-6)
    whole = pu.GroupAll(use_xyz)(xyz, None, feats)
    np.testing.assert_array_equal(whole.numpy(), torch.cat([xyz.transpose(1, 2).unsqueeze(2), feats.unsqueeze(2)], 1)
                                  .numpy() if use_xyz else feats.unsqueeze(2).numpy())
    if not use_xyz:
        with pytest.raises(ValueError, match="use_xyz must be True"):
            pu.QueryAndGroup(0.3, 8, use_xyz=False)(xyz, new)


def test_three_nn_and_interpolate_carry_features():
    xyz, new = _clouds(seed=2)
    dist, idx = pu.ThreeNN.apply(new, xyz)
    d2 = ((new.numpy()[:, :, None] - xyz.numpy()[:, None]) ** 2).sum(-1)
    want = np.argsort(d2, axis=-1, kind="stable")[..., :3]
    np.testing.assert_array_equal(idx.numpy(), want)
    np.testing.assert_allclose(dist.numpy(), np.sqrt(np.take_along_axis(d2, want, -1)), rtol=1e-6)
    weight = torch.rand(2, 16, 3)
    feats = torch.randn(2, 5, 64, requires_grad=True)
    out = pu.three_interpolate(feats, idx, weight)
    ref = sum(torch.stack([feats[b][:, idx[b, :, k].long()] * weight[b, :, k] for b in range(2)]) for k in range(3))
    torch.testing.assert_close(out, ref)
    out.sum().backward()  # the gradient reaches the features, as pointnet2_ops' backward gives it
    assert feats.grad is not None and feats.grad.abs().sum() > 0


def _segments(n=(40, 25), seed=3):
    g = torch.Generator().manual_seed(seed)
    xyz = torch.rand(sum(n), 3, generator=g)
    return xyz, torch.tensor(np.cumsum(n), dtype=torch.int32)


def test_pointops_knn_query_pads_with_minus_one_at_1e5():
    xyz, offset = _segments((40, 5))
    idx, dist = pointops.knn_query(8, xyz, offset)
    assert idx.dtype == torch.int32
    for i in range(45):
        seg = range(0, 40) if i < 40 else range(40, 45)
        d = {j: float(((xyz[i] - xyz[j]) ** 2).sum()) for j in seg}
        order = sorted(d, key=lambda j: (d[j], j))[:8]
        assert idx[i, :len(order)].tolist() == order
        assert idx[i, len(order):].tolist() == [-1] * (8 - len(order))
        assert dist[i, len(order):].tolist() == [1e5] * (8 - len(order))


def test_pointops_grouping_reads_minus_one_as_zeros():
    xyz, offset = _segments((30, 4), seed=4)
    feat = torch.randn(34, 6)
    idx, _ = pointops.knn_query(6, xyz, offset)
    got = pointops.grouping(idx, feat, xyz, with_xyz=True)
    pad = idx < 0
    rel = xyz[idx.clamp(min=0).long()] - xyz[:, None]
    torch.testing.assert_close(got[..., :3], torch.where(pad[..., None], torch.zeros(()), rel))
    torch.testing.assert_close(got[..., 3:], torch.where(pad[..., None], torch.zeros(()), feat[idx.clamp(min=0).long()]))
    grouped, idx2 = pointops.knn_query_and_group(feat, xyz, offset, nsample=6)
    assert torch.equal(idx2, idx) and torch.equal(grouped, got[..., 3:])


def test_pointops_interpolation_is_inverse_distance_weighting():
    src, src_off = _segments((20, 2), seed=5)  # the second segment has 2 points for k = 3
    dst, dst_off = _segments((15, 6), seed=6)
    feat = torch.randn(22, 4)
    got = pointops.interpolation(src, dst, feat, src_off, dst_off)
    idx, dist = pointops.knn_query(3, src, src_off, dst, dst_off)
    w = 1 / (dist.double() + 1e-8)
    w = w / w.sum(1, keepdim=True)
    want = sum(feat.double()[idx[:, k].long()] * w[:, k:k + 1] for k in range(3))  # -1: the last row, as pointops
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_pointops_sampling_and_batches():
    xyz, offset = _segments((30, 20), seed=7)
    got = pointops.farthest_point_sampling(xyz, offset, torch.tensor([5, 9], dtype=torch.int32))
    assert got.dtype == torch.int32 and got[0] == 0 and got[5] == 30
    assert torch.equal(pointops.offset2batch(offset), torch.repeat_interleave(torch.arange(2), torch.tensor([30, 20])))
    assert pointops.batch2offset(pointops.offset2batch(offset)).tolist() == [30, 50]
    idx, _ = pointops.ball_query(64, 0.3, 0.0, xyz, offset)
    for i in (0, 35):
        seg = range(0, 30) if i < 30 else range(30, 50)
        want = {j for j in seg if float(((xyz[i] - xyz[j]) ** 2).sum()) < 0.09}
        assert {j for j in idx[i].tolist() if j >= 0} == want


def _conv(x, weight, bias, padding):
    return torch.nn.functional.conv2d(x, weight, bias, padding=padding)


def test_mmcv_modulated_deform_conv_with_zero_offsets_is_a_scaled_conv():
    torch.manual_seed(0)
    layer = mmcv.ops.ModulatedDeformConv2dPack(4, 6, 3, padding=1)  # conv_offset starts at zero
    layer.bias.data.normal_()
    x = torch.randn(2, 4, 9, 7)
    # Zero offsets sample the grid itself; the mask is sigmoid(0) = 0.5 on every sample.
    torch.testing.assert_close(layer(x), 0.5 * _conv(x, layer.weight, None, 1) + layer.bias[:, None, None])
    assert set(layer.state_dict()) == {"weight", "bias", "conv_offset.weight", "conv_offset.bias"}


def test_mmcv_deform_conv_with_integer_offsets_shifts_the_input():
    torch.manual_seed(1)
    layer = mmcv.ops.DeformConv2d(3, 5, 3, padding=1)
    x = torch.randn(1, 3, 8, 8)
    offset = torch.zeros(1, 18, 8, 8)
    offset[:, 1::2] = 1.0  # every sample one column to the right: dx = 1
    # Output column c reads input columns c, c + 1, c + 2 (zero past the edge): a plain convolution
    # over the input padded with two zero columns on the right only.
    shifted = torch.nn.functional.pad(x, (0, 2, 1, 1))
    torch.testing.assert_close(layer(x, offset), _conv(shifted, layer.weight, None, 0), atol=1e-5, rtol=1e-5)
    small = torch.randn(1, 3, 2, 2)  # smaller than the kernel: padded, then cut back, as mmcv does
    assert layer(small, torch.zeros(1, 18, 2, 2)).shape == (1, 5, 2, 2)
    with pytest.raises(ValueError, match="bias=True is not supported"):
        mmcv.ops.DeformConv2d(3, 5, 3, bias=True)


def test_mmcv_pack_loads_checkpoints_from_before_conv_offset():
    layer = mmcv.ops.DeformConv2dPack(2, 2, 3, padding=1)
    old = collections.OrderedDict(weight=torch.randn(2, 2, 3, 3), **{"_offset.weight": torch.randn(18, 2, 3, 3),
                                                                    "_offset.bias": torch.randn(18)})
    old._metadata = {"": {"version": 1}}  # what torch writes for a module saved at version 1
    bias = old["_offset.bias"].clone()
    layer.load_state_dict(old)
    assert torch.equal(layer.conv_offset.bias.detach(), bias)


def test_substitutions_leave_an_installed_compat_module_alone():
    # Rules keyed on pointnet2_ops' Functions resolve to the compat classes once the compat module
    # is installed under the package's name: they already run opbridge's ops and stay as they are.
    import sys

    sys.modules["pointnet2_ops.pointnet2_utils"] = pu
    try:
        with opbridge.substitutions() as applied:
            assert pu.BallQuery.apply is pu.ball_query
            assert "pointnet2_ops.pointnet2_utils.BallQuery" not in applied
    finally:
        del sys.modules["pointnet2_ops.pointnet2_utils"]
