"""spconv.pytorch.core's SparseConvTensor: features (N, C), int32 indices (N, D + 1) batch first, the
spatial shape, the batch size and the rulebook cache (`indice_dict`, indice_key -> rulebook)."""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Union

import torch
from torch import Tensor

from ..rules import IndiceData

__all__ = ["IndiceData", "MAX_NUM_VOXELS", "SparseConvTensor", "expand_nd", "scatter_nd"]

MAX_NUM_VOXELS = "max_num_voxels_during_training"  # the buffer of a layer with record_voxel_count, spconv's name


def expand_nd(ndim: int, val: Union[int, Sequence[int]]) -> List[int]:
    """An int repeated to ndim values, or a sequence of ndim ints (spconv's expand_nd)."""
    values = [int(val)] * ndim if isinstance(val, int) else [int(v) for v in val]
    if len(values) != ndim:
        raise ValueError(f"expected {ndim} values, got {list(val)}")
    return values


def scatter_nd(indices: Tensor, updates: Tensor, shape: List[int]) -> Tensor:
    """A zero tensor of `shape` with `updates` at `indices` (each index once; spconv's scatter_nd)."""
    out = torch.zeros(*shape, dtype=updates.dtype, device=updates.device)
    return out.index_put(tuple(indices[:, a] for a in range(indices.shape[1])), updates)


class SparseConvTensor:
    def __init__(self, features: Tensor, indices: Tensor, spatial_shape: Sequence[int], batch_size: int,
                 grid: Optional[Tensor] = None, voxel_num: Optional[Tensor] = None,
                 indice_dict: Optional[dict] = None, benchmark: bool = False,
                 permanent_thrust_allocator: bool = False, enable_timer: bool = False, force_algo=None):
        """features (N, C), indices (N, ndim + 1) int32 (batch index first), the grid's spatial_shape
        (ndim,), batch_size > 0. grid, voxel_num, benchmark, the allocator, timer and force_algo are
        spconv's GPU and profiling aids: kept as attributes, unused."""
        ndim = indices.shape[1] - 1
        if features.dim() != 2 or indices.dim() != 2:
            raise ValueError(f"SparseConvTensor: features and indices must be 2-D, got {tuple(features.shape)} "
                             f"and {tuple(indices.shape)}")
        if len(spatial_shape) != ndim:
            raise ValueError(f"SparseConvTensor: spatial_shape {list(spatial_shape)} must have {ndim} values "
                             f"for indices of width {ndim + 1}")
        if indices.dtype != torch.int32:
            raise ValueError(f"SparseConvTensor: indices must be int32, got {indices.dtype}")
        if not batch_size > 0:
            raise ValueError(f"SparseConvTensor: batch_size must be > 0, got {batch_size}")
        self._features = features
        self.indices = indices
        self.spatial_shape = [int(v) for v in spatial_shape]
        self.batch_size = batch_size
        self.indice_dict = {} if indice_dict is None else indice_dict
        self.grid = torch.Tensor() if grid is None else grid
        self.voxel_num = voxel_num
        self.benchmark = benchmark
        self.benchmark_record = {}
        self.thrust_allocator = None
        self.force_algo = force_algo
        self.int8_scale = None

    def __repr__(self):
        return f"SparseConvTensor[shape={self._features.shape}]"

    @property
    def features(self) -> Tensor:
        return self._features

    @features.setter
    def features(self, value):
        raise ValueError("you can't set feature directly, use 'x = x.replace_feature(your_new_feature)' "
                         "to generate new SparseConvTensor instead.")

    @property
    def is_quantized(self) -> bool:
        return self._features.dtype == torch.qint8

    @property
    def spatial_size(self) -> int:
        return math.prod(self.spatial_shape)

    def shadow_copy(self) -> "SparseConvTensor":
        """A tensor with the same members (the same indice_dict object)."""
        out = SparseConvTensor(self._features, self.indices, self.spatial_shape, self.batch_size, self.grid,
                               self.voxel_num, self.indice_dict, self.benchmark)
        out.benchmark_record, out.force_algo, out.int8_scale = self.benchmark_record, self.force_algo, self.int8_scale
        return out

    def replace_feature(self, feature: Tensor) -> "SparseConvTensor":
        """The same sites (and rulebook cache) with other features."""
        out = self.shadow_copy()
        out._features = feature
        return out

    def select_by_index(self, valid_indices: Tensor) -> "SparseConvTensor":
        """The rows valid_indices; the rulebook cache is emptied (its rulebooks name other rows)."""
        out = self.shadow_copy()
        out.indices, out._features = self.indices[valid_indices], self._features[valid_indices]
        out.indice_dict = {}
        return out

    def minus(self) -> "SparseConvTensor":
        return self.replace_feature(-self._features)

    def find_indice_pair(self, key) -> Optional[IndiceData]:
        return None if key is None else self.indice_dict.get(key)

    @classmethod
    def from_dense(cls, x: Tensor) -> "SparseConvTensor":
        """From a channels-last dense tensor (N, *spatial, C): its sites with any nonzero channel."""
        sites = torch.nonzero((x != 0).any(-1))
        features = x[tuple(sites[:, a] for a in range(sites.shape[1]))]
        return cls(features, sites.int(), list(x.shape[1:-1]), x.shape[0])

    def dense(self, channels_first: bool = True) -> Tensor:
        """The dense (batch, C, *spatial_shape) tensor (channels last: (batch, *spatial_shape, C)), zero
        where no site is."""
        shape = [self.batch_size, *self.spatial_shape, self._features.shape[1]]
        out = scatter_nd(self.indices.to(self._features.device).long(), self._features, shape)
        ndim = len(self.spatial_shape)  # explicit axes: the TorchScript exporter writes movedim's -1 as it is
        return out.permute(0, ndim + 1, *range(1, ndim + 1)).contiguous() if channels_first else out

    def _features_of(self, other) -> Tensor:
        if not isinstance(other, (SparseConvTensor, Tensor)):
            raise TypeError(f"SparseConvTensor: cannot add a {type(other).__name__}")
        return other if isinstance(other, Tensor) else other.features

    def __add__(self, other) -> "SparseConvTensor":
        return self.replace_feature(self._features + self._features_of(other))

    __radd__ = __add__

    def __iadd__(self, other) -> "SparseConvTensor":
        self._features = self._features + self._features_of(other)
        return self
