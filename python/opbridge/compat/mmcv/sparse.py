"""mmcv's sparse convolution modules (SparseConvolution and its SubMConv / SparseConv /
SparseConvTranspose / SparseInverseConv subclasses, SparseMaxPool, SparseSequential) on opbridge's
sparse ops, as substitution rules (opbridge.export and opbridge.substitutions() apply them).

mmcv's forward builds the rulebook in its extension, reads the output count as a Python int
(`outids.shape[0]`) and passes it back in; neither exporter can carry that int, and its
SparseSequential skips a layer on `indices.shape[0] != 0`, which torch.export cannot decide for a
count only the data knows. These forwards pass the output sites themselves (the ops read their row
count), so an exported model keeps the voxel count dynamic, and apply the dense layers of a
SparseSequential whatever the count (on zero rows they give zero rows, as skipping them would).
They keep mmcv's rulebook cache: a layer with an indice_key that is already in the tensor's
indice_dict reuses that rulebook, and a SparseInverseConv runs its couple's backwards. mmcv's
`grid` buffer is a scratch area of its kernel; the rulebook is the same without it.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.fx.experimental.symbolic_shapes import guard_or_true

import opbridge

from .._batches import traced_nonempty
from ._ext.sparse import output_spatial_shape

opbridge.load_torch()
_OPS = torch.ops.opbridge

__all__ = ["TARGETS", "sparse_convolution_forward", "sparse_maxpool_forward", "sparse_sequential_forward"]

TARGETS = {"conv": "mmcv.ops.sparse_conv.SparseConvolution.forward",
           "pool": "mmcv.ops.sparse_pool.SparseMaxPool.forward",
           "sequential": "mmcv.ops.sparse_modules.SparseSequential.forward"}


def _ints(values) -> list:
    return [int(v) for v in values]


def _rulebook(indices: Tensor, spatial_shape, batch_size: int, kernel_size, stride, padding, dilation,
              output_padding, subm: bool, transposed: bool):
    outids, pairs, num = _OPS.sparse_indice_pairs(
        indices.to(torch.int32), spatial_shape=_ints(spatial_shape), kernel_size=_ints(kernel_size),
        stride=_ints(stride), padding=_ints(padding), dilation=_ints(dilation),
        output_padding=_ints(output_padding), batch_size=int(batch_size), subm=bool(subm),
        transposed=bool(transposed))
    if subm:  # the input sites themselves, as mmcv's extension returns them: the count stays the input's
        return indices, pairs, num
    traced_nonempty(outids.shape[0])  # a batch norm over the sites follows
    return outids, pairs, num


def _like(input, features: Tensor, indices: Tensor, spatial_shape):
    """A SparseConvTensor of the input's class carrying its rulebook cache, as mmcv's forward returns."""
    out = type(input)(features, indices, spatial_shape, input.batch_size)
    out.indice_dict = input.indice_dict
    out.grid = input.grid
    return out


def sparse_convolution_forward(self, input):
    """SparseConvolution.forward(input: SparseConvTensor) -> SparseConvTensor, on sparse_indice_pairs and
    sparse_indice_conv (mmcv's results row for row: the same output sites in the same order)."""
    features, indices, spatial_shape = input.features, input.indices, input.spatial_shape
    out_shape = output_spatial_shape(spatial_shape, self.kernel_size, self.stride, self.padding, self.dilation,
                                     self.output_padding, self.subm, self.transposed)
    if self.conv1x1:  # mmcv's 1x1x1 layer: a matrix product at the same sites
        out = torch.mm(features, self.weight.view(self.in_channels, self.out_channels))
        if self.bias is not None:
            out = out + self.bias
        return _like(input, out, indices, spatial_shape)
    data = input.find_indice_pair(self.indice_key)
    if self.inverse:
        if data is None:
            raise RuntimeError(f"{type(self).__name__}: an inverse convolution needs the rulebook of its couple, "
                               f"but indice_key {self.indice_key!r} names none in this tensor")
        _, outids, indice_pairs, indice_pair_num, out_shape = data
    elif data is not None:
        outids, _, indice_pairs, indice_pair_num, _ = data
    else:
        outids, indice_pairs, indice_pair_num = _rulebook(
            indices, spatial_shape, input.batch_size, self.kernel_size, self.stride, self.padding, self.dilation,
            self.output_padding, self.subm, self.transposed)
        input.indice_dict[self.indice_key] = (outids, indices, indice_pairs, indice_pair_num, spatial_shape)
    out = _OPS.sparse_indice_conv(features, self.weight, indice_pairs, indice_pair_num, outids,
                                  inverse=bool(self.inverse))
    if self.bias is not None:  # mmcv's fused_bn layers too: bias after the sum
        out = out + self.bias
    return _like(input, out, outids, out_shape)


def sparse_maxpool_forward(self, input):
    """SparseMaxPool.forward(input: SparseConvTensor) -> SparseConvTensor, on sparse_indice_pairs and
    sparse_indice_maxpool."""
    out_shape = output_spatial_shape(input.spatial_shape, self.kernel_size, self.stride, self.padding,
                                     self.dilation, [0] * len(self.kernel_size), self.subm, False)
    outids, indice_pairs, indice_pair_num = _rulebook(
        input.indices, input.spatial_shape, input.batch_size, self.kernel_size, self.stride, self.padding,
        self.dilation, [0] * len(self.kernel_size), self.subm, False)
    out = _OPS.sparse_indice_maxpool(input.features, indice_pairs, indice_pair_num, outids)
    return _like(input, out, outids, out_shape)


def _maybe_nonzero(count) -> bool:
    # A symbol only the data gives counts as nonzero; a size the TorchScript tracer reads is a tensor.
    return guard_or_true(count != 0) if isinstance(count, torch.SymInt) else bool(count != 0)


def sparse_sequential_forward(self, input):
    """SparseSequential.forward: sparse modules take the tensor, the others its features. A dense
    layer is applied unless the count is known to be 0 (under torch.export, a count only the data
    knows is taken as nonzero: the layer maps zero rows to zero rows either way)."""
    sparse_module = next(c for c in type(self).__mro__ if c.__name__ == "SparseModule")  # mmcv's base class
    for k, module in self._modules.items():
        if isinstance(module, sparse_module):
            self._sparity_dict[k] = input.sparity
            input = module(input)
        elif isinstance(input, Tensor) or not hasattr(input, "features"):
            input = module(input)
        elif _maybe_nonzero(input.indices.shape[0]):
            input.features = module(input.features)
    return input


_DOC = "opbridge.compat.mmcv.sparse: opbridge::sparse_indice_pairs and "
opbridge.substitute(TARGETS["conv"], sparse_convolution_forward, doc=_DOC + "sparse_indice_conv")
opbridge.substitute(TARGETS["pool"], sparse_maxpool_forward, doc=_DOC + "sparse_indice_maxpool")
opbridge.substitute(TARGETS["sequential"], sparse_sequential_forward,
                    doc="opbridge.compat.mmcv.sparse: mmcv's SparseSequential with no guard on the voxel count")
