// knn_query's CPU kernel, defined in knn_query_kernel.cc; the op itself is defined in knn_query.cc.
#pragma once

#include <opbridge/kernel_context.h>

namespace opbridge {

// Runs on inputs the spec has already validated: ranks, dtypes, k >= 1, (n, 3) and (m, 3)
// points, as many new_offset entries as offset entries. Checks what only values tell. dist gets
// Euclidean distances, or their squares (the same bits as the naive loop's sums) with `squared`.
void knn_query_kernel(KernelContext& ctx, const TensorView& xyz, const TensorView& offset, const TensorView* new_xyz,
                      const TensorView* new_offset, int64_t k, TensorView& idx, TensorView& dist, bool squared);

}  // namespace opbridge
