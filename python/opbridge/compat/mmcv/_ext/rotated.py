"""mmcv._ext's rotated-box functions on opbridge's box_iou_rotated, nms_rotated and
roi_align_rotated ops, with the calling convention mmcv/ops/box_iou_rotated.py, nms.py and
roi_align_rotated.py use (the keyword names of mmcv's extension):

    box_iou_rotated(boxes1, boxes2, ious, mode_flag, aligned): fills ious, (N * M,) or (N,), in place
    nms_rotated(dets, scores, order, dets_sorted, labels, iou_threshold, multi_label) -> kept indices
    roi_align_rotated_forward(input, rois, output, pooled_height, pooled_width, spatial_scale,
                              sampling_ratio, aligned, clockwise): fills output in place
    roi_align_rotated_backward(rois, grad_input, grad_output, pooled_height, ...): adds the input's
        gradient into the third tensor

mmcv's Python flips the angles itself for clockwise=False before box_iou_rotated and nms_rotated,
so these take the angles as they come (clockwise). Equal scores in nms_rotated go lowest index first;
mmcv's own order for them is undefined. With multi_label, `dets` carries the labels as a sixth
column and `labels` holds them: boxes of different labels never suppress each other (mmcv's
documented meaning; its CPU and CUDA kernels read the column but never compare it).
"""

from __future__ import annotations

import torch
from torch import Tensor

import opbridge

opbridge.load_torch()
_OPS = torch.ops.opbridge

__all__ = ["box_iou_rotated", "nms_rotated", "roi_align_rotated_backward", "roi_align_rotated_forward"]

_MODES = {0: "iou", 1: "iof"}


def _fill(name: str, out: Tensor, value: Tensor) -> None:
    if out.numel() != value.numel():
        raise RuntimeError(f"mmcv._ext.{name}: the output tensor has {out.numel()} elements, the result "
                           f"{value.numel()} ({tuple(value.shape)})")
    with torch.no_grad():
        out.copy_(value.reshape(out.shape))


def box_iou_rotated(boxes1: Tensor, boxes2: Tensor, ious: Tensor, mode_flag: int, aligned: bool) -> None:
    """The overlaps of boxes1 with boxes2 (pairwise, or row by row when aligned) into ious."""
    if mode_flag not in _MODES:
        raise RuntimeError(f"mmcv._ext.box_iou_rotated: mode_flag must be 0 (iou) or 1 (iof), got {mode_flag}")
    op = _OPS.box_iou_rotated_aligned if aligned else _OPS.box_iou_rotated
    _fill("box_iou_rotated", ious, op(boxes1, boxes2, mode=_MODES[mode_flag], clockwise=True).to(ious.dtype))


def nms_rotated(dets: Tensor, scores: Tensor, order: Tensor, dets_sorted: Tensor, labels: Tensor,
                iou_threshold: float, multi_label: bool) -> Tensor:
    """Indices (int64) of the boxes greedy rotated NMS keeps, by descending score. `order` and
    `dets_sorted` (mmcv's CUDA inputs) are not needed: the op sorts by itself."""
    boxes = dets[:, :5] if dets.dim() == 2 else dets
    return _OPS.nms_rotated(boxes.contiguous(), scores, labels.long() if multi_label else None,
                            iou_threshold=float(iou_threshold), clockwise=True)[1]


def roi_align_rotated_forward(input: Tensor, rois: Tensor, output: Tensor, pooled_height: int, pooled_width: int,
                              spatial_scale: float, sampling_ratio: int, aligned: bool, clockwise: bool) -> None:
    """RoIAlignRotated's forward into output (K, C, pooled_height, pooled_width)."""
    _fill("roi_align_rotated_forward", output,
          _OPS.roi_align_rotated(input, rois.to(input.dtype), [int(pooled_height), int(pooled_width)],
                                 float(spatial_scale), int(sampling_ratio), bool(aligned), bool(clockwise)))


def roi_align_rotated_backward(rois: Tensor, grad_input: Tensor, grad_output: Tensor, pooled_height: int,
                               pooled_width: int, spatial_scale: float, sampling_ratio: int, aligned: bool,
                               clockwise: bool) -> None:
    """RoIAlignRotated's input gradient, added into the third tensor as mmcv's kernel adds it.

    mmcv's extension names its first three parameters (rois, grad_input, grad_output), but its
    C++ function takes them, by position, as (the output's gradient, the RoIs, the input's
    gradient), and mmcv/ops/roi_align_rotated.py passes them so, by position. The names are kept
    for calls by keyword; the meanings are the positions'."""
    top_grad, boxes, bottom_grad = rois, grad_input, grad_output
    grad = _OPS.roi_align_rotated_backward(top_grad.contiguous(), bottom_grad, boxes.to(bottom_grad.dtype),
                                           [int(pooled_height), int(pooled_width)], float(spatial_scale),
                                           int(sampling_ratio), bool(aligned), bool(clockwise))
    with torch.no_grad():
        bottom_grad.add_(grad)
