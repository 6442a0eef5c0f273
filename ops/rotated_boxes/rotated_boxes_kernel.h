// The kernels of ops/rotated_boxes (defined in rotated_boxes.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <opbridge/kernel_context.h>

namespace opbridge {

void box_iou_rotated_kernel(KernelContext& ctx, const TensorView& boxes1, const TensorView& boxes2,
                            const std::string& mode, bool clockwise, TensorView& ious);
void box_iou_rotated_aligned_kernel(KernelContext& ctx, const TensorView& boxes1, const TensorView& boxes2,
                                    const std::string& mode, bool clockwise, TensorView& ious);
void nms_rotated_kernel(KernelContext& ctx, const TensorView& dets, const TensorView& scores, const TensorView* labels,
                        double iou_threshold, bool clockwise, TensorView& kept_dets, TensorView& keep);

void roi_align_rotated_kernel(KernelContext& ctx, const TensorView& input, const TensorView& rois,
                              const std::vector<int64_t>& output_size, double spatial_scale, int64_t sampling_ratio,
                              bool aligned, bool clockwise, TensorView& output);
void roi_align_rotated_backward_kernel(KernelContext& ctx, const TensorView& grad_output, const TensorView& input,
                                       const TensorView& rois, const std::vector<int64_t>& output_size,
                                       double spatial_scale, int64_t sampling_ratio, bool aligned, bool clockwise,
                                       TensorView& grad_input);

}  // namespace opbridge
