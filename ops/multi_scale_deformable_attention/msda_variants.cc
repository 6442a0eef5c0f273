// multi_scale_deformable_attention's loops on the baseline ISA (float32 and float64), and the
// choice of variant (msda_variants.h).
#include "msda_variant_impl.h"

#include <opbridge/cpu.h>

namespace opbridge::msda_impl {

void forward_rows(const Geometry& g, const double* value, const double* locations, const double* weights, int64_t b,
                  int64_t q_begin, int64_t q_end, double* output) {
  forward_rows_any<double>(g, value, locations, weights, b, q_begin, q_end, output);
}

void backward_heads(const Geometry& g, const double* grad_output, const double* value, const double* locations,
                    const double* weights, int64_t b, int64_t h_begin, int64_t h_end, double* grad_value,
                    double* grad_locations, double* grad_weights) {
  backward_heads_any<double>(g, grad_output, value, locations, weights, b, h_begin, h_end, grad_value, grad_locations,
                             grad_weights);
}

Variant baseline_variant() { return this_variant("baseline"); }

const Variant& best_variant() {
  static const Variant chosen = widest_variant(avx512_variant, avx2_variant, baseline_variant());
  return chosen;
}

}  // namespace opbridge::msda_impl
