"""mmcv's point-cloud Functions (mmdet3d's PointNet++, VoteNet, 3DSSD, DGCNN layers) on opbridge's
point ops, as substitution rules (opbridge.export and opbridge.substitutions() apply them).

Two of mmcv's Python wrappers cannot run on a CPU build of PyTorch, whatever `mmcv._ext` holds:
`FurthestPointSampling.forward` allocates `torch.cuda.IntTensor` / `torch.cuda.FloatTensor`, and
`KNN.forward` asks `torch.cuda.current_device()`. Substituted, they run eagerly on the CPU and
export as one node each. The op definitions declare the rules for `FurthestPointSampling`,
`FurthestPointSamplingWithDist`, `GatherPoints`, `ThreeNN` and `ThreeInterpolate`, whose calls
bind to an op one to one; the rules here check or convert what mmcv passes first:

- `BallQuery.apply(min_radius, max_radius, sample_num, xyz, center_xyz)`: opbridge::ball_query with
  min_radius (a shell for min_radius > 0, mmcv's rule);
- `GroupingOperation.apply(features, indices)`: opbridge::group_points (differentiable);
- `KNN.apply(k, xyz, center_xyz=None, transposed=False)`: opbridge::knn_points, its indices as mmcv
  returns them, (B, k, npoint) int32.

mmcv's stacked forms (the `*_batch_cnt` arguments) are refused, naming the argument: opbridge has
no stacked ball query or grouping.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

import opbridge

opbridge.load_torch()  # torch.ops.opbridge.* exist from here on

__all__ = ["BALL_QUERY", "GROUPING", "KNN", "ball_query", "grouping_operation", "knn"]

BALL_QUERY = "mmcv.ops.ball_query.BallQuery"
GROUPING = "mmcv.ops.group_points.GroupingOperation"
KNN = "mmcv.ops.knn.KNN"


def _unstacked(api: str, **batch_counts: Optional[Tensor]) -> None:
    given = [name for name, value in batch_counts.items() if value is not None]
    if given:
        raise NotImplementedError(f"mmcv.ops.{api}: the stacked form ({', '.join(given)}) is not provided by opbridge; "
                                  f"pass (B, N, ...) batches without batch counts")


def ball_query(min_radius: float, max_radius: float, sample_num: int, xyz: Tensor, center_xyz: Tensor,
               xyz_batch_cnt: Optional[Tensor] = None, center_xyz_batch_cnt: Optional[Tensor] = None) -> Tensor:
    """mmcv.ops.ball_query: (B, npoint, sample_num) int32, per centre the first sample_num points
    (by index) at squared distance in [min_radius², max_radius²) or 0."""
    _unstacked("ball_query", xyz_batch_cnt=xyz_batch_cnt, center_xyz_batch_cnt=center_xyz_batch_cnt)
    if not min_radius < max_radius:  # mmcv asserts it
        raise ValueError(f"mmcv.ops.ball_query: min_radius ({min_radius}) must be below max_radius ({max_radius})")
    if min_radius < 0:  # mmcv squares it; the op takes a radius
        raise ValueError(f"mmcv.ops.ball_query: min_radius must be >= 0, got {min_radius}")
    return torch.ops.opbridge.ball_query(xyz, center_xyz, float(max_radius), int(sample_num),
                                         min_radius=float(min_radius))


def grouping_operation(features: Tensor, indices: Tensor, features_batch_cnt: Optional[Tensor] = None,
                       indices_batch_cnt: Optional[Tensor] = None) -> Tensor:
    """mmcv.ops.grouping_operation: (B, C, npoint, nsample), features[b, :, indices[b, j, k]]."""
    _unstacked("grouping_operation", features_batch_cnt=features_batch_cnt, indices_batch_cnt=indices_batch_cnt)
    return torch.ops.opbridge.group_points(features.contiguous(), indices.contiguous())


def knn(k: int, xyz: Tensor, center_xyz: Optional[Tensor] = None, transposed: bool = False) -> Tensor:
    """mmcv.ops.knn: (B, k, npoint) int32, the k nearest points of xyz to each centre, nearest first
    (ties to the lower index); xyz and center_xyz (B, 3, N) when transposed."""
    if not 0 < k < 100:  # mmcv asserts it (its CUDA heap)
        raise ValueError(f"mmcv.ops.knn: k should be in range(0, 100), got {k}")
    if center_xyz is None:
        center_xyz = xyz
    if transposed:
        xyz, center_xyz = xyz.transpose(2, 1), center_xyz.transpose(2, 1)
    _, idx = torch.ops.opbridge.knn_points(center_xyz.contiguous(), xyz.contiguous(), None, None, int(k))
    return idx.transpose(2, 1).to(torch.int32).contiguous()


opbridge.substitute(BALL_QUERY, ball_query, doc="opbridge.compat.mmcv.points: opbridge::ball_query with min_radius")
opbridge.substitute(GROUPING, grouping_operation, doc="opbridge.compat.mmcv.points: opbridge::group_points")
opbridge.substitute(KNN, knn, doc="opbridge.compat.mmcv.points: opbridge::knn_points, (B, k, npoint) int32")
