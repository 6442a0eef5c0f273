// The k = 1 leaf scan of knn_leaf_variants.h for AVX2: 8 points a register, up to four registers
// for a leaf of up to 32. Compiled with -mavx2 -mfma by opbridge_add_op_library and called only
// after a CPU check.
#include "knn_leaf_variants.h"

#if defined(__AVX2__)
#include <immintrin.h>

#include <cstdint>

namespace opbridge::knn_leaf {
namespace {

inline int32_t hmin(__m256i v) {
  __m128i m = _mm_min_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_min_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm_min_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(m);
}

uint64_t nearest_in_leaf(const float* x, const float* y, const float* z, const int32_t* idx, int len, const float* q) {
  const __m256 qx = _mm256_set1_ps(q[0]), qy = _mm256_set1_ps(q[1]), qz = _mm256_set1_ps(q[2]);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i none = _mm256_set1_epi32(INT32_MAX);
  __m256i bits[4], live[4];
  __m256i lowest = none;
  const int regs = (len + 7) / 8;
  for (int r = 0; r < regs; ++r) {
    // Lanes past the leaf's end: not loaded (maskload reads nothing there), INT32_MAX.
    live[r] = _mm256_cmpgt_epi32(_mm256_set1_epi32(len - 8 * r), lane);
    const __m256 dx = _mm256_sub_ps(_mm256_maskload_ps(x + 8 * r, live[r]), qx);
    const __m256 dy = _mm256_sub_ps(_mm256_maskload_ps(y + 8 * r, live[r]), qy);
    const __m256 dz = _mm256_sub_ps(_mm256_maskload_ps(z + 8 * r, live[r]), qz);
    __m256 xx = _mm256_mul_ps(dx, dx), yy = _mm256_mul_ps(dy, dy), zz = _mm256_mul_ps(dz, dz);
    // Each product a rounded value: without this the compiler may fuse it with the add (an FMA).
    asm("" : "+x"(xx), "+x"(yy), "+x"(zz));
    const __m256 d2 = _mm256_add_ps(_mm256_add_ps(xx, yy), zz);
    bits[r] = _mm256_blendv_epi8(none, _mm256_castps_si256(d2), live[r]);
    // Distances are non-negative floats: their bits order as signed integers.
    lowest = _mm256_min_epi32(lowest, bits[r]);
  }
  const int32_t low = hmin(lowest);
  const __m256i at = _mm256_set1_epi32(low);
  __m256i first = none;
  for (int r = 0; r < regs; ++r) {
    const __m256i hit = _mm256_and_si256(_mm256_cmpeq_epi32(bits[r], at), live[r]);
    first = _mm256_min_epi32(first, _mm256_blendv_epi8(none, _mm256_maskload_epi32(idx + 8 * r, hit), hit));
  }
  return (static_cast<uint64_t>(static_cast<uint32_t>(low)) << 32) | static_cast<uint32_t>(hmin(first));
}

}  // namespace

Variant avx2_variant() { return Variant{nearest_in_leaf, "avx2"}; }

}  // namespace opbridge::knn_leaf

#else

namespace opbridge::knn_leaf {
Variant avx2_variant() { return {}; }
}  // namespace opbridge::knn_leaf

#endif
