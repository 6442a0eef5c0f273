// deform_conv2d's hot loops for the baseline ISA, and the run-time choice among the variants that
// deform_conv2d_variants.h declares.
#include "deform_conv2d_variants.h"

#include <opbridge/cpu.h>

#include "deform_conv2d_variant_impl.h"  // builds the baseline variant here

namespace opbridge::deform_conv2d_impl {

Variant baseline_variant() { return this_variant("baseline"); }

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
