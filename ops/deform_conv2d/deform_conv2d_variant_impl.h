// The bodies of deform_conv2d's hot loops (forward and backward), compiled once per instruction set: included by exactly
// one source file per variant (deform_conv2d_variants.cc for the baseline, *_avx2.cc, *_avx512.cc),
// each built with its own flags (opbridge_add_op_library in cmake/OpBridgeFunctions.cmake). A file
// built for a wider ISA renames Eigen (#define Eigen ...) before including this, and everything
// here has internal linkage, so the linker never merges a wide-ISA copy of an inline function with
// the baseline one.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include "deform_conv2d_variants.h"

namespace opbridge::deform_conv2d_impl {
namespace {

// std::min, std::isnan and the like are inline functions with external linkage: a build that does
// not inline them (-O0) emits them out of line, and the linker could keep this file's wide-ISA
// copies for the baseline code as well. These have internal linkage.
inline int64_t lesser(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t greater(int64_t a, int64_t b) { return a < b ? b : a; }
template <typename T>
inline bool is_nan(T x) { return x != x; }

// The bilinear sample at (y, x) of an h × w image whose zero-bordered copy is padded_w wide.
template <typename T>
Corner<T> corner(T y, T x, int64_t h, int64_t w, int64_t padded_w) {
  if (y > -1 && y < static_cast<T>(h) && x > -1 && x < static_cast<T>(w)) {
    // floor() by truncation (y, x > -1 here): a libm call on the baseline ISA otherwise.
    int64_t y0 = static_cast<int64_t>(y), x0 = static_cast<int64_t>(x);
    y0 -= static_cast<T>(y0) > y;
    x0 -= static_cast<T>(x0) > x;
    const T ly = y - static_cast<T>(y0), lx = x - static_cast<T>(x0), hy = 1 - ly, hx = 1 - lx;
    const int64_t pixel = (y0 + 1) * padded_w + x0 + 1;
    return {pixel, {hy * hx, hy * lx, ly * hx, ly * lx}};
  }
  // Outside the image the sample is 0: zero weights on the zero border. A NaN position gives NaN
  // weights, so a NaN offset shows in the output instead of being read as "outside".
  static constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();
  const T z = (is_nan(y) || is_nan(x)) ? kNaN : T(0);
  return {0, {z, z, z, z}};
}

template <typename T>
void corners(const CornerRow<T>& r) {
  for (int64_t q = 0; q < r.len; ++q) r.out[q] = corner(r.at_y[q] + r.dy[q], r.at_x[q] + r.dx[q], r.h, r.w, r.padded_w);
}

// One row of the image to channels-last: dst[x·c_in + c] = src[c·plane + x].
template <typename T>
void channels_last(const T* src, int64_t plane, int64_t c_in, int64_t w, T* dst) {
  for (int64_t c = 0; c < c_in; ++c)
    for (int64_t x = 0; x < w; ++x) dst[x * c_in + c] = src[c * plane + x];
}

template <typename T, bool kMasked>
void fill_columns(const ColumnJob<T>& j) {
  const int64_t kg = j.cg * j.kk, c_end = j.c_begin + j.cg, og_begin = j.c_begin / j.cog;
  for (int64_t q = 0; q < j.len; ++q)
    for (int64_t k = 0; k < j.kk; ++k) {
      T* col = j.columns + q * kg + k * j.cg;
      // The group's channels may span several offset groups, each with its own sample.
      for (int64_t c0 = j.c_begin, og = og_begin; c0 < c_end; ++og) {
        const int64_t c1 = lesser(c_end, (og + 1) * j.cog);
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

// The forward GEMM with Eigen (double, and float on the baseline ISA): its weight is a itself.
template <typename T>
int64_t eigen_weight_size(int64_t m, int64_t k) {
  return m * k;
}

template <typename T>
void eigen_pack_weight(const T* a, int64_t m, int64_t k, T* packed) {
  for (int64_t i = 0; i < m * k; ++i) packed[i] = a[i];  // a loop: no std:: template instantiated here
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

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// float32 on the wide ISAs: the forward GEMM, the fill, the corners and the channels-last copy in
// explicit vectors (Wide below: AVX-512 or AVX2, whichever this file is built for).
//
// The forward GEMM, in place of Eigen's (measured for 64 x 576 x 211,
// one tile of the 64 -> 64 3x3 case: Eigen 92 GFLOP/s, this ~110, the core's peak ~114). Eigen
// packs the weight and the columns again for every tile; here the weight is packed once per call
// and the columns are read where the fill wrote them. Output channels are the vector lanes: a
// micro-tile keeps V vectors of output channels for P pixels in kAccumulators registers, and per
// step of the depth loads the V weight vectors once and broadcasts one column value per pixel.
// The sums are pixel-major, the output channel-major: they go through a pixel-major buffer and
// leave in kWidth x kWidth blocks transposed in registers (written straight to the output, rows
// 16 KiB apart fight over the same L1 sets: 10% of the GEMM's time).
#if defined(__AVX512F__)
struct Wide {
  using Reg = __m512;
  static constexpr int kWidth = 16, kMaxV = 4, kAccumulators = 24;  // of 32 registers
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static Reg splat(float x) { return _mm512_set1_ps(x); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, Reg r) { _mm512_storeu_ps(p, r); }
  // r[i][j] becomes r[j][i]. Per 128-bit lane, unpack + shuffle transpose 4x4 blocks: u[g][c]'s
  // lane L holds rows 4g..4g+3 of column 4L + c; then the lanes of u[0..3][c] are transposed.
  static void transpose(Reg r[kWidth]) {
    Reg u[4][4];
    for (int g = 0; g < 4; ++g) {
      const Reg* x = r + 4 * g;
      const Reg lo01 = _mm512_unpacklo_ps(x[0], x[1]), hi01 = _mm512_unpackhi_ps(x[0], x[1]);
      const Reg lo23 = _mm512_unpacklo_ps(x[2], x[3]), hi23 = _mm512_unpackhi_ps(x[2], x[3]);
      u[g][0] = _mm512_shuffle_ps(lo01, lo23, 0x44);
      u[g][1] = _mm512_shuffle_ps(lo01, lo23, 0xEE);
      u[g][2] = _mm512_shuffle_ps(hi01, hi23, 0x44);
      u[g][3] = _mm512_shuffle_ps(hi01, hi23, 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
      const Reg x0 = _mm512_shuffle_f32x4(u[0][c], u[1][c], 0x44), x1 = _mm512_shuffle_f32x4(u[0][c], u[1][c], 0xEE);
      const Reg y0 = _mm512_shuffle_f32x4(u[2][c], u[3][c], 0x44), y1 = _mm512_shuffle_f32x4(u[2][c], u[3][c], 0xEE);
      r[c] = _mm512_shuffle_f32x4(x0, y0, 0x88);
      r[4 + c] = _mm512_shuffle_f32x4(x0, y0, 0xDD);
      r[8 + c] = _mm512_shuffle_f32x4(x1, y1, 0x88);
      r[12 + c] = _mm512_shuffle_f32x4(x1, y1, 0xDD);
    }
  }
};
#else
struct Wide {
  using Reg = __m256;
  static constexpr int kWidth = 8, kMaxV = 2, kAccumulators = 12;  // of 16 registers
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static Reg splat(float x) { return _mm256_set1_ps(x); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static void store(float* p, Reg r) { _mm256_storeu_ps(p, r); }
  // As the AVX-512 one, with two 128-bit lanes.
  static void transpose(Reg r[kWidth]) {
    Reg u[2][4];
    for (int g = 0; g < 2; ++g) {
      const Reg* x = r + 4 * g;
      const Reg lo01 = _mm256_unpacklo_ps(x[0], x[1]), hi01 = _mm256_unpackhi_ps(x[0], x[1]);
      const Reg lo23 = _mm256_unpacklo_ps(x[2], x[3]), hi23 = _mm256_unpackhi_ps(x[2], x[3]);
      u[g][0] = _mm256_shuffle_ps(lo01, lo23, 0x44);
      u[g][1] = _mm256_shuffle_ps(lo01, lo23, 0xEE);
      u[g][2] = _mm256_shuffle_ps(hi01, hi23, 0x44);
      u[g][3] = _mm256_shuffle_ps(hi01, hi23, 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
      r[c] = _mm256_permute2f128_ps(u[0][c], u[1][c], 0x20);
      r[4 + c] = _mm256_permute2f128_ps(u[0][c], u[1][c], 0x31);
    }
  }
};
#endif

// Float scratch with internal linkage, in place of std::vector (see lesser() above).
struct FloatBuffer {
  enum Fill { kZeroed, kUninitialised };
  FloatBuffer(int64_t n, Fill fill)
      : data(fill == kZeroed ? new float[static_cast<size_t>(n)]() : new float[static_cast<size_t>(n)]) {}
  ~FloatBuffer() { delete[] data; }
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;
  float* data;
};

// n uninitialised values of T, 64-byte aligned (new[] aligns to 16).
template <typename T>
struct Aligned {
  explicit Aligned(int64_t n)
      : raw(new T[static_cast<size_t>(n) + 64 / sizeof(T)]),
        data(raw + ((0 - reinterpret_cast<uintptr_t>(raw)) & 63) / sizeof(T)) {}
  ~Aligned() { delete[] raw; }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  T* raw;
  T* data;
};

// The weight in panels of kMaxV vectors of output channels (the last panel as many vectors as its
// channels need, zero-padded), each panel depth-major: panel i0 at i0·k, step q of its depth at
// q·(its width).
int64_t wide_weight_size(int64_t m, int64_t k) {
  return (m + Wide::kWidth - 1) / Wide::kWidth * Wide::kWidth * k;
}

void wide_pack_weight(const float* a, int64_t m, int64_t k, float* packed) {
  for (int64_t i0 = 0; i0 < m; i0 += Wide::kWidth * Wide::kMaxV) {
    const int64_t rows = lesser(Wide::kWidth * Wide::kMaxV, m - i0);
    const int64_t width = (rows + Wide::kWidth - 1) / Wide::kWidth * Wide::kWidth;
    float* panel = packed + i0 * k;
    for (int64_t i = 0; i < width; ++i)
      for (int64_t q = 0; q < k; ++q) panel[q * width + i] = i < rows ? a[(i0 + i) * k + q] : 0.0f;
  }
}

// P pixels (columns b + p·ldb) times one panel of V vectors of output channels, into sums (pixel
// p's V·kWidth sums at sums + p·V·kWidth).
template <int V, int P>
void micro_tile(const float* __restrict w, const float* __restrict b, int64_t ldb, int64_t k, float* __restrict sums) {
  typename Wide::Reg acc[P][V];
#pragma GCC unroll 32
  for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[p][v] = Wide::zero();
  for (int64_t q = 0; q < k; ++q) {
    typename Wide::Reg wv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) wv[v] = Wide::load(w + (q * V + v) * Wide::kWidth);
#pragma GCC unroll 32
    for (int p = 0; p < P; ++p) {
      const typename Wide::Reg x = Wide::splat(b[p * ldb + q]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[p][v] = Wide::fmadd(wv[v], x, acc[p][v]);
    }
  }
#pragma GCC unroll 32
  for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) Wide::store(sums + (p * V + v) * Wide::kWidth, acc[p][v]);
}

// out (rows × n, rows `ldo` apart) = the transpose of sums (n × rows, rows `lds` apart) + bias.
void store_transposed(const float* sums, int64_t lds, const float* bias, float* out, int64_t rows, int64_t n,
                      int64_t ldo) {
  constexpr int W = Wide::kWidth;
  for (int64_t i0 = 0; i0 < rows; i0 += W)
    for (int64_t j0 = 0; j0 < n; j0 += W) {
      if (i0 + W <= rows && j0 + W <= n) {
        typename Wide::Reg r[W];
        for (int t = 0; t < W; ++t) r[t] = Wide::load(sums + (j0 + t) * lds + i0);
        Wide::transpose(r);
        for (int t = 0; t < W; ++t)
          Wide::store(out + (i0 + t) * ldo + j0, bias ? Wide::add(r[t], Wide::splat(bias[i0 + t])) : r[t]);
        continue;
      }
      for (int64_t i = i0; i < lesser(rows, i0 + W); ++i)  // a partial block
        for (int64_t j = j0; j < lesser(n, j0 + W); ++j)
          out[i * ldo + j] = bias ? sums[j * lds + i] + bias[i] : sums[j * lds + i];
    }
}

// One vector of bilinear samples: the four neighbours' channels from p, p + c_in (right), p + below
// and p + below + c_in, with weights w (the mask folded in). Two independent products-plus-one
// added at the end: a chain of three dependent operations instead of five (with runs of one
// vector, offset_groups 4 of 64 channels, the fill took 8% less time).
inline Wide::Reg bilinear(const Wide::Reg w[4], const float* p, int64_t c_in, int64_t below) {
  const Wide::Reg top = Wide::fmadd(w[1], Wide::load(p + c_in), Wide::mul(w[0], Wide::load(p)));
  const Wide::Reg bottom = Wide::fmadd(w[3], Wide::load(p + below + c_in), Wide::mul(w[2], Wide::load(p + below)));
  return Wide::add(top, bottom);
}

// The weights of one sample as vectors, the mask folded in.
template <bool kMasked>
inline void sample_weights(const ColumnJob<float>& j, int64_t slot, Wide::Reg w[4]) {
  const Corner<float>& s = j.corners[slot];
  const float m = kMasked ? j.mask[slot] : 1.0f;
  for (int i = 0; i < 4; ++i) w[i] = Wide::splat(m * s.w[i]);
}

// columns() for float with explicit vectors: the compiler's own vectorisation of fill_columns()
// checks aliasing and sets up a remainder loop for every run of channels, which for runs of 16
// (offset_groups 4 of 64 channels) cost as much as the arithmetic.
template <bool kMasked>
void wide_fill_columns(const ColumnJob<float>& j) {
  constexpr int W = Wide::kWidth;
  const int64_t kg = j.cg * j.kk, c_end = j.c_begin + j.cg, og_begin = j.c_begin / j.cog, below = j.padded_w * j.c_in;
  for (int64_t q = 0; q < j.len; ++q)
    for (int64_t k = 0; k < j.kk; ++k) {
      float* col = j.columns + q * kg + k * j.cg;
      for (int64_t c0 = j.c_begin, og = og_begin; c0 < c_end; ++og) {
        const int64_t c1 = lesser(c_end, (og + 1) * j.cog), n = c1 - c0;
        const int64_t slot = (og * j.kk + k) * j.tile + q;
        const Corner<float>& s = j.corners[slot];
        const float* a = j.image + s.pixel * j.c_in + c0;
        const float* c = a + below;
        float* o = col + (c0 - j.c_begin);
        Wide::Reg w[4];
        sample_weights<kMasked>(j, slot, w);
        int64_t ch = 0;
        for (; ch + W <= n; ch += W) Wide::store(o + ch, bilinear(w, a + ch, j.c_in, below));
        const float m = kMasked ? j.mask[slot] : 1.0f;
        const float m0 = m * s.w[0], m1 = m * s.w[1], m2 = m * s.w[2], m3 = m * s.w[3];
        for (; ch < n; ++ch) o[ch] = (m0 * a[ch] + m1 * a[ch + j.c_in]) + (m2 * c[ch] + m3 * c[ch + j.c_in]);
        c0 = c1;
      }
    }
}

// wide_fill_columns() where every run of channels is NV whole vectors (the group starts at an
// offset group's first channel and holds whole offset groups of NV·kWidth channels): the runs'
// loops unrolled and few values live across the loops (the general loop keeps its pointers in
// vector registers and on the stack).
template <bool kMasked, int NV>
void wide_fill_runs(const ColumnJob<float>& j) {
  constexpr int W = Wide::kWidth;
  const int64_t kg = j.cg * j.kk, runs = j.cg / j.cog, og_begin = j.c_begin / j.cog;
  const int64_t c_in = j.c_in, below = j.padded_w * j.c_in, og_stride = j.kk * j.tile;
  const float* image = j.image + j.c_begin;
  for (int64_t q = 0; q < j.len; ++q)
    for (int64_t k = 0; k < j.kk; ++k) {
      float* o = j.columns + q * kg + k * j.cg;
      const int64_t slot0 = (og_begin * j.kk + k) * j.tile + q;
      for (int64_t r = 0; r < runs; ++r, o += NV * W) {
        const int64_t slot = slot0 + r * og_stride;
        const float* a = image + j.corners[slot].pixel * c_in + r * (NV * W);
        Wide::Reg w[4];
        sample_weights<kMasked>(j, slot, w);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) Wide::store(o + v * W, bilinear(w, a + v * W, c_in, below));
      }
    }
}

template <bool kMasked>
void wide_fill(const ColumnJob<float>& j) {
  constexpr int W = Wide::kWidth;
  const bool whole_runs = j.c_begin % j.cog == 0 && j.cg % j.cog == 0 && j.cog % W == 0;
  switch (whole_runs ? j.cog / W : 0) {
    case 1: return wide_fill_runs<kMasked, 1>(j);
    case 2: return wide_fill_runs<kMasked, 2>(j);
    case 3: return wide_fill_runs<kMasked, 3>(j);
    case 4: return wide_fill_runs<kMasked, 4>(j);
#if !defined(__AVX512F__)
    case 8: return wide_fill_runs<kMasked, 8>(j);  // 64 channels per offset group on AVX2
#endif
    default: return wide_fill_columns<kMasked>(j);
  }
}

void wide_columns(const ColumnJob<float>& j) {
  if (j.mask)
    wide_fill<true>(j);
  else
    wide_fill<false>(j);
}

// a · b, or int64's largest where that overflows.
int64_t saturating_product(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<int64_t>::max() : r;
}

// The bilinear corners of a vector of samples, with corner()'s arithmetic step for step (the same
// bits), for corners() and the one-pass sample-and-fill below. Pixel indices in int32: images of
// 2^31 padded pixels or 2^24 rows or columns (past float's exact integers) take corner().
bool corner_lanes_fit(int64_t h, int64_t w, int64_t padded_w) {
  return h < (1 << 24) && w < (1 << 24) && (h + 2) * padded_w < std::numeric_limits<int32_t>::max();
}

#if defined(__AVX512F__)
// 16 samples at a time in GCC's vector extensions (whatever this file's ISA makes of them).
typedef float F16 __attribute__((vector_size(64)));
typedef int32_t I16 __attribute__((vector_size(64)));
constexpr int kLanes = 16;

struct CornerBounds {
  F16 h, w, nan;
  I16 padded_w;
  CornerBounds(int64_t rows, int64_t cols, int64_t padded_cols)
      : h(F16{} + static_cast<float>(rows)), w(F16{} + static_cast<float>(cols)),
        nan(F16{} + std::numeric_limits<float>::quiet_NaN()), padded_w(I16{} + static_cast<int32_t>(padded_cols)) {}
};

struct CornerLanes {
  I16 pixel;
  F16 w[4];
};

// Samples at (at_y + dy, at_x + dx), kLanes values of each read from the pointers.
inline CornerLanes corner_lanes(const float* at_y_p, const float* at_x_p, const float* dy_p, const float* dx_p,
                                const CornerBounds& b) {
  F16 at_y, at_x, dy, dx;
  std::memcpy(&at_y, at_y_p, sizeof(F16));
  std::memcpy(&at_x, at_x_p, sizeof(F16));
  std::memcpy(&dy, dy_p, sizeof(F16));
  std::memcpy(&dx, dx_p, sizeof(F16));
  const F16 y = at_y + dy, x = at_x + dx;
  const I16 inside = (y > -1.0f) & (y < b.h) & (x > -1.0f) & (x < b.w);
  // Truncation, then one down where it rounded up: floor for y, x > -1. Lanes outside convert
  // 0 instead (every conversion in range) and are discarded below.
  const F16 yi = inside ? y : F16{}, xi = inside ? x : F16{};
  I16 y0 = __builtin_convertvector(yi, I16), x0 = __builtin_convertvector(xi, I16);
  y0 += __builtin_convertvector(y0, F16) > yi;  // a true comparison is -1
  x0 += __builtin_convertvector(x0, F16) > xi;
  const F16 ly = yi - __builtin_convertvector(y0, F16), lx = xi - __builtin_convertvector(x0, F16);
  const F16 hy = 1.0f - ly, hx = 1.0f - lx;
  const F16 outside = ((y != y) | (x != x)) ? b.nan : F16{};
  return {inside & ((y0 + 1) * b.padded_w + x0 + 1),
          {inside ? hy * hx : outside, inside ? hy * lx : outside, inside ? ly * hx : outside,
           inside ? ly * lx : outside}};
}

// The lanes' first values in the image (pixel · c_in + first, int32: see corner_lanes_fit()), and
// their weights times the mask's lanes (mask null: as they are).
inline void store_lanes(const CornerLanes& c, const float* mask, int32_t c_in, int32_t first, int32_t* at,
                        float (*w)[kLanes]) {
  const I16 at_lanes = c.pixel * c_in + first;
  std::memcpy(at, &at_lanes, sizeof(I16));
  F16 m;
  if (mask) std::memcpy(&m, mask, sizeof(F16));
  for (int i = 0; i < 4; ++i) {
    const F16 wi = mask ? m * c.w[i] : c.w[i];
    std::memcpy(w[i], &wi, sizeof(F16));
  }
}

void wide_corners(const CornerRow<float>& r) {
  if (!corner_lanes_fit(r.h, r.w, r.padded_w)) return corners<float>(r);
  const CornerBounds bounds(r.h, r.w, r.padded_w);
  // Samples [q, q + count) of the row from at_y..dx (16 values each, read from q on).
  const auto sixteen = [&](const float* at_y, const float* at_x, const float* dy, const float* dx, int64_t q,
                           int count) {
    const CornerLanes c = corner_lanes(at_y, at_x, dy, dx, bounds);
    Corner<float>* out = r.out + q;
    for (int t = 0; t < count; ++t) out[t] = {c.pixel[t], {c.w[0][t], c.w[1][t], c.w[2][t], c.w[3][t]}};
  };
  int64_t q = 0;
  for (; q + kLanes <= r.len; q += kLanes) sixteen(r.at_y + q, r.at_x + q, r.dy + q, r.dx + q, q, kLanes);
  // The last samples, from copies padded with zeros: corner() took ~17x as long per sample.
  if (q < r.len) {
    float tail[4][kLanes] = {};
    const int count = static_cast<int>(r.len - q);
    for (int t = 0; t < count; ++t)
      tail[0][t] = r.at_y[q + t], tail[1][t] = r.at_x[q + t], tail[2][t] = r.dy[q + t], tail[3][t] = r.dx[q + t];
    sixteen(tail[0], tail[1], tail[2], tail[3], q, count);
  }
}

#else
// 8 samples at a time in intrinsics, with the AVX-512 variant's arithmetic step for step. There,
// GCC splits each 16-lane vector into two and writes the corners lane by lane: ~100 instructions
// per sample (callgrind), 29% of the forward's time at offset_groups 4 on Zen 3.
constexpr int kLanes = 8;

struct CornerBounds {
  __m256 h, w;
  __m256i padded_w;
  CornerBounds(int64_t rows, int64_t cols, int64_t padded_cols)
      : h(_mm256_set1_ps(static_cast<float>(rows))), w(_mm256_set1_ps(static_cast<float>(cols))),
        padded_w(_mm256_set1_epi32(static_cast<int32_t>(padded_cols))) {}
};

struct CornerLanes {
  __m256i pixel;
  __m256 w[4];
};

inline CornerLanes corner_lanes(const float* at_y, const float* at_x, const float* dy, const float* dx,
                                const CornerBounds& b) {
  const __m256 minus_one = _mm256_set1_ps(-1.0f), one = _mm256_set1_ps(1.0f);
  const __m256i int_one = _mm256_set1_epi32(1);
  const __m256 y = _mm256_add_ps(_mm256_loadu_ps(at_y), _mm256_loadu_ps(dy));
  const __m256 x = _mm256_add_ps(_mm256_loadu_ps(at_x), _mm256_loadu_ps(dx));
  const __m256 inside = _mm256_and_ps(
      _mm256_and_ps(_mm256_cmp_ps(y, minus_one, _CMP_GT_OQ), _mm256_cmp_ps(y, b.h, _CMP_LT_OQ)),
      _mm256_and_ps(_mm256_cmp_ps(x, minus_one, _CMP_GT_OQ), _mm256_cmp_ps(x, b.w, _CMP_LT_OQ)));
  // floor() for y, x > -1: truncation, then one down where it rounded up (a true comparison is
  // -1). Lanes outside convert 0 and are discarded below.
  const __m256 yi = _mm256_and_ps(inside, y), xi = _mm256_and_ps(inside, x);
  __m256i y0 = _mm256_cvttps_epi32(yi), x0 = _mm256_cvttps_epi32(xi);
  y0 = _mm256_add_epi32(y0, _mm256_castps_si256(_mm256_cmp_ps(_mm256_cvtepi32_ps(y0), yi, _CMP_GT_OQ)));
  x0 = _mm256_add_epi32(x0, _mm256_castps_si256(_mm256_cmp_ps(_mm256_cvtepi32_ps(x0), xi, _CMP_GT_OQ)));
  const __m256 ly = _mm256_sub_ps(yi, _mm256_cvtepi32_ps(y0)), lx = _mm256_sub_ps(xi, _mm256_cvtepi32_ps(x0));
  const __m256 hy = _mm256_sub_ps(one, ly), hx = _mm256_sub_ps(one, lx);
  const __m256 nan = _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN());
  const __m256 outside = _mm256_and_ps(_mm256_cmp_ps(y, x, _CMP_UNORD_Q), nan);  // NaN where y or x is
  const __m256i row = _mm256_mullo_epi32(_mm256_add_epi32(y0, int_one), b.padded_w);
  return {_mm256_and_si256(_mm256_castps_si256(inside), _mm256_add_epi32(_mm256_add_epi32(row, x0), int_one)),
          {_mm256_blendv_ps(outside, _mm256_mul_ps(hy, hx), inside),
           _mm256_blendv_ps(outside, _mm256_mul_ps(hy, lx), inside),
           _mm256_blendv_ps(outside, _mm256_mul_ps(ly, hx), inside),
           _mm256_blendv_ps(outside, _mm256_mul_ps(ly, lx), inside)}};
}

inline void store_lanes(const CornerLanes& c, const float* mask, int32_t c_in, int32_t first, int32_t* at,
                        float (*w)[kLanes]) {
  const __m256i at_lanes = _mm256_add_epi32(_mm256_mullo_epi32(c.pixel, _mm256_set1_epi32(c_in)), _mm256_set1_epi32(first));
  _mm256_store_si256(reinterpret_cast<__m256i*>(at), at_lanes);
  for (int i = 0; i < 4; ++i) _mm256_store_ps(w[i], mask ? _mm256_mul_ps(_mm256_loadu_ps(mask), c.w[i]) : c.w[i]);
}

// Here the weights leave as four-float rows of a 4 x 8 transpose.
void avx2_corners(const CornerRow<float>& r) {
  constexpr int L = kLanes;
  if (!corner_lanes_fit(r.h, r.w, r.padded_w)) return corners<float>(r);
  const CornerBounds bounds(r.h, r.w, r.padded_w);
  // Samples [q, q + count) of the row from at_y..dx (8 values each, read from q on).
  const auto eight = [&](const float* at_y, const float* at_x, const float* dy, const float* dx, int64_t q, int count) {
    const CornerLanes c = corner_lanes(at_y, at_x, dy, dx, bounds);
    // Per 128-bit lane, (w0..w3) of samples t, t + 1, t + 2, t + 3 become four rows: lane 0 holds
    // samples 0-3, lane 1 samples 4-7.
    const __m256 lo01 = _mm256_unpacklo_ps(c.w[0], c.w[1]), hi01 = _mm256_unpackhi_ps(c.w[0], c.w[1]);
    const __m256 lo23 = _mm256_unpacklo_ps(c.w[2], c.w[3]), hi23 = _mm256_unpackhi_ps(c.w[2], c.w[3]);
    const __m256 s[4] = {_mm256_shuffle_ps(lo01, lo23, 0x44), _mm256_shuffle_ps(lo01, lo23, 0xEE),
                         _mm256_shuffle_ps(hi01, hi23, 0x44), _mm256_shuffle_ps(hi01, hi23, 0xEE)};
    alignas(32) int32_t pixels[L];
    _mm256_store_si256(reinterpret_cast<__m256i*>(pixels), c.pixel);
    Corner<float>* out = r.out + q;
    if (count == L) {
      for (int t = 0; t < 4; ++t) {
        out[t].pixel = pixels[t];
        out[t + 4].pixel = pixels[t + 4];
        _mm_storeu_ps(out[t].w, _mm256_castps256_ps128(s[t]));
        _mm_storeu_ps(out[t + 4].w, _mm256_extractf128_ps(s[t], 1));
      }
      return;
    }
    alignas(32) float rows[L][4];
    for (int t = 0; t < 4; ++t) {
      _mm_store_ps(rows[t], _mm256_castps256_ps128(s[t]));
      _mm_store_ps(rows[t + 4], _mm256_extractf128_ps(s[t], 1));
    }
    for (int t = 0; t < count; ++t) out[t] = {pixels[t], {rows[t][0], rows[t][1], rows[t][2], rows[t][3]}};
  };
  int64_t q = 0;
  for (; q + L <= r.len; q += L) eight(r.at_y + q, r.at_x + q, r.dy + q, r.dx + q, q, L);
  if (q < r.len) {  // the last samples, from copies padded with zeros
    float tail[4][L] = {};
    const int count = static_cast<int>(r.len - q);
    for (int t = 0; t < count; ++t)
      tail[0][t] = r.at_y[q + t], tail[1][t] = r.at_x[q + t], tail[2][t] = r.dy[q + t], tail[3][t] = r.dx[q + t];
    eight(tail[0], tail[1], tail[2], tail[3], q, count);
  }
}
#endif

// The corners and the column block in one pass (SampleColumnsJob), kLanes pixels at a time: the
// lanes' corners of every kernel position and offset group first, into a small table (each
// sample's first value in the image and its weights, already times the mask) that stays in L1,
// then each pixel's row of the column block in order, each run of NV vectors (NV 0: cog / kWidth,
// known at run time) filled as wide_fill_runs() fills it. With runs of one vector (offset_groups 4
// of 64 channels on AVX-512) the two-pass path's corner tables (24-byte records written lane by
// lane, ~170 KiB a tile), the copy of the mask and splatting each weight times the mask cost
// about as much as the samples' arithmetic.
template <bool kMasked, int NV>
void sample_fill_runs(const SampleColumnsJob<float>& j, const CornerBounds& bounds, int32_t* first, float* weight) {
  constexpr int L = kLanes, W = Wide::kWidth;
  constexpr int64_t kPrefetchAhead = 256 / sizeof(float);
  const int64_t cog = j.cog, runs = j.runs, kk = j.kk, items = kk * runs, kg = items * cog, len = j.len;
  const int64_t nv = NV ? NV : cog / W, c_in = j.c_in, below = j.padded_w * j.c_in, tile = j.tile, pixels = j.pixels;
  const float* image = j.image;
  alignas(64) float tail[5][L];  // the last pixels' inputs, padded with zeros
  for (int64_t q0 = 0; q0 < len; q0 += L) {
    const int count = static_cast<int>(lesser(L, len - q0));
    // Item (k, r) at k·runs + r: its lanes' first values in the image at first + item·L, weights i
    // at weight + (item·4 + i)·L.
    for (int64_t k = 0, item = 0; k < kk; ++k) {
      const float* at_y = j.at + 2 * k * tile + q0;
      const float* at_x = at_y + tile;
      for (int64_t r = 0; r < runs; ++r, ++item) {
        const int64_t row = r * kk + k;
        const float* dy = j.offset + 2 * row * pixels + q0;
        const float* mask = kMasked ? j.mask + row * pixels + q0 : nullptr;
        const int32_t channel = static_cast<int32_t>(r * cog);
        // Each item reads its own rows of dy, dx and mask: 3·kk·runs streams (108 at offset_groups
        // 4 of a 3x3 kernel), more than the hardware prefetcher follows, and on every call they come
        // from beyond L2. Asking for each row's line 256 bytes ahead took the forward at offset_groups
        // 4 to 0.92x its time (0.90x on AVX2); 512 bytes ahead was no better, the non-temporal hint
        // slower. A prefetch never faults, past a row's end included.
        _mm_prefetch(reinterpret_cast<const char*>(dy + kPrefetchAhead), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(dy + pixels + kPrefetchAhead), _MM_HINT_T0);
        if (kMasked) _mm_prefetch(reinterpret_cast<const char*>(mask + kPrefetchAhead), _MM_HINT_T0);
        int32_t* at = first + item * L;
        float(*wt)[L] = reinterpret_cast<float(*)[L]>(weight + item * 4 * L);
        if (count == L) {
          store_lanes(corner_lanes(at_y, at_x, dy, dy + pixels, bounds), mask, static_cast<int32_t>(c_in), channel, at,
                      wt);
          continue;
        }
        for (auto& values : tail)
          for (float& v : values) v = 0.0f;
        for (int t = 0; t < count; ++t) {
          tail[0][t] = at_y[t], tail[1][t] = at_x[t], tail[2][t] = dy[t], tail[3][t] = dy[pixels + t];
          if (kMasked) tail[4][t] = mask[t];
        }
        store_lanes(corner_lanes(tail[0], tail[1], tail[2], tail[3], bounds), kMasked ? tail[4] : nullptr,
                    static_cast<int32_t>(c_in), channel, at, wt);
      }
    }
    // Each pixel's row of the column block, in order: item after item, cog values each.
    for (int t = 0; t < count; ++t) {
      float* o = j.columns + (q0 + t) * kg;
      const int32_t* at = first + t;
      const float* wt = weight + t;
      for (int64_t item = 0; item < items; ++item, o += cog, at += L, wt += 4 * L) {
        const float* a = image + *at;
        const Wide::Reg w[4] = {Wide::splat(wt[0]), Wide::splat(wt[L]), Wide::splat(wt[2 * L]), Wide::splat(wt[3 * L])};
#pragma GCC unroll 8
        for (int64_t v = 0; v < (NV ? NV : nv); ++v) Wide::store(o + v * W, bilinear(w, a + v * W, c_in, below));
      }
    }
  }
}

template <bool kMasked>
void sample_fill(const SampleColumnsJob<float>& j, const CornerBounds& bounds, int32_t* first, float* weight) {
  switch (j.cog / Wide::kWidth) {
    case 1: return sample_fill_runs<kMasked, 1>(j, bounds, first, weight);
    case 2: return sample_fill_runs<kMasked, 2>(j, bounds, first, weight);
    case 4: return sample_fill_runs<kMasked, 4>(j, bounds, first, weight);
#if !defined(__AVX512F__)
    case 8: return sample_fill_runs<kMasked, 8>(j, bounds, first, weight);
#endif
    default: return sample_fill_runs<kMasked, 0>(j, bounds, first, weight);
  }
}

bool wide_sample_columns(const SampleColumnsJob<float>& j) {
  // Pixel indices and offsets into the image (padded pixels · c_in) in int32.
  if (j.cog % Wide::kWidth != 0 || !corner_lanes_fit(j.h, j.w, j.padded_w) ||
      saturating_product((j.h + 2) * j.padded_w, j.c_in) >= std::numeric_limits<int32_t>::max())
    return false;
  const CornerBounds bounds(j.h, j.w, j.padded_w);
  // The lanes' table: kLanes pixels and 4·kLanes weights per kernel position and offset group.
  const int64_t items = j.kk * j.runs;
  Aligned<float> weight(items * 4 * kLanes);
  Aligned<int32_t> first(items * kLanes);
  if (j.mask)
    sample_fill<true>(j, bounds, first.data, weight.data);
  else
    sample_fill<false>(j, bounds, first.data, weight.data);
  return true;
}

// channels_last() in kWidth x kWidth blocks transposed in registers.
void wide_channels_last(const float* src, int64_t plane, int64_t c_in, int64_t w, float* dst) {
  constexpr int W = Wide::kWidth;
  int64_t c0 = 0;
  for (; c0 + W <= c_in; c0 += W) {
    int64_t x0 = 0;
    for (; x0 + W <= w; x0 += W) {
      typename Wide::Reg r[W];
      for (int t = 0; t < W; ++t) r[t] = Wide::load(src + (c0 + t) * plane + x0);
      Wide::transpose(r);
      for (int t = 0; t < W; ++t) Wide::store(dst + (x0 + t) * c_in + c0, r[t]);
    }
    for (; x0 < w; ++x0)
      for (int t = 0; t < W; ++t) dst[x0 * c_in + c0 + t] = src[(c0 + t) * plane + x0];
  }
  for (; c0 < c_in; ++c0)  // the last channels
    for (int64_t x = 0; x < w; ++x) dst[x * c_in + c0] = src[c0 * plane + x];
}

// One panel (rows output channels, V vectors) times all n pixels; sums holds max(n, P) pixels.
template <int V>
void wide_panel(const float* w, const float* b, const float* bias, float* out, int64_t rows, int64_t k, int64_t n,
                int64_t ldo, float* sums) {
  constexpr int P = Wide::kAccumulators / V;
  constexpr int64_t lds = V * Wide::kWidth;
  if (n < P) {  // fewer pixels than a micro-tile: from a copy padded with zero columns
    FloatBuffer padded(P * k, FloatBuffer::kZeroed);  // the zero columns past n
    for (int64_t i = 0; i < n * k; ++i) padded.data[i] = b[i];
    micro_tile<V, P>(w, padded.data, k, k, sums);
  } else {
    for (int64_t j0 = 0; j0 + P <= n; j0 += P) micro_tile<V, P>(w, b + j0 * k, k, k, sums + j0 * lds);
    if (n % P)  // the last pixels: the last P pixels again
      micro_tile<V, P>(w, b + (n - P) * k, k, k, sums + (n - P) * lds);
  }
  store_transposed(sums, lds, bias, out, rows, n, ldo);
}

void wide_gemm(const float* packed, const float* b, const float* bias, float* out, int64_t m, int64_t k, int64_t n,
               int64_t ldo) {
  constexpr int64_t kPanel = Wide::kWidth * Wide::kMaxV;
  // Every sum that store_transposed() reads is written first: no zeroing (once per tile and group).
  FloatBuffer sums(greater(n, Wide::kAccumulators) * kPanel, FloatBuffer::kUninitialised);
  for (int64_t i0 = 0; i0 < m; i0 += kPanel) {
    const int64_t rows = lesser(kPanel, m - i0);
    const float* w = packed + i0 * k;
    const float* bi = bias ? bias + i0 : nullptr;
    float* o = out + i0 * ldo;
    switch ((rows + Wide::kWidth - 1) / Wide::kWidth) {
      case 1: wide_panel<1>(w, b, bi, o, rows, k, n, ldo, sums.data); break;
      case 2: wide_panel<2>(w, b, bi, o, rows, k, n, ldo, sums.data); break;
#if defined(__AVX512F__)
      case 3: wide_panel<3>(w, b, bi, o, rows, k, n, ldo, sums.data); break;
      case 4: wide_panel<4>(w, b, bi, o, rows, k, n, ldo, sums.data); break;
#endif
    }
  }
}
#endif

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
        const int64_t og = c0 / j.cog, c1 = lesser(c_end, (og + 1) * j.cog), n = c1 - c0;
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
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  // In Kernels' order: channels_last, corners, columns, weight_size, pack_weight, gemm,
  // gemm_acc_g_cols, gemm_gt_w, sample_grads, sample_columns, gemm_same_for_any_n.
#if defined(__AVX512F__)
  const auto wide_corners_here = &wide_corners;
#else
  const auto wide_corners_here = &avx2_corners;
#endif
  v.f32 = {&wide_channels_last, wide_corners_here, &wide_columns, &wide_weight_size, &wide_pack_weight, &wide_gemm,
           &gemm_acc_g_cols<float>, &gemm_gt_w<float>, &sample_grads<float>, &wide_sample_columns, true};
#else
  v.f32 = {&channels_last<float>, &corners<float>, &columns<float>, &eigen_weight_size<float>,
           &eigen_pack_weight<float>, &gemm<float>, &gemm_acc_g_cols<float>, &gemm_gt_w<float>, &sample_grads<float>};
#endif
  v.f64 = {&channels_last<double>, &corners<double>, &columns<double>, &eigen_weight_size<double>,
           &eigen_pack_weight<double>, &gemm<double>, &gemm_acc_g_cols<double>, &gemm_gt_w<double>,
           &sample_grads<double>};
  v.isa = isa;
  return v;
}

}  // namespace
}  // namespace opbridge::deform_conv2d_impl
