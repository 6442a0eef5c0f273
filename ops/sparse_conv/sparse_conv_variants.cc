// sparse_indice_conv's hot loops for the baseline ISA, and the run-time choice among the variants
// that sparse_conv_variants.h declares.
#include "sparse_conv_variants.h"

#include <opbridge/cpu.h>

#include "sparse_conv_variant_impl.h"  // builds the baseline variant here

namespace opbridge::sparse_conv_impl {

Variant baseline_variant() { return this_variant("baseline"); }

const Variant& best_variant() {
  static const Variant chosen = widest_variant(avx512_variant, avx2_variant, baseline_variant());
  return chosen;
}

}  // namespace opbridge::sparse_conv_impl
