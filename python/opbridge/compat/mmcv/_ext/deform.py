"""mmcv._ext's deformable convolutions and multi-scale deformable attention, on
opbridge::deform_conv2d and opbridge::multi_scale_deformable_attention and their backward ops,
the parameters named as mmcv's bindings (its pybind.cpp) name them.
mmcv's column and ones buffers (scratch space of its im2col kernels) and im2col_step (its batch
chunking) are taken and not needed: the ops take the whole batch at once."""

from __future__ import annotations

import torch
from torch import Tensor

import opbridge

opbridge.load_torch()
_OPS = torch.ops.opbridge

__all__ = ["deform_conv_backward_input", "deform_conv_backward_parameters", "deform_conv_forward",
           "modulated_deform_conv_backward", "modulated_deform_conv_forward", "ms_deform_attn_backward",
           "ms_deform_attn_forward"]


def _geometry(dH, dW, padH, padW, dilationH, dilationW, group, deformable_group) -> tuple:
    return [dH, dW], [padH, padW], [dilationH, dilationW], group, deformable_group


def deform_conv_forward(input: Tensor, weight: Tensor, offset: Tensor, output: Tensor, columns: Tensor,
                        ones: Tensor, kW: int, kH: int, dW: int, dH: int, padW: int, padH: int, dilationW: int,
                        dilationH: int, group: int, deformable_group: int, im2col_step: int) -> None:
    """DCNv1: output (N, C_out, H_out, W_out), filled."""
    output.copy_(_OPS.deform_conv2d(input, weight, offset, None, None,
                                    *_geometry(dH, dW, padH, padW, dilationH, dilationW, group, deformable_group)))


def _deform_backward(input, offset, grad_output, weight, mask, dH, dW, padH, padW, dilationH, dilationW, group,
                     deformable_group):
    """(grad_input, grad_weight, grad_offset, grad_bias, grad_mask)."""
    return _OPS.deform_conv2d_backward(grad_output.contiguous(), input, weight, offset, mask,
                                       *_geometry(dH, dW, padH, padW, dilationH, dilationW, group, deformable_group))


def deform_conv_backward_input(input: Tensor, offset: Tensor, gradOutput: Tensor, gradInput: Tensor,  # noqa: N803
                               gradOffset: Tensor, weight: Tensor, columns: Tensor, kW: int, kH: int, dW: int,
                               dH: int, padW: int, padH: int, dilationW: int, dilationH: int, group: int,
                               deformable_group: int, im2col_step: int) -> None:
    """DCNv1's gradients for input and offset, filled."""
    grads = _deform_backward(input, offset, gradOutput, weight, None, dH, dW, padH, padW, dilationH, dilationW, group,
                             deformable_group)
    gradInput.copy_(grads[0])
    gradOffset.copy_(grads[2])


def deform_conv_backward_parameters(input: Tensor, offset: Tensor, gradOutput: Tensor, gradWeight: Tensor,  # noqa: N803
                                    columns: Tensor, ones: Tensor, kW: int, kH: int, dW: int, dH: int, padW: int,
                                    padH: int, dilationW: int, dilationH: int, group: int, deformable_group: int,
                                    scale: float, im2col_step: int) -> None:
    """DCNv1's weight gradient, times `scale`, added to gradWeight (as mmcv accumulates it). mmcv
    passes no weight here: the weight's gradient does not depend on it, so zeros stand in."""
    grads = _deform_backward(input, offset, gradOutput, gradWeight.new_zeros(gradWeight.shape), None, dH, dW, padH,
                             padW, dilationH, dilationW, group, deformable_group)
    gradWeight.add_(grads[1], alpha=scale)


def modulated_deform_conv_forward(input: Tensor, weight: Tensor, bias: Tensor, ones: Tensor, offset: Tensor,
                                  mask: Tensor, output: Tensor, columns: Tensor, kernel_h: int, kernel_w: int,
                                  stride_h: int, stride_w: int, pad_h: int, pad_w: int, dilation_h: int,
                                  dilation_w: int, group: int, deformable_group: int, with_bias: bool) -> None:
    """DCNv2: output (N, C_out, H_out, W_out), filled; bias is an empty stand-in unless with_bias."""
    output.copy_(_OPS.deform_conv2d(input, weight, offset, bias if with_bias else None, mask,
                                    *_geometry(stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group,
                                               deformable_group)))


def modulated_deform_conv_backward(input: Tensor, weight: Tensor, bias: Tensor, ones: Tensor, offset: Tensor,
                                   mask: Tensor, columns: Tensor, grad_input: Tensor, grad_weight: Tensor,
                                   grad_bias: Tensor, grad_offset: Tensor, grad_mask: Tensor, grad_output: Tensor,
                                   kernel_h: int, kernel_w: int, stride_h: int, stride_w: int, pad_h: int, pad_w: int,
                                   dilation_h: int, dilation_w: int, group: int, deformable_group: int,
                                   with_bias: bool) -> None:
    """DCNv2's gradients for input, weight, bias (with_bias), offset and mask, filled."""
    gi, gw, goff, gb, gm = _deform_backward(input, offset, grad_output, weight, mask, stride_h, stride_w, pad_h, pad_w,
                                            dilation_h, dilation_w, group, deformable_group)
    grad_input.copy_(gi)
    grad_weight.copy_(gw)
    grad_offset.copy_(goff)
    grad_mask.copy_(gm)
    if with_bias:
        grad_bias.copy_(gb)


def ms_deform_attn_forward(value: Tensor, value_spatial_shapes: Tensor, value_level_start_index: Tensor,
                           sampling_locations: Tensor, attention_weights: Tensor, im2col_step: int) -> Tensor:
    """Multi-scale deformable attention: (B, Q, H*D), returned (mmcv's one function that returns)."""
    return _OPS.multi_scale_deformable_attention(value, value_spatial_shapes, value_level_start_index,
                                                 sampling_locations, attention_weights)


def ms_deform_attn_backward(value: Tensor, value_spatial_shapes: Tensor, value_level_start_index: Tensor,
                            sampling_locations: Tensor, attention_weights: Tensor, grad_output: Tensor,
                            grad_value: Tensor, grad_sampling_loc: Tensor, grad_attn_weight: Tensor,
                            im2col_step: int) -> None:
    """Its gradients for value, sampling locations and attention weights, filled."""
    gv, gl, ga = _OPS.multi_scale_deformable_attention_backward(grad_output.contiguous(), value, value_spatial_shapes,
                                                                value_level_start_index, sampling_locations,
                                                                attention_weights)
    grad_value.copy_(gv)
    grad_sampling_loc.copy_(gl)
    grad_attn_weight.copy_(ga)
