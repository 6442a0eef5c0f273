"""Pointcept's pointops on opbridge's ops, with pointops' signatures, dtypes and return types,
running on the CPU (the real kernels are CUDA-only). Points of a batch are one (n, 3) tensor cut
into segments by cumulative ends `offset` (b,); indices are rows of the whole tensor.

    knn_query(nsample, xyz, offset, new_xyz=None, new_offset=None)   -> (idx int32, dist)
    ball_query(nsample, max_radius, min_radius, xyz, offset, new_xyz=None, new_offset=None) -> (idx int32, dist)
    farthest_point_sampling(xyz, offset, new_offset)                   -> idx int32
    grouping(idx, feat, xyz, new_xyz=None, with_xyz=False)             -> (m, nsample, [3 +] c)
    interpolation(xyz, new_xyz, feat, offset, new_offset, k=3)         -> (m, c)
    knn_query_and_group(...), ball_query_and_group(...), offset2batch, batch2offset

Empty slots are index -1 at distance 1e5, as pointops' kernels leave them; grouping reads -1 as a
row of zeros and interpolation as the last row (at weight ~1e-5), as pointops' Python does.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _batches as b  # loads opbridge's ops

__all__ = ["ball_query", "ball_query_and_group", "batch2offset", "farthest_point_sampling", "grouping",
           "interpolation", "knn_query", "knn_query_and_group", "offset2batch"]

_ops = torch.ops.opbridge
_EMPTY = 1e5  # pointops' distance for an empty slot: sqrt of its 1e10 start
_INT32 = torch.iinfo(torch.int32)


def _offsets(api: str, *offsets: Tensor) -> tuple[Tensor, ...]:
    """The offsets as the ops take them, never truncated: int32 stays int32 and any other integer
    type becomes int64 (the op's two offsets share one type). pointops' kernels read int32, so an
    eager call refuses a value int32 cannot hold, naming `api`; a cast would wrap it (2^33 + 5 to 5)."""
    for name, t in zip(("offset", "new_offset"), offsets):
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise ValueError(f"{api}: {name} must be an integer tensor, got {t.dtype}")
        if b.eager() and t.numel():
            for v in (int(t.min()), int(t.max())):
                if not _INT32.min <= v <= _INT32.max:
                    raise ValueError(f"{api}: {name} holds {v}, which int32 (pointops' offsets) cannot hold")
    if all(t.dtype == torch.int32 for t in offsets):
        return offsets
    return tuple(t.long() for t in offsets)


def knn_query(nsample: int, xyz: Tensor, offset: Tensor, new_xyz: Optional[Tensor] = None,
              new_offset: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """The nsample nearest points of each query's segment, nearest first (ties to the lower row):
    idx (m, nsample) int32 and Euclidean distances."""
    if new_xyz is None or new_offset is None:
        new_xyz, new_offset = xyz, offset
    offset, new_offset = _offsets("pointops.knn_query", offset, new_offset)
    idx, dist = _ops.knn_query(xyz, offset, new_xyz, new_offset, k=int(nsample))
    return idx, dist.masked_fill(idx < 0, _EMPTY)


def ball_query(nsample: int, max_radius: float, min_radius: float, xyz: Tensor, offset: Tensor,
               new_xyz: Optional[Tensor] = None, new_offset: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """pointops' ball query (opbridge::ball_query_offset, which follows its kernel step by step)."""
    if new_xyz is None or new_offset is None:
        new_xyz, new_offset = xyz, offset
    offset, new_offset = _offsets("pointops.ball_query", offset, new_offset)
    return _ops.ball_query_offset(xyz, offset, new_xyz, new_offset, nsample=int(nsample),
                                  max_radius=float(max_radius), min_radius=float(min_radius))


def farthest_point_sampling(xyz: Tensor, offset: Tensor, new_offset: Tensor) -> Tensor:
    """new_offset[i] - new_offset[i - 1] points of segment i, from its first: int32 rows."""
    offset, new_offset = _offsets("pointops.farthest_point_sampling", offset, new_offset)
    return _ops.furthest_point_sampling_offset(xyz, offset, new_offset)


def grouping(idx: Tensor, feat: Tensor, xyz: Tensor, new_xyz: Optional[Tensor] = None,
             with_xyz: bool = False) -> Tensor:
    """feat (n, c) at idx (m, nsample), -1 giving zeros: (m, nsample, c); with_xyz puts the
    coordinates relative to each query (zero at -1) first: (m, nsample, 3 + c)."""
    if new_xyz is None:
        new_xyz = xyz
    m, nsample, c = idx.shape[0], idx.shape[1], feat.shape[1]
    rows = idx.reshape(-1).long()
    padded_feat = torch.cat([feat, feat.new_zeros(1, c)])  # row -1 (the last) is the zero row
    grouped = padded_feat[rows].view(m, nsample, c)
    if not with_xyz:
        return grouped
    padded_xyz = torch.cat([xyz, xyz.new_zeros(1, 3)])
    rel = padded_xyz[rows].view(m, nsample, 3) - new_xyz.unsqueeze(1)
    rel = rel * (idx >= 0).unsqueeze(-1).to(rel.dtype)
    return torch.cat([rel, grouped], -1)


def interpolation(xyz: Tensor, new_xyz: Tensor, feat: Tensor, offset: Tensor, new_offset: Tensor,
                  k: int = 3) -> Tensor:
    """feat (n, c) of the points xyz carried to new_xyz (m, 3) by inverse-distance weights over
    the k nearest points: (m, c) float32."""
    idx, dist = knn_query(k, xyz, offset, new_xyz, new_offset)
    recip = 1.0 / (dist + 1e-8)
    weight = recip / recip.sum(dim=1, keepdim=True)
    out = torch.zeros((new_xyz.shape[0], feat.shape[1]), dtype=torch.float, device=xyz.device)
    for i in range(k):
        out = out + feat[idx[:, i].long(), :] * weight[:, i].unsqueeze(-1)
    return out


def knn_query_and_group(feat: Tensor, xyz: Tensor, offset: Optional[Tensor] = None, new_xyz: Optional[Tensor] = None,
                        new_offset: Optional[Tensor] = None, idx: Optional[Tensor] = None,
                        nsample: Optional[int] = None, with_xyz: bool = False) -> tuple[Tensor, Tensor]:
    """(grouping(idx, feat, xyz, new_xyz, with_xyz), idx), idx from knn_query when not given."""
    if idx is None:
        if nsample is None:
            raise ValueError("pointops.knn_query_and_group: give idx or nsample")
        idx, _ = knn_query(nsample, xyz, offset, new_xyz, new_offset)
    return grouping(idx, feat, xyz, new_xyz, with_xyz), idx


def ball_query_and_group(feat: Tensor, xyz: Tensor, offset: Optional[Tensor] = None, new_xyz: Optional[Tensor] = None,
                         new_offset: Optional[Tensor] = None, idx: Optional[Tensor] = None,
                         max_radio: Optional[float] = None, min_radio: float = 0, nsample: Optional[int] = None,
                         with_xyz: bool = False) -> tuple[Tensor, Tensor]:
    """(grouping(idx, feat, xyz, new_xyz, with_xyz), idx), idx from ball_query when not given."""
    if idx is None:
        if nsample is None or max_radio is None:
            raise ValueError("pointops.ball_query_and_group: give idx, or nsample and max_radio")
        idx, _ = ball_query(nsample, max_radio, min_radio, xyz, offset, new_xyz, new_offset)
    return grouping(idx, feat, xyz, new_xyz, with_xyz), idx


def offset2batch(offset: Tensor) -> Tensor:
    """The segment of each row: int64 (offset[-1],)."""
    counts = torch.diff(offset.long(), prepend=offset.new_zeros(1).long())
    return torch.arange(len(counts), device=offset.device).repeat_interleave(counts)


def batch2offset(batch: Tensor) -> Tensor:
    """Cumulative ends of a sorted batch vector: int32 (b,). The vector is checked non-negative
    and sorted (opbridge::batch_pointers), eagerly and in an exported graph."""
    if b.empty(batch):
        return batch.new_zeros(0, dtype=torch.int32)
    return b.pointers(batch, b.batch_size_of(batch), "batch", "pointops.batch2offset")[1:].int()
