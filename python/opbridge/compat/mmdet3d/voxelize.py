"""mmdet3d's own voxelization and dynamic scatter (mmdet3d.models.data_preprocessors.voxelize,
which its data preprocessor and voxel encoders use instead of mmcv's) on opbridge's
hard_voxelize, dynamic_voxelize and dynamic_scatter ops, as substitution rules: the same rules as
mmcv's twins (opbridge.compat.mmcv.voxel), plus `return_map`, which mmdet3d's copy adds.

Exported as they are, mmdet3d's functions allocate max_voxels-sized buffers and slice them by a
count read as a Python int: the export would hold the example cloud's voxel count.
"""

from __future__ import annotations

from typing import Tuple, Union

import torch
from torch import Tensor

import opbridge

from ..mmcv.voxel import dynamic_scatter_forward, voxelization

opbridge.load_torch()

__all__ = ["dynamic_scatter_3d"]

_MODULE = "mmdet3d.models.data_preprocessors.voxelize"


def dynamic_scatter_3d(feats: Tensor, coors: Tensor, reduce_type: str = "max",
                       return_map: bool = False) -> Union[Tuple[Tensor, Tensor], Tuple[Tensor, Tensor, Tensor]]:
    """mmdet3d's dynamic_scatter_3d: (voxel_feats, voxel_coors[, point2voxel_map])."""
    voxel_feats, voxel_coors, point2voxel, _ = torch.ops.opbridge.dynamic_scatter(feats, coors, reduce_type)
    return (voxel_feats, voxel_coors, point2voxel) if return_map else (voxel_feats, voxel_coors)


opbridge.substitute(f"{_MODULE}._Voxelization", voxelization,
                    doc="opbridge.compat.mmdet3d.voxelize: opbridge::hard_voxelize (dynamic_voxelize for -1)")
opbridge.substitute(f"{_MODULE}._DynamicScatter", dynamic_scatter_3d,
                    doc="opbridge.compat.mmdet3d.voxelize: opbridge::dynamic_scatter")
opbridge.substitute(f"{_MODULE}.DynamicScatter3D.forward", dynamic_scatter_forward,
                    doc="opbridge.compat.mmdet3d.voxelize: one opbridge::dynamic_scatter over every batch item")
