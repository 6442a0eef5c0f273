"""mmcv's 3-D box functions (mmcv/ops/iou3d.py) that are Python over other ops, as substitution
rules on opbridge's ops (opbridge.export and opbridge.substitutions() apply them):

    boxes_iou3d(boxes_a, boxes_b)            boxes_overlap_bev's areas times the z overlap, over the union
    boxes_iou_bev(boxes_a, boxes_b)          box_iou_rotated of (x1, y1, x2, y2, heading) boxes
    nms_bev(boxes, scores, thresh, pre_max_size=None, post_max_size=None)   on nms_rotated
    nms_normal_bev(boxes, scores, thresh)    on nms, the headings dropped

mmcv's nms3d, nms3d_normal, boxes_overlap_bev and points_in_boxes_part / _all / _cpu are bound in
the ops' definitions (ops/boxes3d/boxes3d.cc): mmcv allocates their outputs at their largest and
slices them by a count read as a Python int, which no exporter carries. mmdet3d 1.x's own nms_bev
and nms_normal_bev (mmdet3d.models.layers.box3d_nms) are mmcv's again, and take the same rules.
Equal scores go lowest index first; mmcv's sort leaves their order undefined.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

import opbridge

opbridge.load_torch()  # torch.ops.opbridge.* exist from here on
_OPS = torch.ops.opbridge

__all__ = ["boxes_iou3d", "boxes_iou_bev", "nms_bev", "nms_normal_bev"]


def _xywhr(boxes: Tensor) -> Tensor:
    """(x1, y1, x2, y2, heading) -> (centre x, centre y, width, height, heading), as mmcv converts."""
    return torch.stack(((boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2, boxes[:, 2] - boxes[:, 0],
                        boxes[:, 3] - boxes[:, 1], boxes[:, 4]), dim=-1)


def boxes_iou3d(boxes_a: Tensor, boxes_b: Tensor) -> Tensor:
    """mmcv.ops.boxes_iou3d: (M, N) 3-D IoU of (M, 7) and (N, 7) boxes (z the centre, as mmcv reads
    it); boxes_overlap_bev refuses other shapes."""
    top_a, bottom_a = (boxes_a[:, 2] + boxes_a[:, 5] / 2).view(-1, 1), (boxes_a[:, 2] - boxes_a[:, 5] / 2).view(-1, 1)
    top_b, bottom_b = (boxes_b[:, 2] + boxes_b[:, 5] / 2).view(1, -1), (boxes_b[:, 2] - boxes_b[:, 5] / 2).view(1, -1)
    overlap_bev = _OPS.boxes_overlap_bev(boxes_a.contiguous(), boxes_b.to(boxes_a.dtype).contiguous())
    overlap_h = torch.clamp(torch.min(top_a, top_b) - torch.max(bottom_a, bottom_b), min=0)
    overlap_3d = overlap_bev * overlap_h
    vol_a = (boxes_a[:, 3] * boxes_a[:, 4] * boxes_a[:, 5]).view(-1, 1)
    vol_b = (boxes_b[:, 3] * boxes_b[:, 4] * boxes_b[:, 5]).view(1, -1)
    return overlap_3d / torch.clamp(vol_a + vol_b - overlap_3d, min=1e-6)


def boxes_iou_bev(boxes_a: Tensor, boxes_b: Tensor) -> Tensor:
    """mmcv.ops.boxes_iou_bev: (M, N) IoU of (x1, y1, x2, y2, heading) boxes, turned clockwise on screen."""
    return _OPS.box_iou_rotated(_xywhr(boxes_a).contiguous(), _xywhr(boxes_b).contiguous(), mode="iou", clockwise=True)


def _five_columns(name: str, boxes: Tensor) -> None:
    # Checked in eager (and on the example before an export): a trace would record the comparison.
    if not torch.jit.is_tracing() and (boxes.dim() != 2 or boxes.shape[1] != 5):
        raise ValueError(f"mmcv.ops.{name}: boxes must be (N, 5): x1, y1, x2, y2, heading; got {tuple(boxes.shape)}")


def nms_bev(boxes: Tensor, scores: Tensor, thresh: float, pre_max_size: Optional[int] = None,
            post_max_size: Optional[int] = None) -> Tensor:
    """mmcv.ops.nms_bev: indices kept by rotated NMS (IoU >= thresh suppresses, nms_rotated's rule)
    over the pre_max_size best-scoring (x1, y1, x2, y2, heading) boxes, the first post_max_size, by
    descending score."""
    _five_columns("nms_bev", boxes)
    xywhr = _xywhr(boxes)
    if pre_max_size is None:
        keep = _OPS.nms_rotated(xywhr.contiguous(), scores, None, iou_threshold=float(thresh), clockwise=True)[1]
    else:
        top = _best(scores, int(pre_max_size))
        keep = top[_OPS.nms_rotated(xywhr[top].contiguous(), scores[top], None, iou_threshold=float(thresh),
                                    clockwise=True)[1]]
    return keep if post_max_size is None else keep[:post_max_size]


def _best(scores: Tensor, k: int) -> Tensor:
    """The indices, ascending, of the k best scores, ties at the cut going to the lower index: the
    k-th best value is unambiguous whatever the sort's order of ties (neither exporter writes a
    stable sort), so the cut is drawn by value, then by index among the equal. NaN scores are kept
    for nms_rotated to refuse, naming them."""
    cut = torch.sort(scores, descending=True)[0][:k][-1:]  # empty for no boxes
    above, level = (scores[:, None] > cut).any(1), (scores[:, None] == cut).any(1)  # k = 0: neither
    room = torch.clamp(cut.new_tensor(k, dtype=torch.int64).clamp(max=scores.shape[0]) - above.sum(), min=0)
    chosen = above | (level & (torch.cumsum(level.to(torch.int64), 0) <= room)) | torch.isnan(scores)
    return torch.nonzero(chosen).squeeze(1)


def nms_normal_bev(boxes: Tensor, scores: Tensor, thresh: float) -> Tensor:
    """mmcv.ops.nms_normal_bev: indices kept by axis-aligned NMS (IoU above thresh suppresses) over
    (x1, y1, x2, y2) with the heading dropped, by descending score."""
    _five_columns("nms_normal_bev", boxes)
    return _OPS.nms(boxes[:, :4].contiguous(), scores, float(thresh), 0)


for _module in ("mmcv.ops.iou3d", "mmdet3d.models.layers.box3d_nms"):
    for _fn in (nms_bev, nms_normal_bev):
        opbridge.substitute(f"{_module}.{_fn.__name__}", _fn,
                            doc=f"opbridge.compat.mmcv.boxes3d.{_fn.__name__}, on opbridge's ops")
for _fn in (boxes_iou3d, boxes_iou_bev):
    opbridge.substitute(f"mmcv.ops.iou3d.{_fn.__name__}", _fn,
                        doc=f"opbridge.compat.mmcv.boxes3d.{_fn.__name__}, on opbridge's ops")
