// multi_scale_deformable_attention's CPU kernels, defined in msda_kernel.cc; the ops are defined
// in multi_scale_deformable_attention.cc.
#pragma once

#include <opbridge/kernel_context.h>

namespace opbridge {

// Run on inputs the spec has validated (ranks, dtypes, the dimensions that must agree). Check
// what only values tell: the levels' sizes against value's S axis and level_start_index.
void msda_kernel(KernelContext& ctx, const TensorView& value, const TensorView& spatial_shapes,
                 const TensorView& level_start_index, const TensorView& sampling_locations,
                 const TensorView& attention_weights, TensorView& output);

void msda_backward_kernel(KernelContext& ctx, const TensorView& grad_output, const TensorView& value,
                          const TensorView& spatial_shapes, const TensorView& level_start_index,
                          const TensorView& sampling_locations, const TensorView& attention_weights,
                          TensorView& grad_value, TensorView& grad_sampling_locations,
                          TensorView& grad_attention_weights);

}  // namespace opbridge
