"""mmcv._ext's NMS functions on opbridge's nms, softnms and nms_match ops, with the calling
convention mmcv/ops/nms.py uses (the keyword names of mmcv's extension; all are required there):

    nms(boxes, scores, iou_threshold, offset) -> kept indices (int64)
    softnms(boxes, scores, dets, iou_threshold, sigma, min_score, method, offset) -> kept indices;
        the first len(indices) rows of `dets` (N, 5) are filled in place, the rest left as they are
    nms_match(dets, iou_threshold) -> a list of groups, each a list of box indices (kept box first)

Equal scores go lowest index first (see docs/ops/nms.md); mmcv's own order for them is undefined.
"""

from __future__ import annotations

from typing import List

import torch
from torch import Tensor

import opbridge

opbridge.load_torch()
_OPS = torch.ops.opbridge

__all__ = ["nms", "nms_match", "softnms"]


def nms(boxes: Tensor, scores: Tensor, iou_threshold: float, offset: int) -> Tensor:
    """Indices of the boxes greedy NMS keeps, by descending score."""
    return _OPS.nms(boxes, scores, float(iou_threshold), int(offset))


def softnms(boxes: Tensor, scores: Tensor, dets: Tensor, iou_threshold: float, sigma: float, min_score: float,
            method: int, offset: int) -> Tensor:
    """Soft-NMS: fills dets[:k] with the boxes taken and their weighted scores, returns their indices."""
    kept, inds = _OPS.softnms(boxes, scores, float(iou_threshold), float(sigma), float(min_score),
                                            int(method), int(offset))
    if dets.dim() != 2 or dets.shape[1] != 5 or dets.shape[0] < kept.shape[0]:
        raise RuntimeError(f"mmcv._ext.softnms: dets must be (N, 5) with N >= {kept.shape[0]} boxes taken, "
                           f"got {tuple(dets.shape)}")
    with torch.no_grad():
        dets[:kept.shape[0]].copy_(kept)
    return inds


def nms_match(dets: Tensor, iou_threshold: float) -> List[List[int]]:
    """The groups of nms_match as mmcv's extension returns them: lists of indices, kept box first."""
    matched, group = _OPS.nms_match(dets, float(iou_threshold))
    if matched.numel() == 0:
        return []
    sizes = torch.unique_consecutive(group, return_counts=True)[1].tolist()
    return [g.tolist() for g in torch.split(matched, sizes)]
