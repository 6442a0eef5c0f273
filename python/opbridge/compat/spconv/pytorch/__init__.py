"""spconv.pytorch's public API on opbridge's sparse ops: SparseConvTensor, SubMConv1-4d,
SparseConv1-4d, SparseConvTranspose1-4d, SparseInverseConv1-4d (indice_key reuse), SparseMaxPool1-4d,
SparseSequential, ToDense, RemoveGrid, SparseReLU, SparseIdentity, SparseBatchNorm, SparseModule.
`opbridge.compat.install("spconv")` makes `import spconv.pytorch` resolve here where spconv is not
installed. The forwards are opbridge.compat.spconv.rules' (the substitution rules for the real
spconv run the same); docs/compat.md says where they differ from spconv."""

from . import conv, core, modules, pool
from .conv import (SparseConv1d, SparseConv2d, SparseConv3d, SparseConv4d, SparseConvolution,
                   SparseConvTranspose1d, SparseConvTranspose2d, SparseConvTranspose3d, SparseConvTranspose4d,
                   SparseInverseConv1d, SparseInverseConv2d, SparseInverseConv3d, SparseInverseConv4d, SubMConv1d,
                   SubMConv2d, SubMConv3d, SubMConv4d)
from .core import SparseConvTensor
from .modules import SparseBatchNorm, SparseIdentity, SparseModule, SparseReLU, SparseSequential
from .pool import SparseMaxPool1d, SparseMaxPool2d, SparseMaxPool3d, SparseMaxPool4d

__all__ = ["RemoveGrid", "SparseBatchNorm", "SparseConvTensor", "SparseIdentity", "SparseModule", "SparseReLU",
           "SparseSequential", "ToDense", "conv", "core", "modules", "pool"] + conv.__all__ + pool.__all__[1:]


class ToDense(SparseModule):
    """The SparseConvTensor as a dense (batch, C, *spatial_shape) tensor."""

    def forward(self, x: SparseConvTensor):
        return x.dense()


class RemoveGrid(SparseModule):
    """Drops the tensor's grid buffer (spconv's GPU scratch area)."""

    def forward(self, x: SparseConvTensor):
        x.grid = None
        return x
