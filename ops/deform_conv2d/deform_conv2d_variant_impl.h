// The bodies of deform_conv2d's hot loops (forward and backward), compiled once per instruction set: included by exactly
// one source file per variant (deform_conv2d_variants.cc for the baseline, *_avx2.cc, *_avx512.cc),
// each built with its own flags (opbridge_add_op_library in cmake/OpBridgeFunctions.cmake). A file
// built for a wider ISA renames Eigen (#define Eigen ...) before including this, and everything
// here has internal linkage, so the linker never merges a wide-ISA copy of an inline function with
// the baseline one.
#pragma once

#include <Eigen/Core>

#include <algorithm>

#include "deform_conv2d_variants.h"

namespace opbridge::deform_conv2d_impl {
namespace {

template <typename T, bool kMasked>
void fill_columns(const ColumnJob<T>& j) {
  const int64_t kg = j.cg * j.kk, c_end = j.c_begin + j.cg;
  for (int64_t q = 0; q < j.len; ++q)
    for (int64_t k = 0; k < j.kk; ++k) {
      T* col = j.columns + q * kg + k * j.cg;
      // The group's channels may span several offset groups, each with its own sample.
      for (int64_t c0 = j.c_begin; c0 < c_end;) {
        const int64_t og = c0 / j.cog, c1 = std::min(c_end, (og + 1) * j.cog);
        const int64_t slot = (og * j.kk + k) * j.tile + q;
        const Corner<T>& s = j.corners[slot];
        const T* __restrict a = j.image + s.pixel * j.c_in + c0;  // the four neighbours: runs of channels
        const T* __restrict b = a + j.c_in;
        const T* __restrict c = a + j.padded_w * j.c_in;
        const T* __restrict d = c + j.c_in;
        T* __restrict o = col + (c0 - j.c_begin);
        const int64_t n = c1 - c0;
        const T w0 = s.w[0], w1 = s.w[1], w2 = s.w[2], w3 = s.w[3];
        if constexpr (kMasked) {
          const T m = j.mask[slot];  // applied after interpolation, as torchvision does
          for (int64_t ch = 0; ch < n; ++ch) o[ch] = m * (w0 * a[ch] + w1 * b[ch] + w2 * c[ch] + w3 * d[ch]);
        } else {
          for (int64_t ch = 0; ch < n; ++ch) o[ch] = w0 * a[ch] + w1 * b[ch] + w2 * c[ch] + w3 * d[ch];
        }
        c0 = c1;
      }
    }
}

template <typename T>
void columns(const ColumnJob<T>& j) {
  if (j.mask)
    fill_columns<T, true>(j);
  else
    fill_columns<T, false>(j);
}

template <typename T>
void gemm(const T* a, const T* b, const T* bias, T* out, int64_t m, int64_t k, int64_t n, int64_t ldo) {
  using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using ColMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
  using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;
  Eigen::Map<RowMajor, Eigen::Unaligned, Eigen::OuterStride<>> C(out, m, n, Eigen::OuterStride<>(ldo));
  Eigen::Map<const RowMajor> A(a, m, k);
  Eigen::Map<const ColMajor> B(b, k, n);
  if (bias) {
    C.colwise() = Eigen::Map<const Vector>(bias, m);
    if (k > 0) C.noalias() += A * B;
  } else if (k > 0) {
    C.noalias() = A * B;
  } else {
    C.setZero();  // an empty sum
  }
}

template <typename T>
using RowMajorMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>,
                               Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using OutMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

template <typename T>
void gemm_acc_g_cols(const T* g, int64_t ldg, const T* columns, T* acc, int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0 || k == 0) return;  // an empty sum adds nothing
  OutMap<T>(acc, m, k).noalias() +=
      RowMajorMap<T>(g, m, n, Eigen::OuterStride<>(ldg)) * RowMajorMap<T>(columns, n, k, Eigen::OuterStride<>(k));
}

template <typename T>
void gemm_gt_w(const T* g, int64_t ldg, const T* w, T* out, int64_t m, int64_t n, int64_t k) {
  OutMap<T> o(out, n, k);
  if (m == 0)
    o.setZero();  // no output channels: no gradient reaches the columns
  else
    o.noalias() = RowMajorMap<T>(g, m, n, Eigen::OuterStride<>(ldg)).transpose() *
                  RowMajorMap<T>(w, m, k, Eigen::OuterStride<>(k));
}

// d sample / d y and d sample / d x from the bilinear weights: with w = (hy·hx, hy·lx, ly·hx, ly·lx)
// for the neighbours (a, b, c, d), hx = w0 + w2, lx = w1 + w3, hy = w0 + w1, ly = w2 + w3, and
// d/dy = hx·(c - a) + lx·(d - b), d/dx = hy·(b - a) + ly·(d - c). Outside the image the weights
// are 0, and so are both derivatives, as in torchvision. Each run of channels is one Eigen
// expression per sum, so the channel loops vectorize (reductions included).
template <typename T>
void sample_grads(const SampleGradJob<T>& s) {
  using Array = Eigen::Array<T, Eigen::Dynamic, 1>;
  using In = Eigen::Map<const Array>;
  using Out = Eigen::Map<Array>;
  const ColumnJob<T>& j = s.at;
  const int64_t kg = j.cg * j.kk, c_end = j.c_begin + j.cg;
  for (int64_t q = 0; q < j.len; ++q)
    for (int64_t k = 0; k < j.kk; ++k) {
      const T* gcol = s.grad_columns + q * kg + k * j.cg;
      for (int64_t c0 = j.c_begin; c0 < c_end;) {
        const int64_t og = c0 / j.cog, c1 = std::min(c_end, (og + 1) * j.cog), n = c1 - c0;
        const int64_t slot = (og * j.kk + k) * j.tile + q;
        const Corner<T>& at = j.corners[slot];
        const T w0 = at.w[0], w1 = at.w[1], w2 = at.w[2], w3 = at.w[3];
        const T m = j.mask ? j.mask[slot] : T(1);
        const int64_t below = j.padded_w * j.c_in, offset = at.pixel * j.c_in + c0;
        const In g(gcol + (c0 - j.c_begin), n);
        const In a(j.image + offset, n), b(j.image + offset + j.c_in, n), c(j.image + offset + below, n),
            d(j.image + offset + below + j.c_in, n);
        s.grad_mask[slot] += (g * (w0 * a + w1 * b + w2 * c + w3 * d)).sum();
        s.grad_y[slot] += m * (g * ((w0 + w2) * (c - a) + (w1 + w3) * (d - b))).sum();
        s.grad_x[slot] += m * (g * ((w0 + w1) * (b - a) + (w2 + w3) * (d - c))).sum();
        T* gi = s.grad_image + offset;
        Out(gi, n) += (m * w0) * g;
        Out(gi + j.c_in, n) += (m * w1) * g;
        Out(gi + below, n) += (m * w2) * g;
        Out(gi + below + j.c_in, n) += (m * w3) * g;
        c0 = c1;
      }
    }
}

Variant this_variant(const char* isa) {
  Variant v;
  v.f32 = {&columns<float>, &gemm<float>, &gemm_acc_g_cols<float>, &gemm_gt_w<float>, &sample_grads<float>};
  v.f64 = {&columns<double>, &gemm<double>, &gemm_acc_g_cols<double>, &gemm_gt_w<double>, &sample_grads<double>};
  v.isa = isa;
  return v;
}

}  // namespace
}  // namespace opbridge::deform_conv2d_impl
