// carafe's row loop on the baseline ISA (float32 and float64), and the choice of variant
// (carafe_variants.h).
#include "carafe_variants.h"

#include <opbridge/cpu.h>

#include "carafe_variant_impl.h"

namespace opbridge::carafe_impl {

Geometry geometry(int64_t n, int64_t c, int64_t h, int64_t w, int64_t kernel_size, int64_t group_size,
                  int64_t scale_factor) {
  return Geometry{n, c, h, w, kernel_size, (kernel_size - 1) / 2, group_size, scale_factor, h * scale_factor,
                  w * scale_factor, c / group_size, group_size * kernel_size * kernel_size};
}

void window_row(const Geometry& g, double* out, const double* in, const double* mask, int64_t plane) {
  add_window_row<double>(g, out, in, mask, plane);
}

Variant baseline_variant() { return Variant{add_window_row<float>, "baseline"}; }

const Variant& best_variant() {
  static const Variant chosen = widest_variant(avx512_variant, avx2_variant, baseline_variant());
  return chosen;
}

}  // namespace opbridge::carafe_impl
