"""mmcv.ops' deformable convolutions on opbridge::deform_conv2d, with mmcv 2.x's signatures,
defaults and parameters (state dicts load unchanged):

    deform_conv2d(input, offset, weight, stride=1, padding=0, dilation=1, groups=1, deform_groups=1,
                  bias=False, im2col_step=32)
    modulated_deform_conv2d(input, offset, mask, weight, bias=None, stride=1, padding=0, dilation=1,
                            groups=1, deform_groups=1)
    DeformConv2d, DeformConv2dPack, ModulatedDeformConv2d, ModulatedDeformConv2dPack

mmcv's offsets are torchvision's layout ((dy, dx) per kernel point, per offset group), which
opbridge::deform_conv2d takes. im2col_step only sizes mmcv's CUDA batches: it is accepted and has no
effect. The registry names DCN and DCNv2 are mmcv's and are not provided.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn
from torch.nn.modules.utils import _pair

from .. import _batches  # noqa: F401  loads opbridge's ops

__all__ = ["DeformConv2d", "DeformConv2dPack", "ModulatedDeformConv2d", "ModulatedDeformConv2dPack",
           "deform_conv2d", "modulated_deform_conv2d"]

_Size = Union[int, Tuple[int, ...]]


def deform_conv2d(input: Tensor, offset: Tensor, weight: Tensor, stride: _Size = 1, padding: _Size = 0,
                  dilation: _Size = 1, groups: int = 1, deform_groups: int = 1, bias: bool = False,
                  im2col_step: int = 32) -> Tensor:
    """Deformable convolution (DCNv1): no mask, no bias (mmcv accepts only bias=False)."""
    if bias is not False:
        raise ValueError("mmcv.ops.deform_conv2d: only bias=False is supported (as in mmcv)")
    if input is not None and input.dim() != 4:
        raise ValueError(f"mmcv.ops.deform_conv2d: expected a 4-D input, got {input.dim()}-D")
    input = input.type_as(offset)
    return torch.ops.opbridge.deform_conv2d(input, weight.type_as(input), offset, None, None, _pair(stride),
                                            _pair(padding), _pair(dilation), groups, deform_groups)


def modulated_deform_conv2d(input: Tensor, offset: Tensor, mask: Tensor, weight: Tensor,
                            bias: Optional[Tensor] = None, stride: _Size = 1, padding: _Size = 0,
                            dilation: _Size = 1, groups: int = 1, deform_groups: int = 1) -> Tensor:
    """Modulated deformable convolution (DCNv2): each sample scaled by its mask."""
    input = input.type_as(offset)
    return torch.ops.opbridge.deform_conv2d(input, weight.type_as(input), offset,
                                            None if bias is None else bias.type_as(input), mask.type_as(input),
                                            _pair(stride), _pair(padding), _pair(dilation), groups, deform_groups)


class DeformConv2d(nn.Module):
    """mmcv's DeformConv2d: forward(x, offset); a weight and no bias."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _Size, stride: _Size = 1,
                 padding: _Size = 0, dilation: _Size = 1, groups: int = 1, deform_groups: int = 1,
                 bias: bool = False, im2col_step: int = 32) -> None:
        super().__init__()
        if bias:
            raise ValueError(f"bias={bias} is not supported in DeformConv2d.")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"DeformConv2d: in_channels {in_channels} and out_channels {out_channels} must be "
                             f"divisible by groups {groups}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride = _pair(kernel_size), _pair(stride)
        self.padding, self.dilation = _pair(padding), _pair(dilation)
        self.groups, self.deform_groups, self.im2col_step = groups, deform_groups, im2col_step
        self.transposed, self.output_padding = False, (0,)
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, nonlinearity="relu")

    def forward(self, x: Tensor, offset: Tensor) -> Tensor:
        # An input smaller than the kernel is padded on the bottom and right, and the output cut back.
        kh, kw = self.kernel_size
        pad_h, pad_w = max(kh - x.size(2), 0), max(kw - x.size(3), 0)
        if pad_h or pad_w:
            x = nn.functional.pad(x, (0, pad_w, 0, pad_h))
            offset = nn.functional.pad(offset, (0, pad_w, 0, pad_h))
        out = deform_conv2d(x, offset, self.weight, self.stride, self.padding, self.dilation, self.groups,
                            self.deform_groups, False, self.im2col_step)
        if pad_h or pad_w:
            out = out[:, :, :out.size(2) - pad_h, :out.size(3) - pad_w].contiguous()
        return out

    def extra_repr(self) -> str:
        return (f"in_channels={self.in_channels}, out_channels={self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"deform_groups={self.deform_groups}, bias=False")


class _Version2:
    """mmcv's Pack layers before their version 2 named the offset convolution `<name>_offset`:
    such checkpoints load into `conv_offset`."""

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        if (local_metadata.get("version") or 0) < 2:
            for part in ("weight", "bias"):
                old = f"{prefix[:-1]}_offset.{part}"
                if old in state_dict:
                    state_dict[f"{prefix}conv_offset.{part}"] = state_dict.pop(old)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


class DeformConv2dPack(_Version2, DeformConv2d):
    """DeformConv2d that predicts its own offsets with a convolution (`conv_offset`, zero at start)."""

    _version = 2

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.conv_offset = nn.Conv2d(self.in_channels, self.deform_groups * 2 * self.kernel_size[0] * self.kernel_size[1],
                                     kernel_size=self.kernel_size, stride=self.stride, padding=self.padding,
                                     dilation=self.dilation, bias=True)
        self.init_offset()

    def init_offset(self) -> None:
        self.conv_offset.weight.data.zero_()
        self.conv_offset.bias.data.zero_()

    def forward(self, x: Tensor) -> Tensor:
        return deform_conv2d(x, self.conv_offset(x), self.weight, self.stride, self.padding, self.dilation,
                             self.groups, self.deform_groups, False, self.im2col_step)


class ModulatedDeformConv2d(nn.Module):
    """mmcv's ModulatedDeformConv2d: forward(x, offset, mask); a weight and (by default) a bias."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _Size, stride: int = 1, padding: int = 0,
                 dilation: int = 1, groups: int = 1, deform_groups: int = 1, bias: Union[bool, str] = True):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride = _pair(kernel_size), _pair(stride)
        self.padding, self.dilation = _pair(padding), _pair(dilation)
        self.groups, self.deform_groups = groups, deform_groups
        self.transposed, self.output_padding = False, (0,)
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.init_weights()

    def init_weights(self) -> None:
        bound = 1.0 / math.sqrt(self.in_channels * self.kernel_size[0] * self.kernel_size[1])
        self.weight.data.uniform_(-bound, bound)
        if self.bias is not None:
            self.bias.data.zero_()

    def forward(self, x: Tensor, offset: Tensor, mask: Tensor) -> Tensor:
        return modulated_deform_conv2d(x, offset, mask, self.weight, self.bias, self.stride, self.padding,
                                       self.dilation, self.groups, self.deform_groups)


class ModulatedDeformConv2dPack(_Version2, ModulatedDeformConv2d):
    """ModulatedDeformConv2d that predicts its offsets and mask with `conv_offset` (3 parts: the
    first two the offsets, the last the mask through a sigmoid; zero at start)."""

    _version = 2

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.conv_offset = nn.Conv2d(self.in_channels, self.deform_groups * 3 * self.kernel_size[0] * self.kernel_size[1],
                                     kernel_size=self.kernel_size, stride=self.stride, padding=self.padding,
                                     dilation=self.dilation, bias=True)
        self.init_weights()

    def init_weights(self) -> None:
        super().init_weights()
        if hasattr(self, "conv_offset"):
            self.conv_offset.weight.data.zero_()
            self.conv_offset.bias.data.zero_()

    def forward(self, x: Tensor) -> Tensor:
        o1, o2, mask = torch.chunk(self.conv_offset(x), 3, dim=1)
        return modulated_deform_conv2d(x, torch.cat((o1, o2), dim=1), torch.sigmoid(mask), self.weight, self.bias,
                                       self.stride, self.padding, self.dilation, self.groups, self.deform_groups)
