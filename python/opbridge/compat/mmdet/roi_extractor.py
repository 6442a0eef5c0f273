"""mmdet's `SingleRoIExtractor.forward` (the RoI feature extractor of every two-stage detector), as
a substitution rule (opbridge.export and opbridge.substitutions() apply it).

mmdet's forward pools each pyramid level's RoIs with `if inds.numel() > 0:` and writes them back
with `roi_feats[inds] = ...`. A trace takes the branch the example's RoIs took: a level that had
none then yields zeros for every RoI at any other input, and a level that had exactly one bakes a
(C, h, w) reshape that fails at two. This forward pools every level unconditionally (opbridge's
RoI ops take zero RoIs) and puts the rows back in their order with one argsort, so each row is
computed as mmdet computes it, by the same RoI layer, at every input.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

import opbridge

__all__ = ["TARGET", "single_roi_extractor_forward"]

TARGET = "mmdet.models.roi_heads.roi_extractors.single_level_roi_extractor.SingleRoIExtractor.forward"


def single_roi_extractor_forward(self, feats: Sequence[Tensor], rois: Tensor,
                                 roi_scale_factor: Optional[float] = None) -> Tensor:
    """(K, C, h, w) features of (K, 5) RoIs (batch index, x1, y1, x2, y2), each pooled from the
    level mmdet's map_roi_levels assigns it."""
    rois = rois.type_as(feats[0])
    num_levels = len(feats)
    if num_levels == 1:
        return self.roi_layers[0](feats[0], rois)
    target_lvls = self.map_roi_levels(rois, num_levels)
    if roi_scale_factor is not None:
        rois = self.roi_rescale(rois, roi_scale_factor)
    pooled, order = [], []
    for i in range(num_levels):
        inds = (target_lvls == i).nonzero().squeeze(1)
        pooled.append(self.roi_layers[i](feats[i], rois[inds]))
        order.append(inds)
    return torch.cat(pooled)[torch.argsort(torch.cat(order))]


opbridge.substitute(TARGET, single_roi_extractor_forward,
                    doc="opbridge.compat.mmdet.roi_extractor: every level pooled, no branch on the RoIs' levels")
