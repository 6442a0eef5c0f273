// ball_query's CPU kernel, defined in ball_query_kernel.cc; the op itself is defined in
// ball_query.cc.
#pragma once

#include <opbridge/kernel_context.h>

#include <string>

namespace opbridge {

// Runs on inputs the spec has already validated: ranks, dtypes, (B, N, 3) and (B, M, 3) points,
// nsample >= 1. Checks what only values tell (finite coordinates) and the radii (0 <= min_radius,
// and min_radius < radius for a shell).
void ball_query_kernel(KernelContext& ctx, const TensorView& xyz, const TensorView& new_xyz, double radius,
                       int64_t nsample, double min_radius, TensorView& idx);

// pointops' offset-layout ball query (ball_query.cc says what it returns). Checks what the spec
// cannot: the optional pair given together, min_radius < max_radius, the offsets' values.
void ball_query_offset_kernel(KernelContext& ctx, const TensorView& xyz, const TensorView& offset,
                              const TensorView* new_xyz, const TensorView* new_offset, int64_t nsample,
                              double max_radius, double min_radius, TensorView& idx, TensorView& dist);

// torch_cluster's radius (ball_query.cc says what it returns). Allocates edge_index (2, pairs).
// Checks what the spec cannot: the batch vectors' values (non-negative, sorted).
void radius_kernel(KernelContext& ctx, const TensorView& x, const TensorView& y, const TensorView* batch_x,
                   const TensorView* batch_y, double r, int64_t max_num_neighbors, TensorView& edge_index);

// A batch vector's row pointers (ball_query.cc says what it returns). Checks the batch vector's
// values (non-negative, sorted) by the rule every op shares (segments.h).
void batch_pointers_kernel(KernelContext& ctx, const TensorView& batch, const TensorView& bounds,
                           const std::string& name, const std::string& caller, TensorView& ptr);

}  // namespace opbridge
