// The NMS family's kernels (nms.cc declares the ops).
#pragma once

#include <opbridge/op.h>

namespace opbridge {

void nms_kernel(KernelContext& ctx, const TensorView& boxes, const TensorView& scores, double iou_threshold,
                int64_t offset, double score_threshold, int64_t max_num, TensorView& inds);
void softnms_kernel(KernelContext& ctx, const TensorView& boxes, const TensorView& scores, double iou_threshold,
                    double sigma, double min_score, int64_t method, int64_t offset, TensorView& dets,
                    TensorView& inds);
void nms_match_kernel(KernelContext& ctx, const TensorView& dets, double iou_threshold, TensorView& matched,
                      TensorView& group);

}  // namespace opbridge
