"""mmcv._ext's RoIAlign and RoIPool functions on opbridge's roi_align and roi_pool ops and their
backward ops, with the calling convention mmcv/ops/roi_align.py and roi_pool.py use (outputs
passed in and filled in place, keyword attributes):

    roi_align_forward(input, rois, output, argmax_y, argmax_x, *, aligned_height, aligned_width,
                      spatial_scale, sampling_ratio, pool_mode, aligned)      pool_mode: 0 max, 1 avg
    roi_align_backward(grad_output, rois, argmax_y, argmax_x, grad_input, *, <the same>)
    roi_pool_forward(input, rois, output, argmax, *, pooled_height, pooled_width, spatial_scale)
    roi_pool_backward(grad_output, rois, argmax, grad_input, *, pooled_height, pooled_width,
                      spatial_scale)

roi_pool uses mmcv's bins (round_rois=False: cut from the scaled corners, x2 + 1 inclusive), not
torchvision's rounding. For max-pooled RoIAlign, mmcv's extension keeps each bin's maximum sample
position (argmax_y, argmax_x) for its backward; opbridge's roi_align takes the gradient from the
input instead, so here the forward fills them with NaN and the backward of max pooling raises,
saying to run the model under opbridge.substitutions() (RoIAlignFunction then runs opbridge's
roi_align with its own gradient). Average pooling, mmdet's, runs both ways.
"""

from __future__ import annotations

import torch
from torch import Tensor

import opbridge

opbridge.load_torch()
_OPS = torch.ops.opbridge

__all__ = ["roi_align_backward", "roi_align_forward", "roi_pool_backward", "roi_pool_forward"]

_POOL_MODES = {0: "max", 1: "avg"}


def _align_attrs(aligned_height, aligned_width, spatial_scale, sampling_ratio, pool_mode, aligned) -> dict:
    if pool_mode not in _POOL_MODES:
        raise RuntimeError(f"mmcv._ext.roi_align: pool_mode must be 0 (max) or 1 (avg), got {pool_mode!r}")
    return dict(output_size=[int(aligned_height), int(aligned_width)], spatial_scale=float(spatial_scale),
                sampling_ratio=int(sampling_ratio), pool_mode=_POOL_MODES[pool_mode], aligned=bool(aligned))


def roi_align_forward(input: Tensor, rois: Tensor, output: Tensor, argmax_y: Tensor, argmax_x: Tensor, *,
                      aligned_height: int, aligned_width: int, spatial_scale: float, sampling_ratio: int,
                      pool_mode: int, aligned: bool) -> None:
    """output (K, C, aligned_height, aligned_width), filled; argmax_y/x (max pooling) filled with NaN."""
    attrs = _align_attrs(aligned_height, aligned_width, spatial_scale, sampling_ratio, pool_mode, aligned)
    output.copy_(_OPS.roi_align(input, rois.to(input.dtype), **attrs))
    if attrs["pool_mode"] == "max":
        argmax_y.fill_(float("nan"))
        argmax_x.fill_(float("nan"))


def roi_align_backward(grad_output: Tensor, rois: Tensor, argmax_y: Tensor, argmax_x: Tensor, grad_input: Tensor, *,
                       aligned_height: int, aligned_width: int, spatial_scale: float, sampling_ratio: int,
                       pool_mode: int, aligned: bool) -> None:
    """grad_input (N, C, H, W), filled (average pooling: the gradient needs no input values)."""
    attrs = _align_attrs(aligned_height, aligned_width, spatial_scale, sampling_ratio, pool_mode, aligned)
    if attrs["pool_mode"] == "max":
        raise RuntimeError(
            "mmcv._ext.roi_align_backward (called by mmcv.ops.roi_align): the gradient of max-pooled RoIAlign needs "
            "the input, which mmcv's RoIAlignFunction does not keep (its compiled extension keeps the maximum's "
            "positions, which opbridge's roi_align does not return). Run the model under opbridge.substitutions(): "
            "RoIAlignFunction then runs opbridge::roi_align, whose backward has the input.")
    # Average pooling reads only the input's shape: grad_input stands in for it.
    grad_input.copy_(_OPS.roi_align_backward(grad_output.contiguous(), grad_input, rois.to(grad_input.dtype),
                                             **attrs))


def roi_pool_forward(input: Tensor, rois: Tensor, output: Tensor, argmax: Tensor, *, pooled_height: int,
                     pooled_width: int, spatial_scale: float) -> None:
    """output and argmax (K, C, pooled_height, pooled_width), filled."""
    out, arg = _OPS.roi_pool(input, rois.to(input.dtype), output_size=[int(pooled_height), int(pooled_width)],
                             spatial_scale=float(spatial_scale), round_rois=False)
    output.copy_(out)
    argmax.copy_(arg)


def roi_pool_backward(grad_output: Tensor, rois: Tensor, argmax: Tensor, grad_input: Tensor, *, pooled_height: int,
                      pooled_width: int, spatial_scale: float) -> None:
    """grad_input (N, C, H, W), filled: each bin's gradient at its argmax."""
    # The gradient reads only the input's shape: grad_input stands in for it.
    grad_input.copy_(_OPS.roi_pool_backward(grad_output.contiguous(), grad_input, rois.to(grad_input.dtype),
                                            argmax.to(torch.int32),
                                            output_size=[int(pooled_height), int(pooled_width)],
                                            spatial_scale=float(spatial_scale), round_rois=False))
