"""mmcv._ext's 3-D box functions on opbridge's points_in_boxes_part / _all, boxes_overlap_bev, nms3d
and nms3d_normal ops, with the calling convention mmcv/ops/points_in_boxes.py and iou3d.py use
(the keyword names of mmcv's extension):

    points_in_boxes_part_forward(boxes_tensor, pts_tensor, box_idx_of_points_tensor): (B, N) int32,
        every entry written (the first box holding the point, -1 for none)
    points_in_boxes_all_forward(boxes_tensor, pts_tensor, box_idx_of_points_tensor): (B, N, M) 0/1
    points_in_boxes_cpu_forward(boxes_tensor, pts_tensor, pts_indices_tensor): one batch item,
        boxes (M, 7) and points (N, 3), into (M, N) 0/1 (box-major, as mmcv's CPU kernel fills it)
    iou3d_boxes_overlap_bev_forward(boxes_a, boxes_b, ans_iou): the (N, M) footprints' common areas
    iou3d_nms3d_forward(boxes, keep, num_out, nms_overlap_thresh): greedy NMS over the boxes in the
        order given (mmcv's Python sorts them by score first); keep[:num_out] filled, num_out set
    iou3d_nms3d_normal_forward(...): the same with the headings ignored
"""

from __future__ import annotations

import torch
from torch import Tensor

import opbridge

opbridge.load_torch()
_OPS = torch.ops.opbridge

__all__ = ["iou3d_boxes_overlap_bev_forward", "iou3d_nms3d_forward", "iou3d_nms3d_normal_forward",
           "points_in_boxes_all_forward", "points_in_boxes_cpu_forward", "points_in_boxes_part_forward"]


def _fill(name: str, out: Tensor, value: Tensor) -> None:
    if tuple(out.shape) != tuple(value.shape):
        raise RuntimeError(f"mmcv._ext.{name}: the output tensor is {tuple(out.shape)}, the result "
                           f"{tuple(value.shape)}")
    with torch.no_grad():
        out.copy_(value)


def points_in_boxes_part_forward(boxes_tensor: Tensor, pts_tensor: Tensor, box_idx_of_points_tensor: Tensor) -> None:
    """The first box (of its batch item) holding each point, -1 for none."""
    _fill("points_in_boxes_part_forward", box_idx_of_points_tensor,
          _OPS.points_in_boxes_part(pts_tensor.contiguous(), boxes_tensor.to(pts_tensor.dtype).contiguous()))


def points_in_boxes_all_forward(boxes_tensor: Tensor, pts_tensor: Tensor, box_idx_of_points_tensor: Tensor) -> None:
    """1 where box m holds point n, else 0."""
    _fill("points_in_boxes_all_forward", box_idx_of_points_tensor,
          _OPS.points_in_boxes_all(pts_tensor.contiguous(), boxes_tensor.to(pts_tensor.dtype).contiguous()))


def points_in_boxes_cpu_forward(boxes_tensor: Tensor, pts_tensor: Tensor, pts_indices_tensor: Tensor) -> None:
    """One batch item, box-major: pts_indices[m, n] = 1 where box m holds point n."""
    if boxes_tensor.dim() != 2 or pts_tensor.dim() != 2:
        raise RuntimeError(f"mmcv._ext.points_in_boxes_cpu_forward: boxes (M, 7) and points (N, 3) of one batch "
                           f"item, got {tuple(boxes_tensor.shape)} and {tuple(pts_tensor.shape)}")
    mask = _OPS.points_in_boxes_all(pts_tensor[None].contiguous(), boxes_tensor[None].to(pts_tensor.dtype).contiguous())
    _fill("points_in_boxes_cpu_forward", pts_indices_tensor, mask[0].t())


def iou3d_boxes_overlap_bev_forward(boxes_a: Tensor, boxes_b: Tensor, ans_iou: Tensor) -> None:
    """The area common to the footprints of every box of boxes_a and every box of boxes_b."""
    _fill("iou3d_boxes_overlap_bev_forward", ans_iou,
          _OPS.boxes_overlap_bev(boxes_a.contiguous(), boxes_b.to(boxes_a.dtype).contiguous()).to(ans_iou.dtype))


def _nms(name: str, op, boxes: Tensor, keep: Tensor, num_out: Tensor, threshold: float) -> None:
    kept = op(boxes.contiguous(), None, iou_threshold=float(threshold))
    if keep.dim() != 1 or keep.shape[0] < kept.shape[0]:
        raise RuntimeError(f"mmcv._ext.{name}: keep must be (N,) with N >= {kept.shape[0]} boxes kept, got "
                           f"{tuple(keep.shape)}")
    with torch.no_grad():
        keep[:kept.shape[0]].copy_(kept)
        num_out.fill_(kept.shape[0])


def iou3d_nms3d_forward(boxes: Tensor, keep: Tensor, num_out: Tensor, nms_overlap_thresh: float) -> None:
    """Greedy NMS on the rotated footprints, the boxes taken in the order given."""
    _nms("iou3d_nms3d_forward", _OPS.nms3d, boxes, keep, num_out, nms_overlap_thresh)


def iou3d_nms3d_normal_forward(boxes: Tensor, keep: Tensor, num_out: Tensor, nms_overlap_thresh: float) -> None:
    """Greedy NMS on the footprints with their headings ignored, in the order given."""
    _nms("iou3d_nms3d_normal_forward", _OPS.nms3d_normal, boxes, keep, num_out, nms_overlap_thresh)
