"""pointnet2_ops.pointnet2_utils on opbridge's ops, with pointnet2_ops 3.0's signatures, dtypes
and return types, running on the CPU (the real kernels are CUDA-only):

    furthest_point_sample(xyz, npoint)          -> (B, npoint) int32
    gather_operation(features, idx)             -> (B, C, npoint)
    ball_query(radius, nsample, xyz, new_xyz)   -> (B, npoint, nsample) int32
    grouping_operation(features, idx)           -> (B, C, npoint, nsample)
    three_nn(unknown, known)                    -> (dist, idx): (B, n, 3) distances, int32
    three_interpolate(features, idx, weight)    -> (B, C, n)

Each is also the `apply` of a class of the real module's name (FurthestPointSampling,
GatherOperation, BallQuery, GroupingOperation, ThreeNN, ThreeInterpolate), for code that calls
`BallQuery.apply(...)`; gradients flow where pointnet2_ops defines them (gather, grouping,
interpolation, to the features). QueryAndGroup and GroupAll are the real modules' layers.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from .. import _batches  # noqa: F401  loads opbridge's ops

__all__ = ["BallQuery", "FurthestPointSampling", "GatherOperation", "GroupAll", "GroupingOperation", "QueryAndGroup",
           "ThreeInterpolate", "ThreeNN", "ball_query", "furthest_point_sample", "gather_operation",
           "grouping_operation", "three_interpolate", "three_nn"]

_ops = torch.ops.opbridge


def furthest_point_sample(xyz: Tensor, npoint: int) -> Tensor:
    """npoint indices of each batch item's points (B, N, 3), each the furthest from those before;
    the first is point 0."""
    return _ops.furthest_point_sampling(xyz, int(npoint))


def gather_operation(features: Tensor, idx: Tensor) -> Tensor:
    """features (B, C, N) at idx (B, npoint): (B, C, npoint)."""
    return _ops.gather_points(features, idx)


def ball_query(radius: float, nsample: int, xyz: Tensor, new_xyz: Tensor) -> Tensor:
    """For each centre of new_xyz (B, npoint, 3), the first nsample points of xyz (B, N, 3) closer
    than radius, in index order, padded with the first one found (0 when none is)."""
    return _ops.ball_query(xyz, new_xyz, radius=float(radius), nsample=int(nsample))


def grouping_operation(features: Tensor, idx: Tensor) -> Tensor:
    """features (B, C, N) at idx (B, npoint, nsample): (B, C, npoint, nsample)."""
    return _ops.group_points(features, idx)


def three_nn(unknown: Tensor, known: Tensor) -> tuple[Tensor, Tensor]:
    """The three nearest known points (B, m, 3) of each unknown point (B, n, 3): (distances, int32
    indices), nearest first."""
    return _ops.three_nn(unknown, known)


def three_interpolate(features: Tensor, idx: Tensor, weight: Tensor) -> Tensor:
    """Σ_k features[b, :, idx[b, i, k]] · weight[b, i, k]: (B, C, n) from features (B, C, m)."""
    return _ops.three_interpolate(features, idx, weight)


def _function(name: str, fn) -> type:
    """A class with the real Function's name whose apply is `fn`."""
    return type(name, (), {"apply": staticmethod(fn), "__doc__": f"{name}.apply is {fn.__name__}", "__module__": __name__})


FurthestPointSampling = _function("FurthestPointSampling", furthest_point_sample)
GatherOperation = _function("GatherOperation", gather_operation)
BallQuery = _function("BallQuery", ball_query)
GroupingOperation = _function("GroupingOperation", grouping_operation)
ThreeNN = _function("ThreeNN", three_nn)
ThreeInterpolate = _function("ThreeInterpolate", three_interpolate)


class QueryAndGroup(nn.Module):
    """Groups the points within `radius` of each centre (at most nsample): forward(xyz (B, N, 3),
    new_xyz (B, npoint, 3), features (B, C, N) or None) -> (B, 3 + C, npoint, nsample), the
    coordinates relative to the centre first (only them without features, only the features with
    use_xyz=False)."""

    def __init__(self, radius: float, nsample: int, use_xyz: bool = True):
        super().__init__()
        self.radius, self.nsample, self.use_xyz = radius, nsample, use_xyz

    def forward(self, xyz: Tensor, new_xyz: Tensor, features: Optional[Tensor] = None) -> Tensor:
        idx = ball_query(self.radius, self.nsample, xyz, new_xyz)
        grouped_xyz = grouping_operation(xyz.transpose(1, 2).contiguous(), idx)
        grouped_xyz = grouped_xyz - new_xyz.transpose(1, 2).unsqueeze(-1)
        if features is None:
            if not self.use_xyz:
                raise ValueError("QueryAndGroup: without features, use_xyz must be True (nothing to group)")
            return grouped_xyz
        grouped = grouping_operation(features, idx)
        return torch.cat([grouped_xyz, grouped], dim=1) if self.use_xyz else grouped


class GroupAll(nn.Module):
    """All points as one group: forward(xyz (B, N, 3), new_xyz (ignored), features (B, C, N) or
    None) -> (B, 3 + C, 1, N), absolute coordinates first (only them without features)."""

    def __init__(self, use_xyz: bool = True):
        super().__init__()
        self.use_xyz = use_xyz

    def forward(self, xyz: Tensor, new_xyz: Optional[Tensor], features: Optional[Tensor] = None) -> Tensor:
        grouped_xyz = xyz.transpose(1, 2).unsqueeze(2)
        if features is None:
            return grouped_xyz
        grouped = features.unsqueeze(2)
        return torch.cat([grouped_xyz, grouped], dim=1) if self.use_xyz else grouped
