"""mmcv's `box_iou_rotated(bboxes1, bboxes2, mode='iou', aligned=False, clockwise=True)` on
opbridge's ops, as a substitution rule (opbridge.export and opbridge.substitutions() apply it).

The function returns (N, M) overlaps, or (N,) with aligned=True: two ops, box_iou_rotated and
box_iou_rotated_aligned, since an op's output rank cannot follow an attribute. A rule declared in
an op's definition binds a target to one op, so this one lives here and picks the op by `aligned`.
mmcv's nms_rotated and RoIAlignRotatedFunction are bound in the ops' definitions
(ops/rotated_boxes/rotated_boxes.cc).
"""

from __future__ import annotations

import torch
from torch import Tensor

import opbridge

opbridge.load_torch()  # torch.ops.opbridge.* exist from here on

__all__ = ["TARGET", "box_iou_rotated"]

TARGET = "mmcv.ops.box_iou_rotated.box_iou_rotated"


def box_iou_rotated(bboxes1: Tensor, bboxes2: Tensor, mode: str = "iou", aligned: bool = False,
                    clockwise: bool = True) -> Tensor:
    """mmcv.ops.box_iou_rotated: (N, M) overlaps of (N, 5) and (M, 5) rotated boxes, or (N,) for
    aligned=True; mode 'iou' or 'iof'."""
    if mode not in ("iou", "iof"):
        raise ValueError(f"mmcv.ops.box_iou_rotated: mode must be 'iou' or 'iof', got {mode!r}")
    op = torch.ops.opbridge.box_iou_rotated_aligned if aligned else torch.ops.opbridge.box_iou_rotated
    return op(bboxes1, bboxes2, mode=mode, clockwise=bool(clockwise))


opbridge.substitute(TARGET, box_iou_rotated,
                    doc="opbridge.compat.mmcv.rotated: opbridge::box_iou_rotated, or box_iou_rotated_aligned "
                        "for aligned=True")
