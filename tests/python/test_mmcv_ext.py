"""opbridge.compat.mmcv._ext's deformable and point-cloud functions, called as mmcv 2.x's ops/*.py
call them (outputs passed in and filled, sizes as keywords), against independent references:
PyTorch's own convolution (a deformable convolution with zero offsets and unit masks is one),
grid_sample for the attention, numpy indexing and brute-force searches for the point ops."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from opbridge.compat.mmcv import _ext

GEOMETRY = dict(kW=3, kH=3, dW=1, dH=2, padW=1, padH=0, dilationW=1, dilationH=1, group=1, deformable_group=1)
MODULATED = dict(kernel_h=3, kernel_w=3, stride_h=2, stride_w=1, pad_h=0, pad_w=1, dilation_h=1, dilation_w=1, group=1,
                 deformable_group=1)


def _conv_case():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 4, 9, 8, generator=g, dtype=torch.float64), torch.randn(5, 4, 3, 3, generator=g,
                                                                                    dtype=torch.float64)
    out = F.conv2d(x, w, stride=(2, 1), padding=(0, 1))
    offset = torch.zeros(2, 18, *out.shape[2:], dtype=torch.float64)
    return x, w, offset, out


def test_deform_conv_forward_and_backward_fill_what_a_convolution_gives_at_zero_offsets():
    x, w, offset, expected = _conv_case()
    output = torch.empty_like(expected)
    _ext.deform_conv_forward(x, w, offset, output, x.new_empty(0), x.new_empty(0), im2col_step=32, **GEOMETRY)
    torch.testing.assert_close(output, expected)
    grad_out = torch.randn_like(expected)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    F.conv2d(xr, wr, stride=(2, 1), padding=(0, 1)).backward(grad_out)
    grad_input, grad_offset = torch.zeros_like(x), torch.zeros_like(offset)
    _ext.deform_conv_backward_input(x, offset, grad_out, grad_input, grad_offset, w, x.new_empty(0), im2col_step=32,
                                    **GEOMETRY)
    torch.testing.assert_close(grad_input, xr.grad)
    grad_weight = torch.ones_like(w)  # mmcv accumulates into it, times scale
    _ext.deform_conv_backward_parameters(x, offset, grad_out, grad_weight, x.new_empty(0), x.new_empty(0), scale=0.5,
                                         im2col_step=32, **GEOMETRY)
    torch.testing.assert_close(grad_weight, 1 + 0.5 * wr.grad)


@pytest.mark.parametrize("with_bias", [True, False])
def test_modulated_deform_conv_fills_a_convolution_with_bias_at_zero_offsets_and_unit_masks(with_bias):
    x, w, offset, expected = _conv_case()
    bias = torch.randn(5, dtype=torch.float64) if with_bias else x.new_empty(0)
    mask = torch.ones(2, 9, *expected.shape[2:], dtype=torch.float64)
    output = torch.empty_like(expected)
    _ext.modulated_deform_conv_forward(x, w, bias, x.new_empty(0), offset, mask, output, x.new_empty(0),
                                       with_bias=with_bias, **MODULATED)
    torch.testing.assert_close(output, expected + (bias[None, :, None, None] if with_bias else 0))
    grad_out = torch.randn_like(expected)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    F.conv2d(xr, wr, stride=(2, 1), padding=(0, 1)).backward(grad_out)
    grads = [torch.zeros_like(t) for t in (x, w, torch.empty(5, dtype=torch.float64), offset, mask)]
    _ext.modulated_deform_conv_backward(x, w, bias, x.new_empty(0), offset, mask, x.new_empty(0), *grads, grad_out,
                                        with_bias=with_bias, **MODULATED)
    torch.testing.assert_close(grads[0], xr.grad)
    torch.testing.assert_close(grads[1], wr.grad)
    torch.testing.assert_close(grads[2], grad_out.sum((0, 2, 3)) if with_bias else torch.zeros(5, dtype=torch.float64))


def test_ms_deform_attn_forward_returns_what_grid_sample_gives():
    g = torch.Generator().manual_seed(1)
    shapes = torch.tensor([[4, 5], [2, 3]])
    starts = torch.tensor([0, 20])
    value = torch.randn(1, 26, 2, 4, generator=g, dtype=torch.float64)
    locations = torch.rand(1, 3, 2, 2, 2, 2, generator=g, dtype=torch.float64)
    weights = torch.rand(1, 3, 2, 2, 2, generator=g, dtype=torch.float64)
    out = _ext.ms_deform_attn_forward(value, shapes, starts, locations, weights, im2col_step=64)
    expected = torch.zeros(1, 3, 2, 4, dtype=torch.float64)
    for level, (h, w) in enumerate(shapes.tolist()):
        v = value[0, starts[level]:starts[level] + h * w].reshape(h, w, 2, 4).permute(2, 3, 0, 1)  # (2, 4, h, w)
        grid = (2 * locations[0, :, :, level] - 1).permute(1, 0, 2, 3)  # (heads, queries, points, 2)
        sampled = F.grid_sample(v, grid, mode="bilinear", padding_mode="zeros", align_corners=False)  # (2, 4, 3, P)
        expected[0] += (sampled * weights[0, :, :, level].permute(1, 0, 2)[:, None]).sum(-1).permute(2, 0, 1)
    torch.testing.assert_close(out, expected.reshape(1, 3, 8))


def _clouds(seed=2, b=2, n=40, m=12):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, n, 3, generator=g), torch.rand(b, m, 3, generator=g)


def test_point_functions_fill_what_indexing_and_brute_force_give():
    xyz, centres = _clouds()
    d2 = ((centres[:, :, None] - xyz[:, None]) ** 2).sum(-1).numpy()  # (b, m, n)
    idx = torch.zeros(2, 12, 5, dtype=torch.int32)
    _ext.ball_query_forward(centres, xyz, idx, b=2, n=40, m=12, min_radius=0.0, max_radius=0.3, nsample=5)
    for bi in range(2):
        for j in range(12):
            hits = np.flatnonzero(d2[bi, j] < np.float32(0.3) ** 2)[:5]
            want = list(hits) + [hits[0] if len(hits) else 0] * (5 - len(hits))
            assert idx[bi, j].tolist() == want
    shell = torch.zeros(2, 12, 5, dtype=torch.int32)  # mmcv's shell: d2 == 0 or 0.1² <= d2 < 0.3²
    _ext.ball_query_forward(centres, xyz, shell, b=2, n=40, m=12, min_radius=0.1, max_radius=0.3, nsample=5)
    for bi in range(2):
        for j in range(12):
            d = d2[bi, j]
            hits = np.flatnonzero((d == 0) | ((d >= np.float32(0.1) ** 2) & (d < np.float32(0.3) ** 2)))[:5]
            assert shell[bi, j].tolist() == list(hits) + [hits[0] if len(hits) else 0] * (5 - len(hits))
    with pytest.raises(NotImplementedError, match="max_radius=0.0"):
        _ext.ball_query_forward(centres, xyz, idx, b=2, n=40, m=12, min_radius=-1.0, max_radius=0.0, nsample=5)

    dist2, nearest = torch.empty(2, 12, 3), torch.empty(2, 12, 3, dtype=torch.int32)
    _ext.three_nn_forward(centres, xyz, dist2, nearest, b=2, n=12, m=40)
    order = np.argsort(d2, -1, kind="stable")[..., :3]
    assert (nearest.numpy() == order).all()
    np.testing.assert_allclose(dist2.numpy(), np.take_along_axis(d2, order, -1), rtol=1e-5, atol=1e-7)

    knn_idx, knn_d2 = torch.zeros(2, 12, 4, dtype=torch.int32), torch.zeros(2, 12, 4)
    _ext.knn_forward(xyz, centres, knn_idx, knn_d2, b=2, n=40, m=12, nsample=4)
    assert (knn_idx.numpy() == np.argsort(d2, -1, kind="stable")[..., :4]).all()

    features = torch.randn(2, 6, 40)
    out = torch.zeros(2, 6, 12, 5)
    _ext.group_points_forward(features, idx, out, b=2, c=6, n=40, npoints=12, nsample=5)
    assert torch.equal(out, torch.stack([features[bi][:, idx[bi].long()] for bi in range(2)]))
    grad = torch.zeros(2, 6, 40)
    _ext.group_points_backward(torch.ones(2, 6, 12, 5), idx, grad, b=2, c=6, n=40, npoints=12, nsample=5)
    counts = torch.stack([torch.bincount(idx[bi].flatten().long(), minlength=40) for bi in range(2)]).float()
    assert torch.equal(grad, counts[:, None].expand(2, 6, 40))

    picks = idx[:, :, 0].contiguous()
    gathered = torch.zeros(2, 6, 12)
    _ext.gather_points_forward(features, picks, gathered, b=2, c=6, n=40, npoints=12)
    assert torch.equal(gathered, torch.stack([features[bi][:, picks[bi].long()] for bi in range(2)]))

    weight = torch.rand(2, 12, 3)
    interpolated = torch.zeros(2, 6, 12)
    _ext.three_interpolate_forward(features, nearest, weight, interpolated, b=2, c=6, m=40, n=12)
    want = sum(features.gather(2, nearest[..., k].long()[:, None].expand(2, 6, 12)) * weight[:, None, :, k]
               for k in range(3))
    torch.testing.assert_close(interpolated, want)


def test_furthest_point_sampling_forward_fills_the_farthest_first_order():
    xyz, _ = _clouds(seed=3, n=50)
    idx = torch.zeros(2, 8, dtype=torch.int32)
    _ext.furthest_point_sampling_forward(xyz, torch.full((2, 50), 1e10), idx, b=2, n=50, m=8)
    for bi in range(2):
        p = xyz[bi].double().numpy()
        picked, dist = [0], np.full(50, np.inf)
        for _ in range(7):
            dist = np.minimum(dist, ((p - p[picked[-1]]) ** 2).sum(1))
            picked.append(int(np.argmax(dist)))
        assert idx[bi].tolist() == picked


def test_functions_opbridge_does_not_provide_exist_and_raise_naming_the_function_and_its_caller():
    assert "nms" in _ext.PROVIDED and "sigmoid_focal_loss_forward" not in _ext.PROVIDED
    with pytest.raises(RuntimeError,
                       match=r"mmcv\._ext\.sigmoid_focal_loss_forward \(called by mmcv\.ops\.focal_loss\)"):
        _ext.sigmoid_focal_loss_forward(torch.zeros(1, 3))
    assert _ext.get_compiling_cuda_version() == "not available"
