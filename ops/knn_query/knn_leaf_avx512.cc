// The k = 1 leaf scan of knn_leaf_variants.h for AVX-512: 16 points a register, two registers
// for a leaf of up to 32. Compiled with -mavx512f -mavx512dq -mavx512vl -mavx512bw by
// opbridge_add_op_library and called only after a CPU check.
#include "knn_leaf_variants.h"

#if defined(__AVX512F__)
#include <immintrin.h>

#include <cstdint>

namespace opbridge::knn_leaf {
namespace {

// Squared distances of the lanes in `live`, as bits (padding lanes: INT32_MAX, never the least).
inline __m512i distance_bits(const float* x, const float* y, const float* z, __mmask16 live, __m512 qx, __m512 qy,
                             __m512 qz) {
  const __m512 dx = _mm512_sub_ps(_mm512_maskz_loadu_ps(live, x), qx);
  const __m512 dy = _mm512_sub_ps(_mm512_maskz_loadu_ps(live, y), qy);
  const __m512 dz = _mm512_sub_ps(_mm512_maskz_loadu_ps(live, z), qz);
  __m512 xx = _mm512_mul_ps(dx, dx), yy = _mm512_mul_ps(dy, dy), zz = _mm512_mul_ps(dz, dz);
  // Each product a rounded value: without this the compiler may fuse it with the add (an FMA).
  asm("" : "+v"(xx), "+v"(yy), "+v"(zz));
  const __m512 d2 = _mm512_add_ps(_mm512_add_ps(xx, yy), zz);
  return _mm512_mask_blend_epi32(live, _mm512_set1_epi32(INT32_MAX), _mm512_castps_si512(d2));
}

uint64_t nearest_in_leaf(const float* x, const float* y, const float* z, const int32_t* idx, int len, const float* q) {
  const __m512 qx = _mm512_set1_ps(q[0]), qy = _mm512_set1_ps(q[1]), qz = _mm512_set1_ps(q[2]);
  const int len1 = len < 16 ? len : 16, len2 = len - len1;
  const __mmask16 live1 = static_cast<__mmask16>((1u << len1) - 1), live2 = static_cast<__mmask16>((1u << len2) - 1);
  const __m512i b1 = distance_bits(x, y, z, live1, qx, qy, qz);
  const __m512i b2 = distance_bits(x + 16, y + 16, z + 16, live2, qx, qy, qz);
  // Distances are non-negative floats: their bits order as signed integers.
  const int32_t lowest = _mm512_reduce_min_epi32(_mm512_min_epi32(b1, b2));
  const __m512i at = _mm512_set1_epi32(lowest);
  const __m512i none = _mm512_set1_epi32(INT32_MAX);
  const __m512i i1 = _mm512_mask_loadu_epi32(none, _mm512_cmpeq_epi32_mask(b1, at) & live1, idx);
  const __m512i i2 = _mm512_mask_loadu_epi32(none, _mm512_cmpeq_epi32_mask(b2, at) & live2, idx + 16);
  const int32_t first = _mm512_reduce_min_epi32(_mm512_min_epi32(i1, i2));
  return (static_cast<uint64_t>(static_cast<uint32_t>(lowest)) << 32) | static_cast<uint32_t>(first);
}

}  // namespace

Variant avx512_variant() { return Variant{nearest_in_leaf, "avx512"}; }

}  // namespace opbridge::knn_leaf

#else

namespace opbridge::knn_leaf {
Variant avx512_variant() { return {}; }
}  // namespace opbridge::knn_leaf

#endif
