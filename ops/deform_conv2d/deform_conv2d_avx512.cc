// deform_conv2d's hot loops built for AVX-512: opbridge_add_op_library
// (cmake/OpBridgeFunctions.cmake) compiles op sources named *_avx512.cc with -mavx2 -mfma
// -mavx512f -mavx512dq -mavx512vl -mavx512bw on x86-64 with GCC or Clang. Called only after a CPU
// check (best_variant()).
//
// Every inline function this file instantiates is compiled for AVX-512, and the linker merges
// same-named inline functions across object files: so Eigen is renamed into a namespace of its
// own here, the loops have internal linkage, and nothing else that instantiates code is included
// (no static initialisers either).
#include "deform_conv2d_variants.h"

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512VL__) && defined(__AVX512BW__)
// GCC 12 reports a false "may be used uninitialized" inside its own AVX-512 intrinsics as Eigen
// instantiates them.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define Eigen opbridge_eigen_avx512
#include "deform_conv2d_variant_impl.h"
#undef Eigen

namespace opbridge::deform_conv2d_impl {
Variant avx512_variant() { return this_variant("avx512"); }
}  // namespace opbridge::deform_conv2d_impl
#pragma GCC diagnostic pop

#else

namespace opbridge::deform_conv2d_impl {
Variant avx512_variant() { return {}; }
}  // namespace opbridge::deform_conv2d_impl

#endif
