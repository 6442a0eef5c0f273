// carafe's row loop built for AVX2 (-mavx2 -mfma, given by opbridge_add_op_library to sources
// named *_avx2.cc on x86-64): the same code as the baseline, vectorised by the compiler over the
// output row. Called only after a CPU check (best_variant()).
#include "carafe_variants.h"

#if defined(__AVX2__) && defined(__FMA__)
#include "carafe_variant_impl.h"

namespace opbridge::carafe_impl {
Variant avx2_variant() { return Variant{add_window_row<float>, "avx2"}; }
}  // namespace opbridge::carafe_impl

#else

namespace opbridge::carafe_impl {
Variant avx2_variant() { return {}; }
}  // namespace opbridge::carafe_impl

#endif
