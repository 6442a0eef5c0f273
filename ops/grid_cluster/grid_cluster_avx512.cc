// grid_cluster's vector cluster pass for AVX-512 (see grid_cluster_variants.h): compiled with
// -mavx512f -mavx512dq -mavx512vl -mavx512bw by opbridge_add_op_library, called only after a CPU
// check. Intrinsics and functions of internal linkage only: no inline function of external
// linkage is instantiated here, so the linker cannot hand an AVX-512 copy of one to baseline code.
#include "grid_cluster_variants.h"

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>

// GCC 12 reports a false "may be used uninitialized" inside its own AVX-512 intrinsics.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace opbridge::grid_cluster_impl {
namespace {

// Sixteen rows of D coordinates are 16 * D consecutive floats, loaded as D registers; coordinate
// j of row r is element D * r + j. Rows whose element lies in the first two registers come from
// one two-register permute; for D = 3, the others from the third register, under a mask.
template <int D>
struct Deinterleave {
  __m512i pair[D], third[D];
  __mmask16 from_third[D];
  Deinterleave() {
    for (int j = 0; j < D; ++j) {
      alignas(64) int32_t p[16], t[16];
      unsigned m = 0;
      for (int r = 0; r < 16; ++r) {
        const int e = D * r + j;
        p[r] = e < 32 ? e : 0;
        t[r] = e < 32 ? 0 : e - 32;
        m |= (e < 32 ? 0u : 1u) << r;
      }
      pair[j] = _mm512_load_si512(p);
      third[j] = _mm512_load_si512(t);
      from_third[j] = static_cast<__mmask16>(m);
    }
  }
  __m512 coordinate(int j, const __m512* regs) const {
    const __m512 v = _mm512_permutex2var_ps(regs[0], pair[j], regs[1]);
    return D == 3 ? _mm512_mask_permutexvar_ps(v, from_third[j], third[j], regs[D - 1]) : v;
  }
};

template <int D>
int64_t rows_avx512(const float* pos, int64_t b, int64_t e, const FastGrid& g, int64_t* out) {
  const Deinterleave<D> lanes;
  __m512 start[D], size[D], bound[D], neg_bound[D];
  __m512i stride[D];
  for (int j = 0; j < D; ++j) {
    start[j] = _mm512_set1_ps(g.start[j]);
    size[j] = _mm512_set1_ps(g.size[j]);
    bound[j] = _mm512_set1_ps(g.bound[j]);
    neg_bound[j] = _mm512_set1_ps(-g.bound[j]);
    stride[j] = _mm512_set1_epi64(g.stride[j]);
  }
  int64_t r = b;
  for (; r + 16 <= e; r += 16) {
    __m512 regs[D];
    for (int k = 0; k < D; ++k) regs[k] = _mm512_loadu_ps(pos + r * D + 16 * k);
    __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
    __mmask16 inside = 0xFFFF;
    for (int j = 0; j < D; ++j) {
      const __m512 q = _mm512_div_ps(_mm512_sub_ps(lanes.coordinate(j, regs), start[j]), size[j]);
      // NaN compares false: such a row leaves the fast path.
      inside &= _mm512_cmp_ps_mask(q, bound[j], _CMP_LT_OQ) & _mm512_cmp_ps_mask(q, neg_bound[j], _CMP_GT_OQ);
      // Truncation toward zero, as static_cast<int64_t> (exact: |q| < bound <= 2^62).
      const __m512i q_lo = _mm512_cvttps_epi64(_mm512_castps512_ps256(q));
      const __m512i q_hi = _mm512_cvttps_epi64(_mm512_extractf32x8_ps(q, 1));
      lo = _mm512_add_epi64(lo, _mm512_mullo_epi64(q_lo, stride[j]));
      hi = _mm512_add_epi64(hi, _mm512_mullo_epi64(q_hi, stride[j]));
    }
    if (inside != 0xFFFF) break;
    _mm512_storeu_si512(out + r, lo);
    _mm512_storeu_si512(out + r + 8, hi);
  }
  return r;
}

}  // namespace

Variant avx512_variant() { return Variant{rows_avx512<2>, rows_avx512<3>, "avx512"}; }

}  // namespace opbridge::grid_cluster_impl
#pragma GCC diagnostic pop

#else

namespace opbridge::grid_cluster_impl {
Variant avx512_variant() { return {}; }
}  // namespace opbridge::grid_cluster_impl

#endif
