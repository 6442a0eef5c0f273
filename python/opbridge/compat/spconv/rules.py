"""spconv 2.x's sparse convolution and max pooling forwards on opbridge's sparse ops: the substitution
rules for spconv.pytorch's own modules (opbridge.export and opbridge.substitutions() apply them) and
the forwards of opbridge.compat.spconv's modules, one definition for both.

spconv's forward builds its rulebook and runs its convolution in compiled code that neither
exporter can see into, and reads the output count as a Python int. These forwards build the
rulebook with sparse_indice_pairs and convolve with sparse_indice_conv / sparse_indice_maxpool (the
ops read the output count from a tensor), so an exported model keeps the voxel count dynamic. A
strided layer's count, which only the data gives, is declared nonzero to torch.export: spconv's
SparseSequential skips a dense layer on `indices.shape[0] != 0`, and PyTorch's layers branch on an
empty input; both then trace without a branch (zero rows run through them as zero rows). They keep
spconv's rulebook cache (`indice_dict`, one entry per `indice_key`, copied into each output as
spconv copies it): SubM layers with one key share
a rulebook, a SparseInverseConv runs the rulebook of the strided layer (or pool) of its key
backwards, its output sites being that layer's input sites.

What they compute is spconv's CPU result per site: the output sites are the same set, in another
order for strided and transposed layers (opbridge's rulebook numbers them by first appearance;
spconv by its hash table). Where spconv differs from a plain convolution they follow spconv:
- the weight is spconv's (Cout, *kernel_size, Cin), permuted to the op's (*kernel_size, Cin, Cout);
- a layer whose kernel (and stride, for a strided one) is all 1 is spconv's matrix product with the
  weight viewed as (Cin, Cout) (spconv's `weight.view(in_channels, out_channels)`), at the same
  sites, bias added, without its fused activation or add_input, as spconv returns it;
- a SubM layer with dilation centres its kernel (spconv's rule): the rulebook of a stride-1
  convolution padded by dilation * (kernel // 2), its output taken at the input sites;
- a fused bias, activation (ReLU, Sigmoid, LeakyReLU) and add_input are applied after the sum, as
  spconv's GPU path applies them (its CPU path refuses them in eval mode).
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch
from torch import Tensor
import torch.nn.functional as F

import opbridge

from .._batches import traced_nonempty
from ..mmcv._ext.sparse import output_spatial_shape

opbridge.load_torch()
_OPS = torch.ops.opbridge

__all__ = ["IndiceData", "TARGETS", "sparse_convolution_forward", "sparse_maxpool_forward",
]

TARGETS = {"conv": "spconv.pytorch.conv.SparseConvolution.forward",
           "pool": "spconv.pytorch.pool.SparseMaxPool.forward"}


class IndiceData:
    """A rulebook in a SparseConvTensor's indice_dict: spconv's IndiceData fields, with indice_pairs
    in opbridge's (K, 2, N) layout (spconv's is (2, K, N)). `rows`: for a dilated SubM layer, the rows
    of its padded convolution's output (at `padded_sites`) that are the input sites; None otherwise."""

    def __init__(self, out_indices, indices, indice_pairs, indice_pair_num, spatial_shape, out_spatial_shape,
                 is_subm: bool, ksize: List[int], stride: List[int], dilation: List[int], padding: List[int],
                 rows: Optional[Tensor] = None, padded_sites: Optional[Tensor] = None):
        self.out_indices, self.indices = out_indices, indices
        self.indice_pairs, self.indice_pair_num = indice_pairs, indice_pair_num
        self.spatial_shape, self.out_spatial_shape = list(spatial_shape), list(out_spatial_shape)
        self.is_subm, self.ksize, self.stride = is_subm, list(ksize), list(stride)
        self.dilation, self.padding, self.rows = list(dilation), list(padding), rows
        self.padded_sites = padded_sites  # a dilated SubM layer's padded convolution's output sites
        self.algo = None  # opbridge's rulebook serves every algorithm spconv has
        self.voxel_num = None


def _name(layer) -> str:
    return f"{type(layer).__name__}(indice_key={getattr(layer, 'indice_key', None)!r})"


def _ints(values) -> List[int]:
    return [int(v) for v in values]


def _rulebook(layer, input, subm: bool, transposed: bool, output_padding) -> IndiceData:
    """The rulebook of `layer` (kernel_size, stride, padding, dilation) over input's sites."""
    indices, shape = input.indices, _ints(input.spatial_shape)
    ks, stride, padding, dilation = (_ints(v) for v in (layer.kernel_size, layer.stride, layer.padding,
                                                          layer.dilation))
    dilated = subm and any(d != 1 for d in dilation)
    if subm and any(k % 2 == 0 for k in ks):
        raise RuntimeError(f"{_name(layer)}: a SubM layer needs an odd kernel_size (spconv's rule), got {ks}")
    if dilated:  # spconv centres a dilated SubM kernel: a stride-1 convolution padded to keep the grid
        stride, padding = [1] * len(ks), [d * (k // 2) for k, d in zip(ks, dilation)]
    out_shape = output_spatial_shape(shape, ks, stride, padding, dilation, _ints(output_padding), subm,
                                     transposed)
    outids, pairs, num = _OPS.sparse_indice_pairs(
        indices.to(torch.int32), spatial_shape=shape, kernel_size=ks, stride=stride, padding=padding,
        dilation=dilation, output_padding=_ints(output_padding), batch_size=int(input.batch_size),
        subm=subm and not dilated, transposed=transposed)
    rows = None
    if dilated:
        # Every input site pairs with itself at the kernel's centre offset, listed by input row: that
        # offset's output rows are the input sites' rows of the padded convolution's output.
        rows = pairs[math.prod(ks) // 2, 1, :indices.shape[0]].long()
    elif not subm:  # a SubM layer's output sites are its input sites, as spconv returns them
        traced_nonempty(outids.shape[0])
    return IndiceData(indices if subm else outids, indices, pairs, num, shape, out_shape, subm, ks, stride, dilation,
                      padding, rows, outids if dilated else None)


def _cached(layer, input) -> Optional[IndiceData]:
    data = input.find_indice_pair(layer.indice_key)
    if data is not None and not isinstance(data, IndiceData):
        raise RuntimeError(f"{_name(layer)}: indice_dict[{layer.indice_key!r}] holds spconv's own "
                           f"{type(data).__name__}, made outside opbridge; run every sparse layer of the "
                           f"model under opbridge's rules (opbridge.export, opbridge.substitutions())")
    return data


def _same_count(layer, input, sites: Tensor, what: str) -> None:
    # Counts a trace cannot compare (symbols) are left to the op, which checks the rulebook's rows.
    n, m = input.indices.shape[0], sites.shape[0]
    if isinstance(n, int) and isinstance(m, int) and n != m:
        raise RuntimeError(f"{_name(layer)}: the input has {n} sites, but {what} has {m}")


def _check_reuse(layer, input, data: IndiceData) -> None:
    """spconv's _check_subm_reuse_valid / _check_inverse_reuse_valid, as RuntimeErrors."""
    if layer.inverse:
        _same_count(layer, input, data.out_indices, "the output of the layer it inverts")
        if data.is_subm:
            raise RuntimeError(f"{_name(layer)}: an inverse convolution inverts a strided convolution or pool, "
                               f"but indice_key {layer.indice_key!r} is a SubM layer's")
        if _ints(layer.kernel_size) != data.ksize:
            raise RuntimeError(f"{_name(layer)}: kernel_size {_ints(layer.kernel_size)} is not the kernel "
                               f"{data.ksize} of the layer it inverts")
        if _ints(input.spatial_shape) != data.out_spatial_shape:
            raise RuntimeError(f"{_name(layer)}: input spatial_shape {_ints(input.spatial_shape)} is not the "
                               f"output grid {data.out_spatial_shape} of the layer it inverts")
        return
    if not (layer.subm and data.is_subm):
        raise RuntimeError(f"{_name(layer)}: only SubM layers may share an indice_key (spconv's rule); the key "
                           f"already holds a {'SubM' if data.is_subm else 'strided'} layer's rulebook")
    if _ints(layer.kernel_size) != data.ksize or _ints(layer.dilation) != data.dilation:
        raise RuntimeError(f"{_name(layer)}: SubM layers sharing an indice_key need one kernel_size and dilation, "
                           f"got {_ints(layer.kernel_size)}/{_ints(layer.dilation)} and {data.ksize}/{data.dilation}")
    if _ints(input.spatial_shape) != data.spatial_shape:
        raise RuntimeError(f"{_name(layer)}: spatial_shape {_ints(input.spatial_shape)} is not the shared "
                           f"rulebook's {data.spatial_shape}")
    _same_count(layer, input, data.indices, "the shared rulebook's input")


def _activation(layer, x: Tensor) -> Tensor:
    act = getattr(layer, "act_type", None)
    name = getattr(act, "name", act) or "None_"
    if name == "None_":
        return x
    if name == "ReLU":
        return F.relu(x)
    if name == "Sigmoid":
        return torch.sigmoid(x)
    if name == "LeakyReLU":
        return F.leaky_relu(x, float(layer.act_alpha))
    raise RuntimeError(f"{_name(layer)}: no fused activation {name!r} (spconv has ReLU, Sigmoid, LeakyReLU)")


def _refuse(layer, input) -> None:
    if getattr(layer, "groups", 1) != 1:
        raise RuntimeError(f"{_name(layer)}: groups={layer.groups} is not supported (spconv has none either)")
    if input.features.dtype in (torch.qint8, torch.int8):
        raise RuntimeError(f"{_name(layer)}: int8 (quantized) features are not supported")
    if input.features.dim() != 2 or input.features.shape[1] != layer.in_channels:
        raise RuntimeError(f"{_name(layer)}: features must be (N, {layer.in_channels}), got "
                           f"{tuple(input.features.shape)}")


def sparse_convolution_forward(self, input, add_input=None):
    """SparseConvolution.forward(input: SparseConvTensor, add_input=None) -> SparseConvTensor, on
    sparse_indice_pairs and sparse_indice_conv (spconv's CPU result per site)."""
    _refuse(self, input)
    features, ndim = input.features, len(self.kernel_size)
    out = input.shadow_copy()
    if self.conv1x1:  # spconv's matrix product (its weight viewed as (Cin, Cout)), no act, no add_input
        out = out.replace_feature(torch.mm(features, self.weight.reshape(self.in_channels, self.out_channels))
                                  + (self.bias if self.bias is not None else 0))
        out.spatial_shape = output_spatial_shape(input.spatial_shape, self.kernel_size, self.stride, self.padding,
                                                 self.dilation, self.output_padding, self.subm, self.transposed)
        return out
    indice_dict = dict(input.indice_dict)  # spconv copies the cache into each output
    data = _cached(self, input) if self.indice_key is not None else None
    if self.inverse and data is None:
        raise RuntimeError(f"{_name(self)}: an inverse convolution needs the rulebook of the layer it inverts, "
                           f"but indice_key {self.indice_key!r} names none in this tensor")
    if data is not None:
        _check_reuse(self, input, data)
    else:
        data = _rulebook(self, input, self.subm, self.transposed, self.output_padding)
        if self.indice_key is not None:
            indice_dict[self.indice_key] = data
    weight = self.weight.permute(*range(1, ndim + 1), ndim + 1, 0)  # (Cout, *k, Cin) -> (*k, Cin, Cout)
    if self.inverse:  # the couple's rulebook backwards: its input sites are the output sites
        outids, out_shape = data.indices, data.spatial_shape
        result = _OPS.sparse_indice_conv(features, weight, data.indice_pairs, data.indice_pair_num, outids,
                                         inverse=True)
    elif data.rows is not None:  # a dilated SubM layer: the padded convolution's rows at the input sites
        full = _OPS.sparse_indice_conv(features, weight, data.indice_pairs, data.indice_pair_num, data.padded_sites,
                                       inverse=False)
        outids, out_shape, result = data.out_indices, data.out_spatial_shape, full[data.rows]
    else:
        outids, out_shape = data.out_indices, data.out_spatial_shape
        result = _OPS.sparse_indice_conv(features, weight, data.indice_pairs, data.indice_pair_num, outids,
                                         inverse=False)
    if self.bias is not None:
        result = result + self.bias
    if add_input is not None:
        result = result + add_input.features
    result = _activation(self, result)
    out = out.replace_feature(result)
    out.indices, out.indice_dict, out.spatial_shape = outids, indice_dict, list(out_shape)
    return out


def sparse_maxpool_forward(self, input):
    """SparseMaxPool.forward(input: SparseConvTensor) -> SparseConvTensor, on sparse_indice_pairs and
    sparse_indice_maxpool: per output site the channel-wise maximum of 0 and its inputs (spconv's CPU
    kernel starts every output at 0, as the op does). spconv's rulebook is a strided one whatever
    `subm` says (its output grid is then the input's): so is this one."""
    if input.features.dtype in (torch.qint8, torch.int8):
        raise RuntimeError(f"{_name(self)}: int8 (quantized) features are not supported")
    indice_dict = dict(input.indice_dict)
    data = _rulebook(self, input, False, False, [0] * len(self.kernel_size))
    if self.subm:
        data.out_spatial_shape = list(input.spatial_shape)
    if self.indice_key is not None:
        if self.indice_key in indice_dict:
            raise RuntimeError(f"{_name(self)}: indice_key {self.indice_key!r} is already in this tensor")
        indice_dict[self.indice_key] = data
    out = input.shadow_copy().replace_feature(
        _OPS.sparse_indice_maxpool(input.features, data.indice_pairs, data.indice_pair_num, data.out_indices))
    out.indices, out.indice_dict, out.spatial_shape = data.out_indices, indice_dict, data.out_spatial_shape
    return out


_DOC = "opbridge.compat.spconv.rules: opbridge::sparse_indice_pairs and "
opbridge.substitute(TARGETS["conv"], sparse_convolution_forward, doc=_DOC + "sparse_indice_conv")
opbridge.substitute(TARGETS["pool"], sparse_maxpool_forward, doc=_DOC + "sparse_indice_maxpool")
