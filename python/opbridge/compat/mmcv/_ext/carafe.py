"""mmcv._ext's CARAFE functions on opbridge::carafe and opbridge::carafe_backward, with the calling
convention mmcv/ops/carafe.py uses (outputs passed in and filled in place; kernel_size,
group_size and scale_factor as keywords):

    carafe_naive_forward(features, masks, output, *, kernel_size, group_size, scale_factor)
    carafe_naive_backward(top_grad, features, masks, bottom_grad, mask_grad, *, ...)
    carafe_forward(features, masks, rfeatures, routput, rmasks, output, *, ...)
    carafe_backward(top_grad, rfeatures, masks, rtop_grad, rbottom_grad_hs, rbottom_grad,
                    rmask_grad, bottom_grad, mask_grad, *, ...)

The naive backward adds its gradients to bottom_grad and mask_grad, as mmcv's kernel does (mmcv
passes zeros). carafe_forward's buffers are mmcv's channels-last copies, resized and filled as
its extension leaves them: rfeatures (N, H, W, C), which CARAFEFunction saves and hands to
carafe_backward as the features, routput (N, H*s, W*s, C) and rmasks (N, H*s, W*s, mask channels).
carafe_backward fills rtop_grad, rbottom_grad and rmask_grad the same way; rbottom_grad_hs, the
per-output-pixel feature gradient mmcv's CUDA kernel sums s×s at a time, is resized to its
(N, H*s, W*s, C) and left as it was passed: the op computes the gradient without it.
"""

from __future__ import annotations

import torch
from torch import Tensor

import opbridge

opbridge.load_torch()
_OPS = torch.ops.opbridge

__all__ = ["carafe_backward", "carafe_forward", "carafe_naive_backward", "carafe_naive_forward"]


def _fill(api: str, name: str, into: Tensor, value: Tensor, add: bool = False) -> None:
    if into.shape != value.shape:
        raise RuntimeError(f"mmcv._ext.{api}: {name} must have shape {tuple(value.shape)}, got {tuple(into.shape)}")
    if add:
        into.add_(value)
    else:
        into.copy_(value)


def _channels_last(api: str, name: str, into: Tensor, value: Tensor) -> None:
    """into, resized to value's (N, H, W, C) as mmcv's extension resizes it, holds value (N, C, H, W)."""
    into.resize_(value.shape[0], value.shape[2], value.shape[3], value.shape[1])
    _fill(api, name, into, value.permute(0, 2, 3, 1))


def carafe_naive_forward(features: Tensor, masks: Tensor, output: Tensor, *, kernel_size: int, group_size: int,
                         scale_factor: int) -> None:
    """output (N, C, H*s, W*s), filled."""
    with torch.no_grad():
        _fill("carafe_naive_forward", "output", output,
              _OPS.carafe(features, masks, int(kernel_size), int(group_size), int(scale_factor)))


def carafe_naive_backward(top_grad: Tensor, features: Tensor, masks: Tensor, bottom_grad: Tensor, mask_grad: Tensor,
                          *, kernel_size: int, group_size: int, scale_factor: int) -> None:
    """The gradients for features and masks, added to bottom_grad and mask_grad."""
    with torch.no_grad():
        grad_features, grad_masks = _OPS.carafe_backward(top_grad, features, masks, int(kernel_size),
                                                         int(group_size), int(scale_factor))
        _fill("carafe_naive_backward", "bottom_grad", bottom_grad, grad_features, add=True)
        _fill("carafe_naive_backward", "mask_grad", mask_grad, grad_masks, add=True)


def carafe_forward(features: Tensor, masks: Tensor, rfeatures: Tensor, routput: Tensor, rmasks: Tensor,
                   output: Tensor, *, kernel_size: int, group_size: int, scale_factor: int) -> None:
    """output (N, C, H*s, W*s), filled; rfeatures, routput and rmasks: channels-last copies."""
    with torch.no_grad():
        result = _OPS.carafe(features, masks, int(kernel_size), int(group_size), int(scale_factor))
        _fill("carafe_forward", "output", output, result)
        _channels_last("carafe_forward", "rfeatures", rfeatures, features)
        _channels_last("carafe_forward", "routput", routput, result)
        _channels_last("carafe_forward", "rmasks", rmasks, masks)


def carafe_backward(top_grad: Tensor, rfeatures: Tensor, masks: Tensor, rtop_grad: Tensor, rbottom_grad_hs: Tensor,
                    rbottom_grad: Tensor, rmask_grad: Tensor, bottom_grad: Tensor, mask_grad: Tensor, *,
                    kernel_size: int, group_size: int, scale_factor: int) -> None:
    """The gradients for features and masks into bottom_grad and mask_grad; the features are read
    from rfeatures, channels-last as carafe_forward left them (mmcv reads its memory that way
    whatever its shape says)."""
    n, c, h, w = bottom_grad.shape
    if rfeatures.numel() != n * c * h * w:
        raise RuntimeError(f"mmcv._ext.carafe_backward: rfeatures must hold the features channels-last, "
                           f"(N, H, W, C) = {(n, h, w, c)}, got {tuple(rfeatures.shape)}")
    with torch.no_grad():
        features = rfeatures.reshape(n, h, w, c).permute(0, 3, 1, 2)
        grad_features, grad_masks = _OPS.carafe_backward(top_grad, features, masks, int(kernel_size),
                                                         int(group_size), int(scale_factor))
        _fill("carafe_backward", "bottom_grad", bottom_grad, grad_features)
        _fill("carafe_backward", "mask_grad", mask_grad, grad_masks)
        _channels_last("carafe_backward", "rtop_grad", rtop_grad, top_grad)
        _channels_last("carafe_backward", "rbottom_grad", rbottom_grad, grad_features)
        _channels_last("carafe_backward", "rmask_grad", rmask_grad, grad_masks)
        rbottom_grad_hs.resize_(top_grad.shape[0], top_grad.shape[2], top_grad.shape[3], top_grad.shape[1])
