// The furthest point sampling of ops/furthest_point_sampling: one greedy chain per segment of
// points, shared by the batched, offset and ratio forms of the op (furthest_point_sampling.cc).
#pragma once

#include <cstdint>
#include <vector>

#include <opbridge/kernel_context.h>

namespace opbridge::fps {

// One segment: points [begin, begin + count) of the input, `samples` picks written from output
// position `out_begin`, starting at the segment's point `start`.
struct Segment {
  int64_t begin = 0, count = 0;
  int64_t out_begin = 0, samples = 0;
  int64_t start = 0;
};

// How the originals pick among equal largest distances and which points they consider.
struct Rules {
  // 0: the lowest index (torch.argmax). Else the CUDA kernels' rule: the segment's points are
  // spread over a block of `threads` threads (point k to thread k mod threads), each thread keeps
  // its lowest index, and the block's tree reduction keeps the lower slot: the thread whose
  // bit-reversed id is smallest wins.
  int64_t threads = 0;
  // pointnet2_ops skips points with x² + y² + z² <= 1e-3 (never picked after the start point).
  bool skip_near_origin = false;
  // Squared distances are computed in float32 for float32, float16 and bfloat16 points, in
  // float64 for float64 ones; the running minimum starts at this value.
  double initial_distance = 1e10;
  // Output indices: local to the segment (the batched form) or global rows.
  bool local_indices = false;
};

// The CUDA block size for segments of at most `largest` points: the largest power of two not
// above it, at most `cap` (cap 0: no CUDA rule).
int64_t cuda_threads(int64_t largest, int64_t cap);

struct Variant;  // fps_variants.h

// Runs every segment of `points` ([rows, dims], any floating dtype, finite) and writes the picks
// into `out` (int32 or int64), each pick in `variant` (null: the widest this CPU runs).
void sample(KernelContext& ctx, const TensorView& points, const std::vector<Segment>& segments, const Rules& rules,
            TensorView& out, const Variant* variant = nullptr);

}  // namespace opbridge::fps

namespace opbridge {

// furthest_point_sampling_with_dist (fps_dist_kernel.cc): picks from a (B, N, N) distance matrix,
// mmcv's block rule for ties with up to tie_threads threads. Checks the values (finite).
void fps_with_dist_kernel(KernelContext& ctx, const TensorView& dist, int64_t npoint, int64_t tie_threads,
                          TensorView& idx);

}  // namespace opbridge
