"""mmcv's voxelization and dynamic scatter on opbridge's hard_voxelize, dynamic_voxelize and
dynamic_scatter ops, as substitution rules (opbridge.export and opbridge.substitutions() apply
them), so that a model calling `mmcv.ops.Voxelization` or `mmcv.ops.DynamicScatter` exports to one
node with a data-dependent number of voxels.

mmcv's Python allocates max_voxels-sized buffers and slices them by a count read as a Python int,
and DynamicScatter with batch-first coordinates loops over `range(coors[-1, 0] + 1)`: neither
exporter can carry either. The rules give the same results without them:

- `_Voxelization.apply(points, voxel_size, coors_range, max_points, max_voxels, deterministic)`
  (which Voxelization.forward calls): hard_voxelize, or dynamic_voxelize when max_points or
  max_voxels is -1, as mmcv dispatches.
- `_DynamicScatter.apply(feats, coors, reduce_type)`: dynamic_scatter's voxel features and rows.
- `DynamicScatter.forward(self, points, coors)`: one dynamic_scatter over all the rows. mmcv's loop
  over the batch items reduces each item's points into its sorted voxels and concatenates the items
  in order, which is the lexicographic order of the (batch, z, y, x) rows; rows of a batch item
  past the last row's (which the loop never reaches) are dropped by making them negative first.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple, Union

import torch
from torch import Tensor

import opbridge

from .._batches import traced_nonempty

opbridge.load_torch()  # torch.ops.opbridge.* exist from here on

__all__ = ["DYNAMIC_SCATTER", "DYNAMIC_SCATTER_MODULE", "VOXELIZATION", "dynamic_scatter", "dynamic_scatter_forward",
           "voxelization"]

VOXELIZATION = "mmcv.ops.voxelize._Voxelization"
DYNAMIC_SCATTER = "mmcv.ops.scatter_points._DynamicScatter"
DYNAMIC_SCATTER_MODULE = "mmcv.ops.scatter_points.DynamicScatter.forward"


def _floats(name: str, value: Union[Sequence[float], Tensor, float], count: int) -> List[float]:
    values = value.detach().reshape(-1).tolist() if isinstance(value, Tensor) else value
    if not isinstance(values, (list, tuple)) or len(values) != count:
        raise ValueError(f"mmcv.ops.Voxelization: {name} must hold {count} values, got {value!r}")
    return [float(v) for v in values]


def voxelization(points: Tensor, voxel_size, coors_range, max_points: int = 35, max_voxels: int = 20000,
                 deterministic: bool = True) -> Union[Tensor, Tuple[Tensor, Tensor, Tensor]]:
    """mmcv.ops.voxelize.voxelization: (voxels, coors, num_points_per_voxel), or each point's coors
    for max_points or max_voxels -1. deterministic=False gets the deterministic result (one of
    those mmcv's non-deterministic CUDA variant may give)."""
    size, box = _floats("voxel_size", voxel_size, 3), _floats("coors_range", coors_range, 6)
    if max_points == -1 or max_voxels == -1:
        return torch.ops.opbridge.dynamic_voxelize(points, size, box)
    voxels, coors, counts = torch.ops.opbridge.hard_voxelize(points, size, box, int(max_points), int(max_voxels))
    traced_nonempty(voxels.shape[0])  # a batch norm over the voxels follows
    return voxels, coors, counts


def dynamic_scatter(feats: Tensor, coors: Tensor, reduce_type: str = "max") -> Tuple[Tensor, Tensor]:
    """mmcv.ops.dynamic_scatter: (voxel_feats, voxel_coors), voxels the sorted distinct rows of
    coors without a negative entry; differentiable in feats."""
    voxel_feats, voxel_coors, _, _ = torch.ops.opbridge.dynamic_scatter(feats, coors, reduce_type)
    return voxel_feats, voxel_coors


def dynamic_scatter_forward(self, points: Tensor, coors: Tensor) -> Tuple[Tensor, Tensor]:
    """DynamicScatter(voxel_size, point_cloud_range, average_points)(points, coors): mean (or max)
    per voxel; batch-first coordinates as mmcv's loop over the batch items gives them."""
    reduce = "mean" if self.average_points else "max"
    if coors.size(-1) != 3:
        # mmcv reduces items 0 .. coors[-1, 0]: later ones are dropped, like negative rows.
        past_last = coors[:, :1] > coors[-1:, :1]
        coors = torch.where(past_last, torch.full_like(coors, -1), coors)
    return dynamic_scatter(points.contiguous(), coors.contiguous(), reduce)


opbridge.substitute(VOXELIZATION, voxelization,
                    doc="opbridge.compat.mmcv.voxel: opbridge::hard_voxelize, or dynamic_voxelize for "
                        "max_points / max_voxels -1")
opbridge.substitute(DYNAMIC_SCATTER, dynamic_scatter, doc="opbridge.compat.mmcv.voxel: opbridge::dynamic_scatter")
opbridge.substitute(DYNAMIC_SCATTER_MODULE, dynamic_scatter_forward,
                    doc="opbridge.compat.mmcv.voxel: one opbridge::dynamic_scatter over every batch item")
