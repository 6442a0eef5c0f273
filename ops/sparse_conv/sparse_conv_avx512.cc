// sparse_indice_conv's hot loops built for AVX-512 (opbridge_add_op_library compiles sources
// named *_avx512.cc with those flags on x86-64 with GCC or Clang); called only after a CPU check
// (best_variant()). Eigen is renamed into a namespace of its own here, as the linker would
// otherwise merge its inline functions with the baseline build's.
#include "sparse_conv_variants.h"

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define Eigen opbridge_eigen_sparse_avx512
#include "sparse_conv_variant_impl.h"
#undef Eigen

namespace opbridge::sparse_conv_impl {
Variant avx512_variant() { return this_variant("avx512"); }
}  // namespace opbridge::sparse_conv_impl
#pragma GCC diagnostic pop

#else

namespace opbridge::sparse_conv_impl {
Variant avx512_variant() { return {}; }
}  // namespace opbridge::sparse_conv_impl

#endif
