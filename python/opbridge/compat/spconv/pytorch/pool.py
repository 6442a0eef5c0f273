"""spconv.pytorch.pool's SparseMaxPool1d-4d on opbridge's sparse_indice_maxpool."""

from __future__ import annotations

from typing import Optional

import torch

from ..rules import sparse_maxpool_forward
from .core import MAX_NUM_VOXELS, expand_nd
from .modules import SparseModule

__all__ = ["SparseMaxPool", "SparseMaxPool1d", "SparseMaxPool2d", "SparseMaxPool3d", "SparseMaxPool4d"]


class SparseMaxPool(SparseModule):
    def __init__(self, ndim, kernel_size=3, stride: Optional[object] = 1, padding=0, dilation=1,
                 indice_key: Optional[str] = None, subm: bool = False, algo=None, record_voxel_count: bool = False,
                 name=None):
        super().__init__(name=name)
        self.ndim = ndim
        self.kernel_size = expand_nd(ndim, kernel_size)
        self.stride = list(self.kernel_size) if stride is None else expand_nd(ndim, stride)
        self.padding = expand_nd(ndim, padding)
        self.dilation = expand_nd(ndim, dilation)
        self.subm, self.indice_key, self.algo = subm, indice_key, algo
        self.record_voxel_count = record_voxel_count
        if record_voxel_count and not subm:
            self.register_buffer(MAX_NUM_VOXELS, torch.zeros(1, dtype=torch.int32))

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"

    forward = sparse_maxpool_forward


def _pool(ndim: int):
    class Pool(SparseMaxPool):
        def __init__(self, kernel_size, stride=None, padding=0, dilation=1, indice_key=None, algo=None,
                     record_voxel_count: bool = False, name=None):
            super().__init__(ndim, kernel_size, stride, padding, dilation, indice_key=indice_key, algo=algo,
                             record_voxel_count=record_voxel_count, name=name)

    Pool.__name__ = Pool.__qualname__ = f"SparseMaxPool{ndim}d"
    return Pool


SparseMaxPool1d, SparseMaxPool2d, SparseMaxPool3d, SparseMaxPool4d = (_pool(n) for n in (1, 2, 3, 4))
