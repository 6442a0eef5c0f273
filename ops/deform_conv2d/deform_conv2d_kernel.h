// deform_conv2d's CPU kernel, defined in deform_conv2d_kernel.cc; the op itself is defined in
// deform_conv2d.cc.
#pragma once

#include <opbridge/kernel_context.h>

namespace opbridge {

// Runs on inputs the spec has already validated: ranks, dtypes, stride >= 1, and the channel,
// batch and spatial sizes its checks relate. Checks the rest of the attributes, divisibility by
// the groups, the mask's channels and a non-empty output.
void deform_conv2d_kernel(KernelContext& ctx);

}  // namespace opbridge
