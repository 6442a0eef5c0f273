// carafe's row loop built for AVX512 (-mavx512f -mavx512dq -mavx512vl -mavx512bw, given by opbridge_add_op_library to sources
// named *_avx512.cc on x86-64): the same code as the baseline, vectorised by the compiler over the
// output row. Called only after a CPU check (best_variant()).
#include "carafe_variants.h"

#if defined(__AVX512F__)
#include "carafe_variant_impl.h"

namespace opbridge::carafe_impl {
Variant avx512_variant() { return Variant{add_window_row<float>, "avx512"}; }
}  // namespace opbridge::carafe_impl

#else

namespace opbridge::carafe_impl {
Variant avx512_variant() { return {}; }
}  // namespace opbridge::carafe_impl

#endif
