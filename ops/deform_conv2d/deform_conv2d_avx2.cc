// deform_conv2d's hot loops built for AVX2+FMA: opbridge_add_op_library
// (cmake/OpBridgeFunctions.cmake) compiles op sources named *_avx2.cc with -mavx2 -mfma on x86-64
// with GCC or Clang. Called only after a CPU check (best_variant()).
//
// Every inline function this file instantiates is compiled for AVX2+FMA, and the linker merges
// same-named inline functions across object files: so Eigen is renamed into a namespace of its
// own here, the loops have internal linkage, and nothing else that instantiates code is included
// (no static initialisers either).
#include "deform_conv2d_variants.h"

#if defined(__AVX2__) && defined(__FMA__)
#define Eigen opbridge_eigen_avx2
#include "deform_conv2d_variant_impl.h"
#undef Eigen

namespace opbridge::deform_conv2d_impl {
Variant avx2_variant() { return this_variant("avx2"); }
}  // namespace opbridge::deform_conv2d_impl

#else

namespace opbridge::deform_conv2d_impl {
Variant avx2_variant() { return {}; }
}  // namespace opbridge::deform_conv2d_impl

#endif
