"""mmcv._ext's point-cloud functions (mmdet3d's PointNet++ layers) on opbridge's point ops:
furthest point sampling, ball query, gathering and grouping, three_nn / three_interpolate and kNN.
The b / n / m / c / npoints / nsample keywords mmcv passes repeat the tensors' sizes: the ops read
the sizes from the tensors. Gradients are added to the zeroed tensors mmcv passes, as its kernels
accumulate them."""

from __future__ import annotations

import torch
from torch import Tensor

import opbridge

from .unprovided import NotProvidedError

opbridge.load_torch()
_OPS = torch.ops.opbridge

__all__ = ["ball_query_forward", "furthest_point_sampling_forward", "gather_points_backward", "gather_points_forward",
           "group_points_backward", "group_points_forward", "knn_forward", "three_interpolate_backward",
           "three_interpolate_forward", "three_nn_forward"]


def furthest_point_sampling_forward(points_xyz: Tensor, temp: Tensor, output: Tensor, *, b: int, n: int,
                                    m: int) -> None:
    """output (B, m) int32: m points per cloud, from point 0, each the furthest from those picked;
    ties broken as mmcv's CUDA block of up to 1024 threads breaks them, points near the origin
    taken like any other (mmcv's kernel does not skip them)."""
    output.copy_(_OPS.furthest_point_sampling(points_xyz, m, tie_threads=1024, skip_near_origin=False))


def ball_query_forward(center_xyz: Tensor, xyz: Tensor, idx: Tensor, *, b: int, n: int, m: int, min_radius: float,
                       max_radius: float, nsample: int) -> None:
    """idx (B, m, nsample) int32: per centre the first nsample points (by index) within max_radius
    (squared distance below max_radius²), the rest of the slots the first one, an empty ball 0.
    opbridge::ball_query is that rule; a positive min_radius (a shell) it does not take."""
    if min_radius > 0 or max_radius <= 0:
        raise NotProvidedError(
            f"mmcv._ext.ball_query_forward (called by mmcv.ops.ball_query): min_radius={min_radius}, "
            f"max_radius={max_radius}: opbridge::ball_query takes a ball (min_radius 0) of positive radius only")
    idx.copy_(_OPS.ball_query(xyz, center_xyz, max_radius, nsample))


def gather_points_forward(features: Tensor, indices: Tensor, output: Tensor, *, b: int, c: int, n: int,
                          npoints: int) -> None:
    """output[b, c, j] = features[b, c, indices[b, j]]."""
    output.copy_(_OPS.gather_points(features, indices))


def gather_points_backward(grad_out: Tensor, idx: Tensor, grad_features: Tensor, *, b: int, c: int, n: int,
                           npoints: int) -> None:
    grad_features.add_(_OPS.gather_points_backward(grad_out, grad_features, idx))


def group_points_forward(features: Tensor, indices: Tensor, output: Tensor, *, b: int, c: int, n: int, npoints: int,
                         nsample: int) -> None:
    """output[b, c, j, k] = features[b, c, indices[b, j, k]]."""
    output.copy_(_OPS.group_points(features, indices))


def group_points_backward(grad_out: Tensor, idx: Tensor, grad_features: Tensor, *, b: int, c: int, n: int,
                          npoints: int, nsample: int) -> None:
    grad_features.add_(_OPS.group_points_backward(grad_out, grad_features, idx))


def three_nn_forward(target: Tensor, source: Tensor, dist2: Tensor, idx: Tensor, *, b: int, n: int, m: int) -> None:
    """The three nearest source points of each target point: squared distances and int32 indices,
    nearest first, ties to the lower index. opbridge::three_nn gives the distances; mmcv takes their
    square root again, which is the op's value to within a rounding."""
    dist, nearest = _OPS.three_nn(target, source)
    dist2.copy_(dist * dist)
    idx.copy_(nearest)


def three_interpolate_forward(features: Tensor, indices: Tensor, weight: Tensor, output: Tensor, *, b: int, c: int,
                              m: int, n: int) -> None:
    """output[b, c, j] = sum over k < 3 of weight[b, j, k] * features[b, c, indices[b, j, k]]."""
    output.copy_(_OPS.three_interpolate(features, indices, weight))


def three_interpolate_backward(grad_out: Tensor, idx: Tensor, weight: Tensor, grad_features: Tensor, *, b: int,
                               c: int, n: int, m: int) -> None:
    grad_features.add_(_OPS.three_interpolate_backward(grad_out, grad_features, idx, weight)[0])


def knn_forward(xyz: Tensor, center_xyz: Tensor, idx: Tensor, dist2: Tensor, *, b: int, n: int, m: int,
                nsample: int) -> None:
    """Per centre the nsample nearest points of its cloud: int32 indices and squared distances,
    nearest first, ties to the lower index (opbridge::knn_points)."""
    dists, nearest = _OPS.knn_points(center_xyz, xyz, None, None, nsample)
    dist2.copy_(dists)
    idx.copy_(nearest)
