"""mmcv._ext's point-cloud functions (mmdet3d's PointNet++ layers) on opbridge's point ops:
furthest point sampling, ball query, gathering and grouping, three_nn / three_interpolate and kNN.
Parameters keep the names of mmcv's bindings (its pybind.cpp); the b / n / m / c / npoints /
nsample sizes mmcv passes repeat the tensors' sizes, which the ops read from the tensors.
Gradients are added to the zeroed tensors mmcv passes, as its kernels accumulate them."""

from __future__ import annotations

import torch
from torch import Tensor

import opbridge

from .unprovided import NotProvidedError

opbridge.load_torch()
_OPS = torch.ops.opbridge

__all__ = ["ball_query_forward", "furthest_point_sampling_forward", "furthest_point_sampling_with_dist_forward",
           "gather_points_backward", "gather_points_forward",
           "group_points_backward", "group_points_forward", "knn_forward", "three_interpolate_backward",
           "three_interpolate_forward", "three_nn_forward"]


def furthest_point_sampling_forward(points_tensor: Tensor, temp_tensor: Tensor, idx_tensor: Tensor, b: int, n: int,
                                    m: int) -> None:
    """output (B, m) int32: m points per cloud, from point 0, each the furthest from those picked;
    ties broken as mmcv's CUDA block of up to 1024 threads breaks them, points near the origin
    taken like any other (mmcv's kernel does not skip them)."""
    idx_tensor.copy_(_OPS.furthest_point_sampling(points_tensor, m, tie_threads=1024, skip_near_origin=False))


def furthest_point_sampling_with_dist_forward(points_tensor: Tensor, temp_tensor: Tensor, idx_tensor: Tensor,
                                              b: int, n: int, m: int) -> None:
    """output (B, m) int32: furthest point sampling over the (B, N, N) distance matrix, from point
    0, mmcv's tie rule (opbridge::furthest_point_sampling_with_dist)."""
    idx_tensor.copy_(_OPS.furthest_point_sampling_with_dist(points_tensor, m))


def ball_query_forward(new_xyz_tensor: Tensor, xyz_tensor: Tensor, idx_tensor: Tensor, b: int, n: int, m: int,
                       min_radius: float, max_radius: float, nsample: int) -> None:
    """idx (B, m, nsample) int32: per centre the first nsample points (by index) at squared distance
    in [min_radius², max_radius²) or at distance 0, the rest of the slots the first one, an empty
    ball 0 (opbridge::ball_query with min_radius). A ball of radius <= 0, which mmcv's kernel would
    fill with the points on the centre, the op does not take."""
    if max_radius <= 0 or min_radius < 0:
        raise NotProvidedError(
            f"mmcv._ext.ball_query_forward (called by mmcv.ops.ball_query): min_radius={min_radius}, "
            f"max_radius={max_radius}: opbridge::ball_query takes 0 <= min_radius < max_radius only")
    idx_tensor.copy_(_OPS.ball_query(xyz_tensor, new_xyz_tensor, max_radius, nsample, min_radius=min_radius))


def gather_points_forward(points_tensor: Tensor, idx_tensor: Tensor, out_tensor: Tensor, b: int, c: int, n: int,
                          npoints: int) -> None:
    """out[b, c, j] = points[b, c, idx[b, j]]."""
    out_tensor.copy_(_OPS.gather_points(points_tensor, idx_tensor))


def gather_points_backward(grad_out_tensor: Tensor, idx_tensor: Tensor, grad_points_tensor: Tensor, b: int, c: int,
                           n: int, npoints: int) -> None:
    grad_points_tensor.add_(_OPS.gather_points_backward(grad_out_tensor, grad_points_tensor, idx_tensor))


def group_points_forward(points_tensor: Tensor, idx_tensor: Tensor, out_tensor: Tensor, b: int, c: int, n: int,
                         npoints: int, nsample: int) -> None:
    """out[b, c, j, k] = points[b, c, idx[b, j, k]]."""
    out_tensor.copy_(_OPS.group_points(points_tensor, idx_tensor))


def group_points_backward(grad_out_tensor: Tensor, idx_tensor: Tensor, grad_points_tensor: Tensor, b: int, c: int,
                          n: int, npoints: int, nsample: int) -> None:
    grad_points_tensor.add_(_OPS.group_points_backward(grad_out_tensor, grad_points_tensor, idx_tensor))


def three_nn_forward(unknown_tensor: Tensor, known_tensor: Tensor, dist2_tensor: Tensor, idx_tensor: Tensor, b: int,
                     n: int, m: int) -> None:
    """The three nearest source points of each target point: squared distances and int32 indices,
    nearest first, ties to the lower index. opbridge::three_nn gives the distances; mmcv takes their
    square root again, which is the op's value to within a rounding."""
    dist, nearest = _OPS.three_nn(unknown_tensor, known_tensor)
    dist2_tensor.copy_(dist * dist)
    idx_tensor.copy_(nearest)


def three_interpolate_forward(points_tensor: Tensor, idx_tensor: Tensor, weight_tensor: Tensor, out_tensor: Tensor,
                              b: int, c: int, m: int, n: int) -> None:
    """out[b, c, j] = sum over k < 3 of weight[b, j, k] * points[b, c, idx[b, j, k]]."""
    out_tensor.copy_(_OPS.three_interpolate(points_tensor, idx_tensor, weight_tensor))


def three_interpolate_backward(grad_out_tensor: Tensor, idx_tensor: Tensor, weight_tensor: Tensor,
                               grad_points_tensor: Tensor, b: int, c: int, n: int, m: int) -> None:
    grad_points_tensor.add_(_OPS.three_interpolate_backward(grad_out_tensor, grad_points_tensor, idx_tensor,
                                                            weight_tensor)[0])


def knn_forward(xyz_tensor: Tensor, new_xyz_tensor: Tensor, idx_tensor: Tensor, dist2_tensor: Tensor, b: int, n: int,
                m: int, nsample: int) -> None:
    """Per centre the nsample nearest points of its cloud: int32 indices and squared distances,
    nearest first, ties to the lower index (opbridge::knn_points)."""
    dists, nearest = _OPS.knn_points(new_xyz_tensor, xyz_tensor, None, None, nsample)
    dist2_tensor.copy_(dists)
    idx_tensor.copy_(nearest)
