// multi_scale_deformable_attention's loops built for AVX512 (-mavx512f -mavx512dq -mavx512vl -mavx512bw, given by
// opbridge_add_op_library to sources named *_avx512.cc on x86-64): the same code as the baseline,
// vectorised by the compiler over the channels. Called only after a CPU check (best_variant()).
#include "msda_variants.h"

#if defined(__AVX512F__)
#include "msda_variant_impl.h"

namespace opbridge::msda_impl {
Variant avx512_variant() { return this_variant("avx512"); }
}  // namespace opbridge::msda_impl

#else

namespace opbridge::msda_impl {
Variant avx512_variant() { return {}; }
}  // namespace opbridge::msda_impl

#endif
