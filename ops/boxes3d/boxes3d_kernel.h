// The 3-D box family's kernels (boxes3d.cc declares the ops).
#pragma once

#include <opbridge/op.h>

namespace opbridge {

void points_in_boxes_part_kernel(KernelContext& ctx, const TensorView& points, const TensorView& boxes,
                                 TensorView& box_idx);
void points_in_boxes_all_kernel(KernelContext& ctx, const TensorView& points, const TensorView& boxes,
                                TensorView& box_mask);
void boxes_overlap_bev_kernel(KernelContext& ctx, const TensorView& boxes_a, const TensorView& boxes_b,
                              TensorView& overlap);
void nms3d_kernel(KernelContext& ctx, const TensorView& boxes, const TensorView* scores, double iou_threshold,
                  TensorView& keep);
void nms3d_normal_kernel(KernelContext& ctx, const TensorView& boxes, const TensorView* scores,
                         double iou_threshold, TensorView& keep);

}  // namespace opbridge
