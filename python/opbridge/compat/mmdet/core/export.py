"""mmdet.core.export: mmdet 3.x's box coders (delta2bbox, tblr2bboxes, distance2bbox) clip boxes to
the image through `dynamic_clip_for_onnx` when torch.onnx.is_in_onnx_export(), a function of
mmdet 2.x that its 3.x wheel no longer ships. This one clips as their eager branch does, so the
exported model computes what the eager model computes."""

from __future__ import annotations

from typing import Sequence, Union

import torch
from torch import Tensor

__all__ = ["dynamic_clip_for_onnx"]


def dynamic_clip_for_onnx(x1: Tensor, y1: Tensor, x2: Tensor, y2: Tensor,
                          max_shape: Union[Tensor, Sequence[int]]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each x clamped to [0, width] and each y to [0, height], max_shape being (height, width, ...)
    as a tensor or a sequence (a traced size stays traced)."""
    if not isinstance(max_shape, Tensor):
        max_shape = torch.stack([torch.as_tensor(s) for s in list(max_shape)[:2]])
    height, width = max_shape[..., 0].to(x1), max_shape[..., 1].to(x1)
    if max_shape.dim() == 2:  # one (height, width) per image of a batch: x1 is (images, boxes)
        height, width = height[:, None], width[:, None]
    zero = x1.new_zeros(())
    return (torch.minimum(torch.maximum(x1, zero), width), torch.minimum(torch.maximum(y1, zero), height),
            torch.minimum(torch.maximum(x2, zero), width), torch.minimum(torch.maximum(y2, zero), height))
