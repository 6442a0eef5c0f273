// Broadcasting element-wise loops for kernels: parallel over the output on the host's thread
// pool, a flat fast path when no input broadcasts, strided runs along the innermost axis
// otherwise.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "opbridge/kernel_context.h"

namespace opbridge {

// Calls f(i, off) for every element i of an output of `out_shape` (row-major), where off[k] is
// the element offset into ins[k] under numpy broadcasting. Inputs must be contiguous.
template <size_t N, typename F>
void broadcast_for_each(KernelContext& ctx, const Shape& out_shape, const std::array<const TensorView*, N>& ins, F&& f) {
  int64_t numel = 1;
  for (int64_t d : out_shape) numel *= d;
  if (numel == 0) return;
  constexpr int64_t kGrain = 1 << 14;

  bool flat = true;
  for (const TensorView* t : ins) flat = flat && t->shape == out_shape;
  if (flat) {
    ctx.parallel_for(numel, kGrain, [&](int64_t begin, int64_t end) {
      std::array<int64_t, N> off;
      for (int64_t i = begin; i < end; ++i) {
        off.fill(i);
        f(i, off);
      }
    });
    return;
  }

  // Broadcast strides: an input's contiguous stride, or 0 on axes it broadcasts along.
  const size_t rank = std::max<size_t>(out_shape.size(), 1);
  Shape shape = out_shape.empty() ? Shape{1} : out_shape;
  std::array<Shape, N> bstride;
  for (size_t k = 0; k < N; ++k) {
    bstride[k].assign(rank, 0);
    const Shape& s = ins[k]->shape;
    int64_t stride = 1;
    for (size_t j = 0; j < s.size(); ++j) {
      size_t in_axis = s.size() - 1 - j, out_axis = rank - 1 - j;
      bstride[k][out_axis] = s[in_axis] == 1 ? 0 : stride;
      stride *= s[in_axis];
    }
  }
  ctx.parallel_for(numel, kGrain, [&](int64_t begin, int64_t end) {
    Shape idx(rank);
    for (int64_t r = begin, d = static_cast<int64_t>(rank) - 1; d >= 0; --d) {
      idx[d] = r % shape[d];
      r /= shape[d];
    }
    const int64_t inner = shape[rank - 1];
    for (int64_t i = begin; i < end;) {
      std::array<int64_t, N> off{};
      for (size_t k = 0; k < N; ++k)
        for (size_t d = 0; d < rank; ++d) off[k] += idx[d] * bstride[k][d];
      const int64_t run = std::min(inner - idx[rank - 1], end - i);
      for (int64_t r = 0; r < run; ++r) {
        f(i + r, off);
        for (size_t k = 0; k < N; ++k) off[k] += bstride[k][rank - 1];
      }
      i += run;
      idx[rank - 1] += run;
      for (size_t d = rank - 1; d > 0 && idx[d] == shape[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
      }
    }
  });
}

}  // namespace opbridge
