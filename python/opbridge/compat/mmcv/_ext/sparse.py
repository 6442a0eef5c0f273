"""mmcv._ext's sparse convolution functions (mmcv/ops/sparse_ops.py calls them) on opbridge's
sparse_indice_pairs, sparse_indice_conv and sparse_indice_maxpool ops, with the parameter names of
mmcv's bindings (its pybind.cpp):

    get_indice_pairs_{2,3,4}d_forward(indices, batchSize, outSpatialShape, spatialShape, kernelSize,
        stride, padding, dilation, outPadding, _subM, _transpose) -> [outids, indice_pairs, indice_pair_num]
    get_indice_pairs_{2,3}d_backward(indices, gridOut, batchSize, ...the same) -> the same (gridOut is a
        scratch grid of mmcv's kernel, checked for its size and left as it is)
    indice_conv_forward(features, filters, indicePairs, indiceNum, numActOut, _inverse, _subM) -> (numActOut, Cout)
    indice_conv_backward(features, filters, outGrad, indicePairs, indiceNum, _inverse, _subM) -> [input_bp, filters_bp]
    fused_indice_conv_forward(features, filters, bias, indicePairs, indiceNum, numActOut, _inverse, _subM)
        -> bias + the convolution
    indice_maxpool_forward(features, indicePairs, indiceNum, numAct) -> (numAct, C)
    indice_maxpool_backward(features, outFeatures, outGrad, indicePairs, indiceNum) -> input gradient

The rulebook is mmcv's CPU kernel's, row for row. `_subM` names the rulebook's kind only: the
convolution reads every pair, so it needs no flag (mmcv's kernels take the offset with the most
pairs as the identity for it; for a submanifold rulebook of an odd kernel that is the centre, the
same sum). For the same reason mmcv's fused kernel's submanifold case, which overwrites its bias
with the centre's product, is not followed: the bias is always added.
"""

from __future__ import annotations

import math
from typing import List, Sequence

import torch
from torch import Tensor

import opbridge

opbridge.load_torch()
_OPS = torch.ops.opbridge

__all__ = ["fused_indice_conv_forward", "get_indice_pairs_2d_backward", "get_indice_pairs_2d_forward",
           "get_indice_pairs_3d_backward", "get_indice_pairs_3d_forward", "get_indice_pairs_4d_forward",
           "indice_conv_backward", "indice_conv_forward", "indice_maxpool_backward", "indice_maxpool_forward"]


def output_spatial_shape(spatial_shape: Sequence[int], kernel_size: Sequence[int], stride: Sequence[int],
                         padding: Sequence[int], dilation: Sequence[int], output_padding: Sequence[int],
                         subm: bool, transposed: bool) -> List[int]:
    """mmcv's output grid (sparse_ops.get_conv_output_size / get_deconv_output_size), which
    sparse_indice_pairs uses."""
    if subm:
        return [int(s) for s in spatial_shape]
    if transposed:
        return [(i - 1) * s - 2 * p + k + o for i, k, s, p, o in
                zip(spatial_shape, kernel_size, stride, padding, output_padding)]
    return [(i + 2 * p - d * (k - 1) - 1) // s + 1 for i, k, s, p, d in
            zip(spatial_shape, kernel_size, stride, padding, dilation)]


def _indice_pairs(name: str, dims: int, indices: Tensor, batchSize: int, outSpatialShape, spatialShape, kernelSize,
                  stride, padding, dilation, outPadding, _subM: int, _transpose: int) -> List[Tensor]:
    if indices.dim() != 2 or indices.shape[1] != dims + 1:
        raise RuntimeError(f"mmcv._ext.{name}: indices must be (N, {dims + 1}), got {tuple(indices.shape)}")
    attrs = dict(spatial_shape=[int(v) for v in spatialShape], kernel_size=[int(v) for v in kernelSize],
                 stride=[int(v) for v in stride], padding=[int(v) for v in padding],
                 dilation=[int(v) for v in dilation], output_padding=[int(v) for v in outPadding])
    want = output_spatial_shape(attrs["spatial_shape"], attrs["kernel_size"], attrs["stride"], attrs["padding"],
                                attrs["dilation"], attrs["output_padding"], bool(_subM), bool(_transpose))
    if len(attrs["spatial_shape"]) == dims and [int(v) for v in outSpatialShape] != want:
        raise RuntimeError(f"mmcv._ext.{name}: outSpatialShape {list(outSpatialShape)} is not the output grid of "
                           f"spatialShape {attrs['spatial_shape']} under this kernel ({want})")
    out = _OPS.sparse_indice_pairs(indices.to(torch.int32), batch_size=int(batchSize), subm=bool(_subM),
                                   transposed=bool(_transpose), **attrs)
    return list(out)


def get_indice_pairs_2d_forward(indices, batchSize, outSpatialShape, spatialShape, kernelSize, stride, padding,
                                dilation, outPadding, _subM, _transpose):
    return _indice_pairs("get_indice_pairs_2d_forward", 2, indices, batchSize, outSpatialShape, spatialShape,
                         kernelSize, stride, padding, dilation, outPadding, _subM, _transpose)


def get_indice_pairs_3d_forward(indices, batchSize, outSpatialShape, spatialShape, kernelSize, stride, padding,
                                dilation, outPadding, _subM, _transpose):
    return _indice_pairs("get_indice_pairs_3d_forward", 3, indices, batchSize, outSpatialShape, spatialShape,
                         kernelSize, stride, padding, dilation, outPadding, _subM, _transpose)


def get_indice_pairs_4d_forward(indices, batchSize, outSpatialShape, spatialShape, kernelSize, stride, padding,
                                dilation, outPadding, _subM, _transpose):
    return _indice_pairs("get_indice_pairs_4d_forward", 4, indices, batchSize, outSpatialShape, spatialShape,
                         kernelSize, stride, padding, dilation, outPadding, _subM, _transpose)


def _with_grid(name: str, dims: int, indices: Tensor, gridOut: Tensor, batchSize, outSpatialShape, *rest):
    # mmcv's kernel marks sites in gridOut and resets it to -1 afterwards: only its size matters.
    need = int(batchSize) * math.prod(int(v) for v in outSpatialShape)
    if gridOut.numel() < need:
        raise RuntimeError(f"mmcv._ext.{name}: gridOut has {gridOut.numel()} entries, fewer than batchSize x "
                           f"prod(outSpatialShape) = {need}")
    return _indice_pairs(name, dims, indices, batchSize, outSpatialShape, *rest)


def get_indice_pairs_2d_backward(indices, gridOut, batchSize, outSpatialShape, spatialShape, kernelSize, stride,
                                 padding, dilation, outPadding, _subM, _transpose):
    return _with_grid("get_indice_pairs_2d_backward", 2, indices, gridOut, batchSize, outSpatialShape, spatialShape,
                      kernelSize, stride, padding, dilation, outPadding, _subM, _transpose)


def get_indice_pairs_3d_backward(indices, gridOut, batchSize, outSpatialShape, spatialShape, kernelSize, stride,
                                 padding, dilation, outPadding, _subM, _transpose):
    return _with_grid("get_indice_pairs_3d_backward", 3, indices, gridOut, batchSize, outSpatialShape, spatialShape,
                      kernelSize, stride, padding, dilation, outPadding, _subM, _transpose)


def _rows(n: int, like: Tensor) -> Tensor:
    """A (n, 0) tensor: the ops read the output's row count from a tensor's first axis."""
    return torch.empty((int(n), 0), dtype=torch.int32, device=like.device)


def indice_conv_forward(features: Tensor, filters: Tensor, indicePairs: Tensor, indiceNum: Tensor, numActOut: int,
                        _inverse: int, _subM: int) -> Tensor:
    return _OPS.sparse_indice_conv(features, filters, indicePairs, indiceNum, _rows(numActOut, features),
                                   inverse=bool(_inverse))


def indice_conv_backward(features: Tensor, filters: Tensor, outGrad: Tensor, indicePairs: Tensor, indiceNum: Tensor,
                         _inverse: int, _subM: int) -> List[Tensor]:
    return list(_OPS.sparse_indice_conv_backward(outGrad.contiguous(), features, filters, indicePairs, indiceNum,
                                                 inverse=bool(_inverse)))


def fused_indice_conv_forward(features: Tensor, filters: Tensor, bias: Tensor, indicePairs: Tensor,
                              indiceNum: Tensor, numActOut: int, _inverse: int, _subM: int) -> Tensor:
    return indice_conv_forward(features, filters, indicePairs, indiceNum, numActOut, _inverse, _subM) + bias


def indice_maxpool_forward(features: Tensor, indicePairs: Tensor, indiceNum: Tensor, numAct: int) -> Tensor:
    return _OPS.sparse_indice_maxpool(features, indicePairs, indiceNum, _rows(numAct, features))


def indice_maxpool_backward(features: Tensor, outFeatures: Tensor, outGrad: Tensor, indicePairs: Tensor,
                            indiceNum: Tensor) -> Tensor:
    return _OPS.sparse_indice_maxpool_backward(outGrad.contiguous(), features, outFeatures, indicePairs, indiceNum)
