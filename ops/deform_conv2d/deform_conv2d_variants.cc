// deform_conv2d's hot loops for the baseline ISA, and the run-time choice among the variants that
// deform_conv2d_variants.h declares.
#include "deform_conv2d_variants.h"

#include <opbridge/cpu.h>

#include "deform_conv2d_variant_impl.h"  // builds the baseline variant here

namespace opbridge::deform_conv2d_impl {

Variant baseline_variant() { return this_variant("baseline"); }

const Variant& best_variant() {
  static const Variant chosen = widest_variant(avx512_variant, avx2_variant, baseline_variant());
  return chosen;
}

}  // namespace opbridge::deform_conv2d_impl
