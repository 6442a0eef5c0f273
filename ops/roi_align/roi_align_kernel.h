// The kernels of roi_align, roi_pool and ps_roi_align and their backward ops (roi_align.cc
// defines the ops). Sampling geometry shared by all of them is in roi_geometry.h.
#pragma once

#include <opbridge/op.h>

#include <string>
#include <vector>

namespace opbridge {

void roi_align_kernel(KernelContext& ctx, const TensorView& input, const TensorView& rois,
                      const std::vector<int64_t>& output_size, double spatial_scale, int64_t sampling_ratio,
                      const std::string& pool_mode, bool aligned, TensorView& output);
void roi_align_backward_kernel(KernelContext& ctx, const TensorView& grad_output, const TensorView& input,
                               const TensorView& rois, const std::vector<int64_t>& output_size, double spatial_scale,
                               int64_t sampling_ratio, const std::string& pool_mode, bool aligned,
                               TensorView& grad_input);

void roi_pool_kernel(KernelContext& ctx, const TensorView& input, const TensorView& rois,
                     const std::vector<int64_t>& output_size, double spatial_scale, bool round_rois,
                     TensorView& output, TensorView& argmax);
void roi_pool_backward_kernel(KernelContext& ctx, const TensorView& grad_output, const TensorView& input,
                              const TensorView& rois, const TensorView& argmax, const std::vector<int64_t>& output_size,
                              double spatial_scale, bool round_rois, TensorView& grad_input);

void ps_roi_align_kernel(KernelContext& ctx, const TensorView& input, const TensorView& rois,
                         const std::vector<int64_t>& output_size, double spatial_scale, int64_t sampling_ratio,
                         TensorView& output, TensorView& channel_mapping);
void ps_roi_align_backward_kernel(KernelContext& ctx, const TensorView& grad_output, const TensorView& input,
                                  const TensorView& rois, const std::vector<int64_t>& output_size,
                                  double spatial_scale, int64_t sampling_ratio, TensorView& grad_input);

}  // namespace opbridge
