// The loops sparse_conv_variants.h declares, included once per instruction set (by
// sparse_conv_variants.cc, sparse_conv_avx2.cc and sparse_conv_avx512.cc, each with its flags and,
// for the wider ones, Eigen renamed into a namespace of its own). Internal linkage throughout.
#include <Eigen/Core>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include "sparse_conv_variants.h"

namespace opbridge::sparse_conv_impl {
namespace {

constexpr int64_t kRows = 256;  // pairs gathered per GEMM

template <typename T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using Rows = Eigen::Map<RowMatrix<T>>;
template <typename T>
using ConstRows = Eigen::Map<const RowMatrix<T>>;

template <typename T>
void gather(T* dst, const T* src, const int32_t* rows, int64_t n, int64_t c) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * c, src + rows[i] * c, sizeof(T) * static_cast<size_t>(c));
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// float32 without a gather buffer: R pairs at a time, their input rows read in place and each
// weight row loaded once for all R; the accumulators (R x NV vectors) stay in registers and are
// added into the output rows at the end.
#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kLanes = 16, kRowsAtOnce = 4;
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec splat(float a) { return _mm512_set1_ps(a); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec zero() { return _mm512_setzero_ps(); }
#else
using Vec = __m256;
constexpr int kLanes = 8, kRowsAtOnce = 3;
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec splat(float a) { return _mm256_set1_ps(a); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec zero() { return _mm256_setzero_ps(); }
#endif
constexpr int kVectorsAtOnce = 4;

template <int R, int NV>
inline void pair_tile(const float* const* xs, const float* w, float* const* outs, int64_t cin, int64_t cout) {
  Vec acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = zero();
  for (int64_t c = 0; c < cin; ++c) {
    Vec wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = load(w + c * cout + v * kLanes);
    for (int r = 0; r < R; ++r) {
      const Vec a = splat(xs[r][c]);
      for (int v = 0; v < NV; ++v) acc[r][v] = fma(a, wv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) store(outs[r] + v * kLanes, add(load(outs[r] + v * kLanes), acc[r][v]));
}

template <int R>
inline void pair_rows(const float* const* xs, const float* w, float* const* outs, int64_t cin, int64_t cout) {
  const float* x_at[R];
  float* out_at[R];
  for (int64_t j = 0; j < cout; j += kVectorsAtOnce * kLanes) {
    for (int r = 0; r < R; ++r) out_at[r] = outs[r] + j, x_at[r] = xs[r];
    switch (std::min<int64_t>(kVectorsAtOnce, (cout - j) / kLanes)) {
      case 4: pair_tile<R, 4>(x_at, w + j, out_at, cin, cout); break;
      case 3: pair_tile<R, 3>(x_at, w + j, out_at, cin, cout); break;
      case 2: pair_tile<R, 2>(x_at, w + j, out_at, cin, cout); break;
      default: pair_tile<R, 1>(x_at, w + j, out_at, cin, cout); break;
    }
  }
}

// Whether the fused loop takes this product (float32, whole vectors of output channels).
template <typename T>
bool fused_product(const T* x, const int32_t* from, const T* w, T* out, const int32_t* to, int64_t n, int64_t cin,
                   int64_t cout) {
  if constexpr (!std::is_same_v<T, float>) {
    return false;
  } else {
    if (cout % kLanes != 0) return false;
    const float* xs[kRowsAtOnce];
    float* outs[kRowsAtOnce];
    int64_t i = 0;
    for (; i + kRowsAtOnce <= n; i += kRowsAtOnce) {
      for (int r = 0; r < kRowsAtOnce; ++r) {
        xs[r] = x + (from ? from[i + r] : i + r) * cin;
        outs[r] = out + (to ? to[i + r] : i + r) * cout;
      }
      pair_rows<kRowsAtOnce>(xs, w, outs, cin, cout);
    }
    for (; i < n; ++i) {
      xs[0] = x + (from ? from[i] : i) * cin;
      outs[0] = out + (to ? to[i] : i) * cout;
      pair_rows<1>(xs, w, outs, cin, cout);
    }
    return true;
  }
}
#else
template <typename T>
bool fused_product(const T*, const int32_t*, const T*, T*, const int32_t*, int64_t, int64_t, int64_t) {
  return false;
}
#endif

template <typename T>
void gather_gemm_scatter(const T* x, const int32_t* from, const T* w, T* out, const int32_t* to, int64_t n,
                         int64_t cin, int64_t cout) {
  if (fused_product(x, from, w, out, to, n, cin, cout)) return;
  ConstRows<T> wm(w, cin, cout);
  RowMatrix<T> a(std::min(kRows, n), cin), y(std::min(kRows, n), cout);
  for (int64_t s = 0; s < n; s += kRows) {
    const int64_t rows = std::min(kRows, n - s);
    const T* in = x + s * cin;
    if (from) {
      gather(a.data(), x, from + s, rows, cin);
      in = a.data();
    }
    if (!to) {
      Rows<T>(out + s * cout, rows, cout).noalias() += ConstRows<T>(in, rows, cin) * wm;
      continue;
    }
    Rows<T>(y.data(), rows, cout).noalias() = ConstRows<T>(in, rows, cin) * wm;
    for (int64_t i = 0; i < rows; ++i) {
      T* d = out + to[s + i] * cout;
      const T* v = y.data() + i * cout;
      for (int64_t j = 0; j < cout; ++j) d[j] += v[j];
    }
  }
}

template <typename T>
void weight_grad(const T* x, const int32_t* from, const T* g, const int32_t* to, T* acc, int64_t n, int64_t cin,
                 int64_t cout) {
  Rows<T> gw(acc, cin, cout);
  RowMatrix<T> a(std::min(kRows, n), cin), b(std::min(kRows, n), cout);
  for (int64_t s = 0; s < n; s += kRows) {
    const int64_t rows = std::min(kRows, n - s);
    const T* xa = x + s * cin;
    const T* gb = g + s * cout;
    if (from) {
      gather(a.data(), x, from + s, rows, cin);
      xa = a.data();
    }
    if (to) {
      gather(b.data(), g, to + s, rows, cout);
      gb = b.data();
    }
    gw.noalias() += ConstRows<T>(xa, rows, cin).transpose() * ConstRows<T>(gb, rows, cout);
  }
}

template <typename T>
Kernels<T> kernels_of() {
  Kernels<T> k;
  k.gather_gemm_scatter = gather_gemm_scatter<T>;
  k.weight_grad = weight_grad<T>;
  return k;
}

[[maybe_unused]] Variant this_variant(const char* isa) {
  Variant v;
  v.f32 = kernels_of<float>();
  v.f64 = kernels_of<double>();
  v.isa = isa;
  return v;
}

}  // namespace
}  // namespace opbridge::sparse_conv_impl
