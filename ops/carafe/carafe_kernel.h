// carafe's CPU kernels, defined in carafe_kernel.cc; the op itself is defined in carafe.cc.
#pragma once

#include <opbridge/kernel_context.h>

namespace opbridge {

// Run on inputs the spec has already validated: features (N, C, H, W), masks
// (N, group_size * k * k, H * s, W * s), k odd, C divisible by group_size.
void carafe_kernel(KernelContext& ctx, const TensorView& features, const TensorView& masks, int64_t kernel_size,
                   int64_t group_size, int64_t scale_factor, TensorView& output);

void carafe_backward_kernel(KernelContext& ctx, const TensorView& grad_output, const TensorView& features,
                            const TensorView& masks, int64_t kernel_size, int64_t group_size, int64_t scale_factor,
                            TensorView& grad_features, TensorView& grad_masks);

}  // namespace opbridge
