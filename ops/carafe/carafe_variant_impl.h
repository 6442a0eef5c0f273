// carafe's row loops, included by each variant's source (carafe_variants.cc, carafe_avx2.cc,
// carafe_avx512.cc) and by the kernel (carafe_kernel.cc) and compiled with that file's flags. All
// of it has internal linkage, so no two instruction sets' builds of one function can meet at link
// time.
#pragma once

#include <algorithm>

#include "carafe_variants.h"

namespace opbridge::carafe_impl {
namespace {

// The output columns [lo, hi) whose window column kx lies inside the image.
inline int64_t columns_from(const Geometry& g, int64_t kx) { return std::clamp((g.r - kx) * g.s, int64_t{0}, g.wo); }
inline int64_t columns_to(const Geometry& g, int64_t kx) {
  return std::clamp((g.w + g.r - kx) * g.s, int64_t{0}, g.wo);
}

// acc[i + acc_shift] += a[i + a_shift] * b[i] for i in [lo, hi) (a shifted pointer is formed only
// for indices in range).
template <typename T>
inline void multiply_add(T* acc, int64_t acc_shift, const T* a, int64_t a_shift, const T* b, int64_t lo, int64_t hi) {
  if (hi <= lo) return;
  T* __restrict o = acc + lo + acc_shift;
  const T* __restrict x = a + lo + a_shift;
  const T* __restrict y = b + lo;
  for (int64_t i = 0, n = hi - lo; i < n; ++i) o[i] += x[i] * y[i];
}

// The columns where every kx is inside the image: the k terms summed in registers before out is
// stored (k known to the compiler), in the order the per-column path adds them.
template <int K, typename T>
void window_row_interior(T* out, const T* in, const T* mask, int64_t plane, int64_t s, int64_t lo, int64_t hi) {
  constexpr int R = (K - 1) / 2;
  T* __restrict o = out;
  const T* __restrict x = in;
  const T* __restrict m = mask;
  for (int64_t ox = lo; ox < hi; ++ox) {
    T sum = o[ox];
    for (int kx = 0; kx < K; ++kx) sum += x[ox + (kx - R) * s] * m[kx * plane + ox];
    o[ox] = sum;
  }
}

template <typename T>
void add_window_row(const Geometry& g, T* out, const T* in, const T* mask, int64_t plane) {
  const int64_t inner_lo = std::min(g.r * g.s, g.wo), inner_hi = std::max(inner_lo, g.wo - g.r * g.s);
  auto each_column = [&](int64_t from, int64_t to) {
    for (int64_t kx = 0; kx < g.k; ++kx)
      multiply_add(out, 0, in, (kx - g.r) * g.s, mask + kx * plane, std::max(from, columns_from(g, kx)),
                   std::min(to, columns_to(g, kx)));
  };
  each_column(0, inner_lo);
  switch (g.k) {  // CARAFE's usual window sizes; others take the per-column path
    case 1: window_row_interior<1>(out, in, mask, plane, g.s, inner_lo, inner_hi); break;
    case 3: window_row_interior<3>(out, in, mask, plane, g.s, inner_lo, inner_hi); break;
    case 5: window_row_interior<5>(out, in, mask, plane, g.s, inner_lo, inner_hi); break;
    case 7: window_row_interior<7>(out, in, mask, plane, g.s, inner_lo, inner_hi); break;
    default: each_column(inner_lo, inner_hi);
  }
  each_column(inner_hi, g.wo);
}

}  // namespace
}  // namespace opbridge::carafe_impl
