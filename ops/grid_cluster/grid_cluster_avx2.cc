// grid_cluster's vector cluster pass for AVX2 (see grid_cluster_variants.h): compiled with -mavx2
// -mfma by opbridge_add_op_library, called only after a CPU check. Intrinsics and functions of
// internal linkage only (see grid_cluster_avx512.cc). AVX2 has no float -> int64 conversion and no
// 64-bit multiply: quotients go through int32 (|q| < bound32), and each index term is a signed
// 32 x 32 -> 64-bit product, so a grid with a stride of 2^31 or more takes the baseline path.
#include "grid_cluster_variants.h"

#if defined(__AVX2__)
#include <immintrin.h>

namespace opbridge::grid_cluster_impl {
namespace {

// The coordinates of eight rows held in D registers, one register per coordinate, rows in order.
inline void deinterleave(const __m256* v, __m256* c, int d) {
  if (d == 2) {  // v: x0 y0 x1 y1 x2 y2 x3 y3 | x4 y4 ... x7 y7
    // Per 128-bit lane the shuffle gives x0 x1 x4 x5 | x2 x3 x6 x7; the 64-bit pairs back in order.
    c[0] = _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0))), _MM_SHUFFLE(3, 1, 2, 0)));
    c[1] = _mm256_castpd_ps(_mm256_permute4x64_pd(
        _mm256_castps_pd(_mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1))), _MM_SHUFFLE(3, 1, 2, 0)));
    return;
  }
  // d = 3, v: x0 y0 z0 x1 y1 z1 x2 y2 | z2 x3 y3 z3 x4 y4 z4 x5 | y5 z5 x6 y6 z6 x7 y7 z7.
  // Blends gather each coordinate's eight values (positions 0,3,6 of one register, 1,4,7 of the
  // next, 2,5 of the third, rotating), a permute puts them in row order.
  const __m256 x = _mm256_blend_ps(_mm256_blend_ps(v[0], v[1], 0x92), v[2], 0x24);  // x0 x3 x6 x1 x4 x7 x2 x5
  const __m256 y = _mm256_blend_ps(_mm256_blend_ps(v[0], v[1], 0x24), v[2], 0x49);  // y5 y0 y3 y6 y1 y4 y7 y2
  const __m256 z = _mm256_blend_ps(_mm256_blend_ps(v[0], v[1], 0x49), v[2], 0x92);  // z2 z5 z0 z3 z6 z1 z4 z7
  c[0] = _mm256_permutevar8x32_ps(x, _mm256_setr_epi32(0, 3, 6, 1, 4, 7, 2, 5));
  c[1] = _mm256_permutevar8x32_ps(y, _mm256_setr_epi32(1, 4, 7, 2, 5, 0, 3, 6));
  c[2] = _mm256_permutevar8x32_ps(z, _mm256_setr_epi32(2, 5, 0, 3, 6, 1, 4, 7));
}

template <int D>
int64_t rows_avx2(const float* pos, int64_t b, int64_t e, const FastGrid& g, int64_t* out) {
  for (int j = 0; j < D; ++j)
    if (g.stride[j] >= (int64_t{1} << 31)) return b;
  __m256 start[D], size[D], bound[D], neg_bound[D];
  __m256i stride[D];
  for (int j = 0; j < D; ++j) {
    start[j] = _mm256_set1_ps(g.start[j]);
    size[j] = _mm256_set1_ps(g.size[j]);
    bound[j] = _mm256_set1_ps(g.bound32[j]);
    neg_bound[j] = _mm256_set1_ps(-g.bound32[j]);
    stride[j] = _mm256_set1_epi64x(g.stride[j]);
  }
  int64_t r = b;
  for (; r + 8 <= e; r += 8) {
    __m256 v[D], c[D];
    for (int k = 0; k < D; ++k) v[k] = _mm256_loadu_ps(pos + r * D + 8 * k);
    deinterleave(v, c, D);
    __m256 inside = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
    for (int j = 0; j < D; ++j) {
      const __m256 q = _mm256_div_ps(_mm256_sub_ps(c[j], start[j]), size[j]);
      inside = _mm256_and_ps(inside, _mm256_and_ps(_mm256_cmp_ps(q, bound[j], _CMP_LT_OQ),
                                                   _mm256_cmp_ps(q, neg_bound[j], _CMP_GT_OQ)));
      const __m256i qi = _mm256_cvttps_epi32(q);  // truncation, as static_cast (|q| < 2^31)
      // mul_epi32 multiplies the low, signed 32 bits of each 64-bit lane: the quotient, sign
      // extended, by the stride (< 2^31).
      lo = _mm256_add_epi64(lo, _mm256_mul_epi32(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(qi)), stride[j]));
      hi = _mm256_add_epi64(hi, _mm256_mul_epi32(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(qi, 1)), stride[j]));
    }
    if (_mm256_movemask_ps(inside) != 0xFF) break;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r), lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r + 4), hi);
  }
  return r;
}

}  // namespace

Variant avx2_variant() { return Variant{rows_avx2<2>, rows_avx2<3>, "avx2"}; }

}  // namespace opbridge::grid_cluster_impl

#else

namespace opbridge::grid_cluster_impl {
Variant avx2_variant() { return {}; }
}  // namespace opbridge::grid_cluster_impl

#endif
