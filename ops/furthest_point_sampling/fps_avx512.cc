// The pick of furthest point sampling (fps_step_impl.h) for AVX-512: 16 float32 or 8 float64
// lanes. Compiled with -mavx512f -mavx512dq -mavx512vl -mavx512bw by opbridge_add_op_library and
// called only after a CPU check; intrinsics and functions of internal linkage only.
#include "fps_variants.h"

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>

#include "fps_step_impl.h"

// GCC 12 reports a false "may be used uninitialized" inside its own AVX-512 intrinsics.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace opbridge::fps {
namespace {

template <int P>
uint32_t compare_mask(__m512 a, __m512 b) {
  return _mm512_cmp_ps_mask(a, b, P);
}
template <int P>
uint32_t compare_mask(__m512d a, __m512d b) {
  return _mm512_cmp_pd_mask(a, b, P);
}

OB_FPS_LANES(F16, float, __m512, 16, _mm512, ps)
OB_FPS_LANES(D8, double, __m512d, 8, _mm512, pd)

}  // namespace

Variant avx512_variant() { return Variant{step<F16, 0>, step<F16, 3>, step<D8, 0>, step<D8, 3>, "avx512"}; }

}  // namespace opbridge::fps
#pragma GCC diagnostic pop

#else

namespace opbridge::fps {
Variant avx512_variant() { return {}; }
}  // namespace opbridge::fps

#endif
