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

#include <cstdint>

#include "msda_variants.h"

namespace opbridge::msda_impl {
namespace {

template <typename T>
struct Sample {
  const T* corner[4];  // value rows of (y0, x0), (y0, x0 + 1), (y0 + 1, x0), (y0 + 1, x0 + 1); null: outside
  int64_t position[4];  // their positions along S
  T weight[4];         // bilinear weights hy*hx, hy*lx, ly*hx, ly*lx
  T lx, ly, hx, hy;
};

// The corners of the sample at normalised (x, y) in a level; false when it lies wholly outside
// (then nothing is sampled: x * w - 0.5 <= -1 or >= w, alike for y, or NaN).
template <typename T>
inline bool sample_at(T x_norm, T y_norm, int64_t h, int64_t w, int64_t start, const T* value, int64_t row_stride,
                      Sample<T>& s) {
  const T x = x_norm * static_cast<T>(w) - T(0.5), y = y_norm * static_cast<T>(h) - T(0.5);
  if (!(x > T(-1) && y > T(-1) && x < static_cast<T>(w) && y < static_cast<T>(h))) return false;
  // floor() by truncation (x, y > -1 here): a libm call on the baseline ISA otherwise.
  int64_t x0 = static_cast<int64_t>(x), y0 = static_cast<int64_t>(y);
  x0 -= static_cast<T>(x0) > x;
  y0 -= static_cast<T>(y0) > y;
  s.lx = x - static_cast<T>(x0), s.ly = y - static_cast<T>(y0);
  s.hx = T(1) - s.lx, s.hy = T(1) - s.ly;
  s.weight[0] = s.hy * s.hx, s.weight[1] = s.hy * s.lx, s.weight[2] = s.ly * s.hx, s.weight[3] = s.ly * s.lx;
  for (int k = 0; k < 4; ++k) {
    const int64_t yy = y0 + (k >> 1), xx = x0 + (k & 1);
    const bool inside = yy >= 0 && yy < h && xx >= 0 && xx < w;
    s.position[k] = start + yy * w + xx;
    s.corner[k] = inside ? value + s.position[k] * row_stride : nullptr;
  }
  return true;
}

// acc[0, n) += c * v[0, n): n a compile-time constant (kD > 0), so the accumulator stays in
// registers, or the run-time d (kD = 0).
template <int kD, typename T>
inline void axpy(T* acc, T c, const T* v, int64_t d) {
  const int64_t n = kD > 0 ? kD : d;
  for (int64_t i = 0; i < n; ++i) acc[i] += c * v[i];
}

template <int kD, typename T>
inline T dot(const T* a, const T* b, int64_t d) {
  const int64_t n = kD > 0 ? kD : d;
  T sum = T(0);
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

template <int kD, typename T>
void forward_rows_d(const Geometry& g, const T* value, const T* locations, const T* weights, int64_t b,
                    int64_t q_begin, int64_t q_end, T* output) {
  const int64_t d = kD > 0 ? kD : g.channels, row_stride = g.heads * d, lp = g.levels * g.points;
  T local[kD > 0 ? kD : 1];
  const T* value_b = value + b * g.spatial * row_stride;
  for (int64_t q = q_begin; q < q_end; ++q) {
    for (int64_t h = 0; h < g.heads; ++h) {
      const int64_t slot = (b * g.queries + q) * g.heads + h;  // (b, q, h)
      T* out = output + slot * d;
      T* acc = kD > 0 ? local : out;
      for (int64_t i = 0; i < d; ++i) acc[i] = T(0);
      const T* loc = locations + slot * lp * 2;
      const T* wt = weights + slot * lp;
      for (int64_t l = 0; l < g.levels; ++l)
        for (int64_t p = 0; p < g.points; ++p) {
          const int64_t k = l * g.points + p;
          Sample<T> s;
          if (!sample_at(loc[2 * k], loc[2 * k + 1], g.level_h[l], g.level_w[l], g.level_start[l], value_b + h * d,
                         row_stride, s))
            continue;
          for (int c = 0; c < 4; ++c)
            if (s.corner[c]) axpy<kD>(acc, wt[k] * s.weight[c], s.corner[c], d);
        }
      if (kD > 0)
        for (int64_t i = 0; i < d; ++i) out[i] = acc[i];
    }
  }
}

template <int kD, typename T>
void backward_head_d(const Geometry& g, const T* grad_output, const T* value, const T* locations, const T* weights,
                     int64_t b, int64_t h, T* grad_value, T* grad_locations, T* grad_weights) {
  const int64_t d = kD > 0 ? kD : g.channels, row_stride = g.heads * d, lp = g.levels * g.points;
  const T* value_bh = value + b * g.spatial * row_stride + h * d;
  T* grad_value_bh = grad_value + b * g.spatial * row_stride + h * d;
  for (int64_t q = 0; q < g.queries; ++q) {
    const int64_t slot = (b * g.queries + q) * g.heads + h;
    const T* go = grad_output + slot * d;
    const T* loc = locations + slot * lp * 2;
    const T* wt = weights + slot * lp;
    T* gl = grad_locations + slot * lp * 2;
    T* gw = grad_weights + slot * lp;
    for (int64_t l = 0; l < g.levels; ++l)
      for (int64_t p = 0; p < g.points; ++p) {
        const int64_t k = l * g.points + p;
        gl[2 * k] = gl[2 * k + 1] = gw[k] = T(0);
        Sample<T> s;
        if (!sample_at(loc[2 * k], loc[2 * k + 1], g.level_h[l], g.level_w[l], g.level_start[l], value_bh, row_stride,
                       s))
          continue;
        T gv[4];  // grad_output . corner value
        for (int c = 0; c < 4; ++c) {
          gv[c] = s.corner[c] ? dot<kD>(go, s.corner[c], d) : T(0);
          if (s.corner[c]) axpy<kD>(grad_value_bh + s.position[c] * row_stride, wt[k] * s.weight[c], go, d);
        }
        gw[k] = ((s.weight[0] * gv[0] + s.weight[1] * gv[1]) + s.weight[2] * gv[2]) + s.weight[3] * gv[3];
        // d sample / d x = hy (v01 - v00) + ly (v11 - v10), and x = x_norm * w - 0.5.
        const T dx = s.hy * (gv[1] - gv[0]) + s.ly * (gv[3] - gv[2]);
        const T dy = s.hx * (gv[2] - gv[0]) + s.lx * (gv[3] - gv[1]);
        gl[2 * k] = wt[k] * static_cast<T>(g.level_w[l]) * dx;
        gl[2 * k + 1] = wt[k] * static_cast<T>(g.level_h[l]) * dy;
      }
  }
}

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
void backward_head_any(const Geometry& g, const T* grad_output, const T* value, const T* locations, const T* weights,
                       int64_t b, int64_t h, T* grad_value, T* grad_locations, T* grad_weights) {
  switch (g.channels) {
    case 16: return backward_head_d<16>(g, grad_output, value, locations, weights, b, h, grad_value, grad_locations, grad_weights);
    case 32: return backward_head_d<32>(g, grad_output, value, locations, weights, b, h, grad_value, grad_locations, grad_weights);
    case 64: return backward_head_d<64>(g, grad_output, value, locations, weights, b, h, grad_value, grad_locations, grad_weights);
    default: return backward_head_d<0>(g, grad_output, value, locations, weights, b, h, grad_value, grad_locations, grad_weights);
  }
}

Variant this_variant(const char* isa) { return Variant{forward_rows_any<float>, backward_head_any<float>, isa}; }

}  // namespace
}  // namespace opbridge::msda_impl
