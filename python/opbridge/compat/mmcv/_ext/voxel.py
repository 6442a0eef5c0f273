"""mmcv._ext's voxelization and point-to-voxel scatter functions on opbridge's hard_voxelize,
dynamic_voxelize and dynamic_scatter ops, with the calling convention mmcv/ops/voxelize.py and
mmcv/ops/scatter_points.py use (the keyword names of mmcv's extension):

    hard_voxelize_forward(points, voxel_size, coors_range, voxels, coors, num_points_per_voxel,
                          voxel_num, max_points, max_voxels, NDim, deterministic)
        fills voxels[:M], coors[:M], num_points_per_voxel[:M] and voxel_num (a 0-d int64) in place
    dynamic_voxelize_forward(points, voxel_size, coors_range, coors, NDim) fills coors (N, 3)
    dynamic_point_to_voxel_forward(feats, coors, reduce_type)
        -> [voxel_feats, voxel_coors, point2voxel, voxel_points_count]
    dynamic_point_to_voxel_backward(grad_feats, grad_reduced_feats, feats, reduced_feats,
                                    coors_idx, reduce_count, reduce_type) fills grad_feats

voxel_size and coors_range are float32 tensors, as mmcv passes them. deterministic=False (mmcv's
CUDA variant whose voxel order follows its threads; its CPU build has none) gets the
deterministic result, which is one of the orders that variant may give.
"""

from __future__ import annotations

from typing import List

import torch
from torch import Tensor

import opbridge

from .unprovided import NotProvidedError

opbridge.load_torch()
_OPS = torch.ops.opbridge

__all__ = ["dynamic_point_to_voxel_backward", "dynamic_point_to_voxel_forward", "dynamic_voxelize_forward",
           "hard_voxelize_forward"]


def _floats(t: Tensor) -> List[float]:
    return [float(v) for v in t.detach().float().reshape(-1).tolist()]


def _three_dims(name: str, ndim: int) -> None:
    if ndim != 3:
        raise NotProvidedError(f"mmcv._ext.{name} (called by mmcv.ops.Voxelization): NDim={ndim}; opbridge's "
                               f"voxelization takes 3 dimensions (x, y, z), as mmcv's Python ops pass")


def hard_voxelize_forward(points: Tensor, voxel_size: Tensor, coors_range: Tensor, voxels: Tensor, coors: Tensor,
                          num_points_per_voxel: Tensor, voxel_num: Tensor, max_points: int, max_voxels: int,
                          NDim: int = 3, deterministic: bool = True) -> None:  # noqa: N803 (mmcv's name)
    """Voxels in the order of their first point, at most max_points points each (the first ones)
    and max_voxels voxels; coors (z, y, x)."""
    _three_dims("hard_voxelize_forward", NDim)
    got = _OPS.hard_voxelize(points, _floats(voxel_size), _floats(coors_range), int(max_points), int(max_voxels))
    m = got[0].shape[0]
    for name, buffer, value in (("voxels", voxels, got[0]), ("coors", coors, got[1]),
                                ("num_points_per_voxel", num_points_per_voxel, got[2])):
        if buffer.shape[0] < m or buffer.shape[1:] != value.shape[1:]:
            raise RuntimeError(f"mmcv._ext.hard_voxelize_forward: {name} must hold at least {m} voxels of shape "
                               f"{tuple(value.shape[1:])}, got {tuple(buffer.shape)}")
    with torch.no_grad():
        voxels[:m].copy_(got[0])
        coors[:m].copy_(got[1])
        num_points_per_voxel[:m].copy_(got[2])
        voxel_num.fill_(m)


def dynamic_voxelize_forward(points: Tensor, voxel_size: Tensor, coors_range: Tensor, coors: Tensor,
                             NDim: int = 3) -> None:  # noqa: N803 (mmcv's name)
    """Each point's (z, y, x) voxel, -1s outside the range."""
    _three_dims("dynamic_voxelize_forward", NDim)
    with torch.no_grad():
        coors.copy_(_OPS.dynamic_voxelize(points, _floats(voxel_size), _floats(coors_range)))


def dynamic_point_to_voxel_forward(feats: Tensor, coors: Tensor, reduce_type: str) -> List[Tensor]:
    """The features reduced into the distinct coordinate rows (sorted, rows with a negative entry
    dropped), the rows, each point's voxel (-1: dropped) and each voxel's count."""
    return list(_OPS.dynamic_scatter(feats, coors, str(reduce_type)))


def dynamic_point_to_voxel_backward(grad_feats: Tensor, grad_reduced_feats: Tensor, feats: Tensor,
                                    reduced_feats: Tensor, coors_idx: Tensor, reduce_count: Tensor,
                                    reduce_type: str) -> None:
    """grad_feats (overwritten, as mmcv's kernel zeroes it first): the gradient of the reduction."""
    with torch.no_grad():
        grad_feats.copy_(_OPS.dynamic_scatter_backward(grad_reduced_feats.contiguous(), feats, reduced_feats,
                                                       coors_idx, reduce_count, str(reduce_type)))
