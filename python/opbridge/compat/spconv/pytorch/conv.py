"""spconv.pytorch.conv's SparseConvolution and its SubMConv / SparseConv / SparseConvTranspose /
SparseInverseConv 1-4d subclasses on opbridge's sparse_indice_pairs and sparse_indice_conv: spconv's
constructor arguments, its parameters ("weight" (Cout, *kernel_size, Cin), "bias" (Cout,)) and
initialisation, so a spconv checkpoint loads."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from ..rules import sparse_convolution_forward
from .core import MAX_NUM_VOXELS, expand_nd
from .modules import SparseModule

__all__ = ["SparseConvolution"] + [f"{kind}{n}d" for kind in ("SubMConv", "SparseConv", "SparseConvTranspose",
                                                               "SparseInverseConv") for n in (1, 2, 3, 4)]


class SparseConvolution(SparseModule):
    def __init__(self, ndim: int, in_channels: int, out_channels: int, kernel_size=3, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, subm: bool = False, output_padding=0, transposed: bool = False,
                 inverse: bool = False, indice_key: Optional[str] = None, algo=None, fp32_accum=None,
                 record_voxel_count: bool = False, act_type=None, act_alpha: float = 0, act_beta: float = 0,
                 large_kernel_fast_algo: bool = False, name=None, device=None, dtype=None):
        """spconv's arguments. groups must be 1 (as spconv asserts); algo, fp32_accum and
        large_kernel_fast_algo choose among spconv's CUDA kernels and are kept, unused; act_type
        (None, or "ReLU" / "Sigmoid" / "LeakyReLU" or spconv's enum of those names) is applied after
        the bias."""
        super().__init__(name=name)
        if groups != 1:
            raise ValueError(f"{type(self).__name__}: groups={groups} is not supported (spconv has none either)")
        self.ndim, self.in_channels, self.out_channels = ndim, in_channels, out_channels
        self.kernel_size = expand_nd(ndim, kernel_size)
        self.stride = expand_nd(ndim, stride)
        self.padding = expand_nd(ndim, padding)
        self.dilation = expand_nd(ndim, dilation)
        self.output_padding = expand_nd(ndim, output_padding)
        self.groups, self.subm, self.transposed, self.inverse = groups, subm, transposed, inverse
        self.indice_key, self.algo, self.fp32_accum = indice_key, algo, fp32_accum
        self.record_voxel_count = record_voxel_count
        self.act_type, self.act_alpha, self.act_beta = act_type, act_alpha, act_beta
        # spconv's 1x1 layer (a matrix product at the same sites): its kernel, and stride unless SubM, all 1.
        self.conv1x1 = math.prod(self.kernel_size) == 1 and (subm or math.prod(self.stride) == 1)
        if self.conv1x1 and not subm and self.padding != [0] * ndim:
            raise ValueError(f"{type(self).__name__}: padding must be zero for a 1x1 layer (k=1, s=1)")
        if record_voxel_count and not subm and not inverse:
            self.register_buffer(MAX_NUM_VOXELS, torch.zeros(1, dtype=torch.int32, device=device))
        self.weight = nn.Parameter(torch.zeros(out_channels, *self.kernel_size, in_channels, device=device,
                                               dtype=dtype))
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def is_inverseable(self) -> bool:
        return self.indice_key is not None and not self.subm

    def reset_parameters(self) -> None:
        """spconv's: kaiming-uniform (a = sqrt(5)) over fan_in = in_channels * prod(kernel_size)."""
        fan_in = self.in_channels * math.prod(self.kernel_size)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + 5)) / math.sqrt(fan_in)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))

    def extra_repr(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.indice_key is not None:
            s += f", indice_key={self.indice_key!r}"
        return s + (", bias=False" if self.bias is None else "")

    forward = sparse_convolution_forward


def _layer(kind: str, ndim: int):
    """The spconv class `kind`{ndim}d with spconv's constructor signature for that kind."""
    if kind == "SparseInverseConv":
        def init(self, in_channels, out_channels, kernel_size, indice_key, bias=True, algo=None, fp32_accum=None,
                 large_kernel_fast_algo=False, name=None):
            SparseConvolution.__init__(self, ndim, in_channels, out_channels, kernel_size, bias=bias, inverse=True,
                                       indice_key=indice_key, algo=algo, fp32_accum=fp32_accum, name=name)
    elif kind == "SubMConv":
        def init(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 indice_key=None, algo=None, fp32_accum=None, large_kernel_fast_algo=False, name=None):
            SparseConvolution.__init__(self, ndim, in_channels, out_channels, kernel_size, stride, padding, dilation,
                                       groups, bias, True, indice_key=indice_key, algo=algo, fp32_accum=fp32_accum,
                                       name=name)
    else:
        transposed = kind == "SparseConvTranspose"

        def init(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 indice_key=None, algo=None, fp32_accum=None, record_voxel_count=False, large_kernel_fast_algo=False,
                 name=None):
            SparseConvolution.__init__(self, ndim, in_channels, out_channels, kernel_size, stride, padding, dilation,
                                       groups, bias, transposed=transposed, indice_key=indice_key, algo=algo,
                                       fp32_accum=fp32_accum, record_voxel_count=record_voxel_count, name=name)
    name = f"{kind}{ndim}d"
    return type(name, (SparseConvolution,), {"__init__": init, "__qualname__": name, "__module__": __name__})


SubMConv1d, SubMConv2d, SubMConv3d, SubMConv4d = (_layer("SubMConv", n) for n in (1, 2, 3, 4))
SparseConv1d, SparseConv2d, SparseConv3d, SparseConv4d = (_layer("SparseConv", n) for n in (1, 2, 3, 4))
SparseConvTranspose1d, SparseConvTranspose2d, SparseConvTranspose3d, SparseConvTranspose4d = (
    _layer("SparseConvTranspose", n) for n in (1, 2, 3, 4))
SparseInverseConv1d, SparseInverseConv2d, SparseInverseConv3d, SparseInverseConv4d = (
    _layer("SparseInverseConv", n) for n in (1, 2, 3, 4))
