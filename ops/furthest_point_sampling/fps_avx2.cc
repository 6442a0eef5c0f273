// The pick of furthest point sampling (fps_step_impl.h) for AVX2: 8 float32 or 4 float64 lanes.
// Compiled with -mavx2 -mfma by opbridge_add_op_library and called only after a CPU check;
// intrinsics and functions of internal linkage only.
#include "fps_variants.h"

#if defined(__AVX2__)
#include <immintrin.h>

#include "fps_step_impl.h"

namespace opbridge::fps {
namespace {

template <int P>
uint32_t compare_mask(__m256 a, __m256 b) {
  return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, b, P)));
}
template <int P>
uint32_t compare_mask(__m256d a, __m256d b) {
  return static_cast<uint32_t>(_mm256_movemask_pd(_mm256_cmp_pd(a, b, P)));
}

OB_FPS_LANES(F8, float, __m256, 8, _mm256, ps)
OB_FPS_LANES(D4, double, __m256d, 4, _mm256, pd)

}  // namespace

Variant avx2_variant() { return Variant{step<F8, 0>, step<F8, 3>, step<D4, 0>, step<D4, 3>, "avx2"}; }

}  // namespace opbridge::fps

#else

namespace opbridge::fps {
Variant avx2_variant() { return {}; }
}  // namespace opbridge::fps

#endif
