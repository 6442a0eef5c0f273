"""mmdet3d's PointNet++ backbones (PointNet2SASSG: VoteNet, H3DNet, PointNet++ segmentation;
PointNet2SAMSG: 3DSSD, PointNet++ MSG segmentation) with the point count kept symbolic, as
substitution rules (opbridge.export and opbridge.substitutions() apply them).

Both forwards number the input points with `xyz.new_tensor(range(num_points))`: a Python range
over the point count, which torch.export specializes to the example's count and torch.jit.trace
records as a constant (the exported graph then gathers past the end of a smaller cloud). The rules
run the same layers in the same order, the numbering made by torch.arange.
"""

from __future__ import annotations

import torch
from torch import Tensor

import opbridge

__all__ = ["msg_forward", "ssg_forward"]

_MODULE = "mmdet3d.models.backbones"


def _numbered(xyz: Tensor) -> Tensor:
    """(B, N) int64: each batch item's point indices 0 .. N - 1, N symbolic."""
    batch, num_points = xyz.shape[:2]
    return torch.arange(num_points, device=xyz.device).unsqueeze(0).repeat(batch, 1)


def ssg_forward(self, points: Tensor) -> dict:
    """PointNet2SASSG.forward: the SA modules, then the FP modules; fp_* and sa_* lists."""
    xyz, features = self._split_point_feats(points)
    sa_xyz, sa_features, sa_indices = [xyz], [features], [_numbered(xyz)]
    for i in range(self.num_sa):
        cur_xyz, cur_features, cur_indices = self.SA_modules[i](sa_xyz[i], sa_features[i])
        sa_xyz.append(cur_xyz)
        sa_features.append(cur_features)
        sa_indices.append(torch.gather(sa_indices[-1], 1, cur_indices.long()))
    fp_xyz, fp_features, fp_indices = [sa_xyz[-1]], [sa_features[-1]], [sa_indices[-1]]
    for i in range(self.num_fp):
        j = self.num_sa - i - 1  # the level the i-th FP module propagates to
        fp_features.append(self.FP_modules[i](sa_xyz[j], sa_xyz[j + 1], sa_features[j], fp_features[-1]))
        fp_xyz.append(sa_xyz[j])
        fp_indices.append(sa_indices[j])
    return dict(fp_xyz=fp_xyz, fp_features=fp_features, fp_indices=fp_indices, sa_xyz=sa_xyz,
                sa_features=sa_features, sa_indices=sa_indices)


def msg_forward(self, points: Tensor) -> dict:
    """PointNet2SAMSG.forward: the SA modules (each with its aggregation MLP, if any); the levels
    in out_indices, after the input, as sa_* lists."""
    xyz, features = self._split_point_feats(points)
    indices = _numbered(xyz)
    sa_xyz, sa_features, sa_indices = [xyz], [features], [indices]
    out_xyz, out_features, out_indices = [xyz], [features], [indices]
    for i in range(self.num_sa):
        cur_xyz, cur_features, cur_indices = self.SA_modules[i](sa_xyz[i], sa_features[i])
        if self.aggregation_mlps[i] is not None:
            cur_features = self.aggregation_mlps[i](cur_features)
        sa_xyz.append(cur_xyz)
        sa_features.append(cur_features)
        sa_indices.append(torch.gather(sa_indices[-1], 1, cur_indices.long()))
        if i in self.out_indices:
            out_xyz.append(sa_xyz[-1])
            out_features.append(sa_features[-1])
            out_indices.append(sa_indices[-1])
    return dict(sa_xyz=out_xyz, sa_features=out_features, sa_indices=out_indices)


opbridge.substitute(f"{_MODULE}.pointnet2_sa_ssg.PointNet2SASSG.forward", ssg_forward,
                    doc="opbridge.compat.mmdet3d.pointnet2: the point numbering by torch.arange")
opbridge.substitute(f"{_MODULE}.pointnet2_sa_msg.PointNet2SAMSG.forward", msg_forward,
                    doc="opbridge.compat.mmdet3d.pointnet2: the point numbering by torch.arange")
