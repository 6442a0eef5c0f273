// The bodies of multi_scale_deformable_attention's loops, compiled once per instruction set:
// included by exactly one source file per variant (msda_variants.cc for the baseline and float64,
// msda_avx2.cc, msda_avx512.cc), each built with its own flags. Everything here has internal
// linkage, so the linker never merges a wide-ISA copy of a function with the baseline one; no
// std:: template is instantiated for the same reason (at -O0 those are emitted out of line).
//
// A sample at (x, y) in [0, 1]^2 of a level of h x w positions is bilinear at pixel coordinates
// (x * w - 0.5, y * h - 0.5) (grid_sample with align_corners=False), with zero outside the level:
// a corner outside it contributes nothing and gets no gradient.
#pragma once

#include <cmath>
#include <cstdint>

#include "msda_variants.h"

namespace opbridge::msda_impl {
namespace {

template <typename T>
struct Sample {
  int64_t x0, y0;       // the top-left corner, in pixels of the level
  int64_t position;     // its position along S (the other corners: + 1, + w, + w + 1)
  T lx, ly, hx, hy;
  T weight[4];          // bilinear weights of (y0, x0), (y0, x0 + 1), (y0 + 1, x0), (y0 + 1, x0 + 1)
  bool interior;        // all four corners inside the level (the common case)
};

// The sample at pixel coordinates (x, y) in a level of h x w positions starting at `start`; false
// when it lies wholly outside (x <= -1 or >= w, alike for y, or NaN): nothing is sampled.
template <typename T>
inline bool sample_at_pixel(T x, T y, int64_t h, int64_t w, int64_t start, Sample<T>& s) {
  if (!(x > T(-1) && y > T(-1) && x < static_cast<T>(w) && y < static_cast<T>(h))) return false;
  // floor() by truncation (x, y > -1 here): a libm call on the baseline ISA otherwise.
  s.x0 = static_cast<int64_t>(x), s.y0 = static_cast<int64_t>(y);
  s.x0 -= static_cast<T>(s.x0) > x;
  s.y0 -= static_cast<T>(s.y0) > y;
  s.lx = x - static_cast<T>(s.x0), s.ly = y - static_cast<T>(s.y0);
  s.hx = T(1) - s.lx, s.hy = T(1) - s.ly;
  s.weight[0] = s.hy * s.hx, s.weight[1] = s.hy * s.lx, s.weight[2] = s.ly * s.hx, s.weight[3] = s.ly * s.lx;
  s.position = start + s.y0 * w + s.x0;
  // 0 <= x0 < w - 1 and 0 <= y0 < h - 1, as unsigned comparisons (w, h >= 1 here).
  s.interior = static_cast<uint64_t>(s.x0) < static_cast<uint64_t>(w - 1) &&
               static_cast<uint64_t>(s.y0) < static_cast<uint64_t>(h - 1);
  return true;
}

// The sample at normalised (x, y): pixel coordinates x * w - 0.5 and y * h - 0.5 (the forward's).
template <typename T>
inline bool sample_at(T x_norm, T y_norm, int64_t h, int64_t w, int64_t start, Sample<T>& s) {
  return sample_at_pixel(x_norm * static_cast<T>(w) - T(0.5), y_norm * static_cast<T>(h) - T(0.5), h, w, start, s);
}

// A normalised coordinate in pixels of an axis of `size` positions as grid_sample (align_corners=
// False) computes it from the grid 2 * norm - 1: fma(grid + 1, size / 2, -0.5), rounded once. The
// value is x * w - 0.5 either way, but its rounding decides floor() where it falls within an ulp of
// a whole pixel (a pixel centre such as 1.5 / 5), and with it the side the location gradient is
// taken from: the backward follows grid_sample's, the forward (continuous there) keeps its own.
// float: the double product of two floats is exact, and so is the subtraction where the result is
// near a whole number, so one rounding to float gives the fused result on every instruction set.
inline float grid_pixel(float norm, int64_t size) {
  const float g1 = (2.0f * norm - 1.0f) + 1.0f, half = static_cast<float>(size) / 2;
  return static_cast<float>(static_cast<double>(g1) * static_cast<double>(half) - 0.5);
}
inline double grid_pixel(double norm, int64_t size) {
  const double g1 = (2.0 * norm - 1.0) + 1.0, half = static_cast<double>(size) / 2;
  return std::fma(g1, half, -0.5);
}

// Corner c (0..3, as Sample::weight) of a sample: whether it lies inside the level, and its position.
template <typename T>
inline bool corner_inside(const Sample<T>& s, int c, int64_t h, int64_t w) {
  const int64_t yy = s.y0 + (c >> 1), xx = s.x0 + (c & 1);
  return yy >= 0 && yy < h && xx >= 0 && xx < w;
}
template <typename T>
inline int64_t corner_position(const Sample<T>& s, int c, int64_t w) {
  return s.position + (c >> 1) * w + (c & 1);
}

// Calls f(corner, its bilinear weight, its position along S) for each corner of the sample inside
// its level.
template <typename T, typename F>
inline void each_corner(const Sample<T>& s, int64_t h, int64_t w, F&& f) {
  if (s.interior) {
    f(0, s.weight[0], s.position), f(1, s.weight[1], s.position + 1), f(2, s.weight[2], s.position + w),
        f(3, s.weight[3], s.position + w + 1);
    return;
  }
  for (int c = 0; c < 4; ++c)
    if (corner_inside(s, c, h, w)) f(c, s.weight[c], corner_position(s, c, w));
}

// acc[0, d) += c * v[0, d), for the run-time channel count d.
template <typename T>
inline void axpy(T* acc, T c, const T* v, int64_t d) {
  for (int64_t i = 0; i < d; ++i) acc[i] += c * v[i];
}

template <typename T>
inline T dot(const T* a, const T* b, int64_t d) {
  T sum = T(0);
  for (int64_t i = 0; i < d; ++i) sum += a[i] * b[i];
  return sum;
}

// A row of kD channels held in vector registers (GCC/Clang vector extensions, as wide as the ISA
// this file is built for), so a query's accumulator stays in registers across its samples
// instead of going through memory at every corner.
#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#elif defined(__AVX2__)
constexpr int kVectorBytes = 32;
#else
constexpr int kVectorBytes = 16;
#endif

template <typename T, int kD>
struct Row {
  typedef T Vec __attribute__((vector_size(kVectorBytes)));
  static constexpr int kLanes = kVectorBytes / sizeof(T), kVecs = kD / kLanes;
  static_assert(kD % kLanes == 0, "a fixed channel count fills whole vectors");
  Vec v[kVecs];

  static Vec load(const T* p) {
    Vec x;
    __builtin_memcpy(&x, p, sizeof(x));  // an unaligned load
    return x;
  }
  void zero() {
    for (int j = 0; j < kVecs; ++j) v[j] = Vec{} ;
  }
  void add(T c, const T* p) {
    for (int j = 0; j < kVecs; ++j) v[j] += c * load(p + j * kLanes);
  }
  void store(T* p) const { __builtin_memcpy(p, v, sizeof(v)); }
  void load_from(const T* p) { __builtin_memcpy(v, p, sizeof(v)); }
  // The sum over channels of this row times `other`.
  T dot(const Row& other) const {
    Vec t = v[0] * other.v[0];
    for (int j = 1; j < kVecs; ++j) t += v[j] * other.v[j];
    T sum = T(0);
    for (int i = 0; i < kLanes; ++i) sum += t[i];
    return sum;
  }
};

template <int kD, typename T>
void forward_rows_d(const Geometry& g, const T* value, const T* locations, const T* weights, int64_t b,
                    int64_t q_begin, int64_t q_end, T* output) {
  const int64_t d = kD > 0 ? kD : g.channels, row_stride = g.heads * d, lp = g.levels * g.points;
  const T* value_b = value + b * g.spatial * row_stride;
  // Query by query, every head: a query's heads sample around the same point, in the same rows of
  // value (measured faster than head by head over the range, for all the neighbouring queries).
  for (int64_t q = q_begin; q < q_end; ++q) {
    for (int64_t h = 0; h < g.heads; ++h) {
      const int64_t slot = (b * g.queries + q) * g.heads + h;  // (b, q, h)
      T* out = output + slot * d;
      const T* loc = locations + slot * lp * 2;
      const T* wt = weights + slot * lp;
      const T* value_bh = value_b + h * d;
      auto each_sample = [&](auto&& add) {  // add(weight, value row) for every corner sampled
        for (int64_t l = 0; l < g.levels; ++l)
          for (int64_t p = 0; p < g.points; ++p) {
            const int64_t k = l * g.points + p, lh = g.level_h[l], lw = g.level_w[l];
            Sample<T> s;
            if (!sample_at(loc[2 * k], loc[2 * k + 1], lh, lw, g.level_start[l], s)) continue;
            each_corner(s, lh, lw, [&](int, T c, int64_t pos) { add(wt[k] * c, value_bh + pos * row_stride); });
          }
      };
      if constexpr (kD > 0) {
        Row<T, kD> acc;
        acc.zero();
        each_sample([&](T c, const T* v) { acc.add(c, v); });
        acc.store(out);
      } else {
        for (int64_t i = 0; i < d; ++i) out[i] = T(0);
        each_sample([&](T c, const T* v) { axpy(out, c, v, d); });
      }
    }
  }
}

template <int kD, typename T>
void backward_heads_d(const Geometry& g, const T* grad_output, const T* value, const T* locations,
                      const T* weights, int64_t b, int64_t h_begin, int64_t h_end, T* grad_value, T* grad_locations,
                      T* grad_weights) {
  const int64_t d = kD > 0 ? kD : g.channels, row_stride = g.heads * d, lp = g.levels * g.points;
  // Query by query, as the forward; each head's slice of grad_value gathers its sums in query order
  // whichever heads share the task.
  for (int64_t q = 0; q < g.queries; ++q) {
    for (int64_t h = h_begin; h < h_end; ++h) {
      const T* value_bh = value + b * g.spatial * row_stride + h * d;
      T* grad_value_bh = grad_value + b * g.spatial * row_stride + h * d;
      const int64_t slot = (b * g.queries + q) * g.heads + h;
      const T* go = grad_output + slot * d;
      const T* loc = locations + slot * lp * 2;
      const T* wt = weights + slot * lp;
      T* gl = grad_locations + slot * lp * 2;
      T* gw = grad_weights + slot * lp;
      using GoRow = Row<T, (kD > 0 ? kD : static_cast<int>(kVectorBytes / sizeof(T)))>;  // kD = 0: unused
      [[maybe_unused]] GoRow go_row;
      if constexpr (kD > 0) go_row.load_from(go);
      for (int64_t l = 0; l < g.levels; ++l)
        for (int64_t p = 0; p < g.points; ++p) {
          const int64_t k = l * g.points + p, lh = g.level_h[l], lw = g.level_w[l];
          gl[2 * k] = gl[2 * k + 1] = gw[k] = T(0);
          Sample<T> s;
          if (!sample_at_pixel(grid_pixel(loc[2 * k], lw), grid_pixel(loc[2 * k + 1], lh), lh, lw, g.level_start[l], s))
            continue;
          // grad_output . (the sample, its derivatives in pixel x and y). The bilinear weights'
          // derivatives in x are -hy, hy, -ly, ly for the four corners, in y -hx, -lx, hx, lx.
          const T dx_of[4] = {-s.hy, s.hy, -s.ly, s.ly}, dy_of[4] = {-s.hx, -s.lx, s.hx, s.lx};
          T dot_w = T(0), dot_x = T(0), dot_y = T(0);
          if constexpr (kD > 0) {
            // The three combinations of the corners summed as vectors: three horizontal sums per sample.
            Row<T, kD> sum_w, sum_x, sum_y;
            sum_w.zero(), sum_x.zero(), sum_y.zero();
            each_corner(s, lh, lw, [&](int c, T cw, int64_t pos) {
              const T* v = value_bh + pos * row_stride;
              for (int j = 0; j < Row<T, kD>::kVecs; ++j) {
                const auto x = Row<T, kD>::load(v + j * Row<T, kD>::kLanes);
                sum_w.v[j] += cw * x, sum_x.v[j] += dx_of[c] * x, sum_y.v[j] += dy_of[c] * x;
              }
              Row<T, kD> gv;
              T* dst = grad_value_bh + pos * row_stride;
              gv.load_from(dst);
              gv.add(wt[k] * cw, go);
              gv.store(dst);
            });
            dot_w = sum_w.dot(go_row), dot_x = sum_x.dot(go_row), dot_y = sum_y.dot(go_row);
          } else {
            each_corner(s, lh, lw, [&](int c, T cw, int64_t pos) {
              const T gv = dot(go, value_bh + pos * row_stride, d);
              dot_w += cw * gv, dot_x += dx_of[c] * gv, dot_y += dy_of[c] * gv;
              axpy(grad_value_bh + pos * row_stride, wt[k] * cw, go, d);
            });
          }
          gw[k] = dot_w;
          gl[2 * k] = wt[k] * static_cast<T>(lw) * dot_x;  // x = x_norm * w - 0.5
          gl[2 * k + 1] = wt[k] * static_cast<T>(lh) * dot_y;
        }
    }
  }
}

template <int kD>
struct Channels {
  static constexpr int value = kD;
};

// The channel counts of the models in use get loops of fixed length (Deformable DETR, DINO and
// Mask2Former: 256 channels over 8 heads, 32 each).
template <typename T>
void forward_rows_any(const Geometry& g, const T* value, const T* locations, const T* weights, int64_t b,
                      int64_t q_begin, int64_t q_end, T* output) {
  switch (g.channels) {
    case 16: return forward_rows_d<16>(g, value, locations, weights, b, q_begin, q_end, output);
    case 32: return forward_rows_d<32>(g, value, locations, weights, b, q_begin, q_end, output);
    case 64: return forward_rows_d<64>(g, value, locations, weights, b, q_begin, q_end, output);
    default: return forward_rows_d<0>(g, value, locations, weights, b, q_begin, q_end, output);
  }
}

template <typename T>
void backward_heads_any(const Geometry& g, const T* grad_output, const T* value, const T* locations, const T* weights,
                        int64_t b, int64_t h_begin, int64_t h_end, T* grad_value, T* grad_locations, T* grad_weights) {
  auto run = [&](auto d) {
    backward_heads_d<decltype(d)::value>(g, grad_output, value, locations, weights, b, h_begin, h_end, grad_value,
                                         grad_locations, grad_weights);
  };
  switch (g.channels) {
    case 16: return run(Channels<16>{});
    case 32: return run(Channels<32>{});
    case 64: return run(Channels<64>{});
    default: return run(Channels<0>{});
  }
}

Variant this_variant(const char* isa) { return Variant{forward_rows_any<float>, backward_heads_any<float>, isa}; }

}  // namespace
}  // namespace opbridge::msda_impl
