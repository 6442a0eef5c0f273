// deform_conv2d's hot loops for the baseline ISA, and the run-time choice among the variants that
// deform_conv2d_variants.h declares.
#include "deform_conv2d_variants.h"

#include "deform_conv2d_variant_impl.h"  // builds the baseline variant here

namespace opbridge::deform_conv2d_impl {

Variant baseline_variant() { return this_variant("baseline"); }

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
bool cpu_has_avx512() {
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
}
#else
bool cpu_has_avx2() { return false; }
bool cpu_has_avx512() { return false; }
#endif

const Variant& best_variant() {
  static const Variant chosen = [] {
    // The CPU check comes first: the *_variant() functions are themselves compiled for their ISA.
    if (cpu_has_avx512())
      if (Variant v = avx512_variant(); v.isa) return v;
    if (cpu_has_avx2())
      if (Variant v = avx2_variant(); v.isa) return v;
    return baseline_variant();
  }();
  return chosen;
}

}  // namespace opbridge::deform_conv2d_impl
