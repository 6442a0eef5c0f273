// carafe's forward row loop, in one variant per instruction set: the baseline
// (carafe_variants.cc), AVX2+FMA (carafe_avx2.cc) and AVX-512 (carafe_avx512.cc) builds of the same
// loop (carafe_variant_impl.h), each compiled with its own flags by opbridge_add_op_library. The
// kernel (carafe_kernel.cc) picks the widest variant the CPU runs.
#pragma once

#include <cstdint>

namespace opbridge::carafe_impl {

// One call's sizes (plain data: its helpers live in carafe_variant_impl.h, compiled per variant).
struct Geometry {
  int64_t n, c, h, w;      // features (N, C, H, W)
  int64_t k, r, groups, s;  // kernel_size, (k - 1) / 2, group_size, scale_factor
  int64_t ho, wo;          // H * s, W * s
  int64_t group_channels, mask_channels;
};

Geometry geometry(int64_t n, int64_t c, int64_t h, int64_t w, int64_t kernel_size, int64_t group_size,
                  int64_t scale_factor);

// Adds one window row (fixed ky) to an output row: out[ox] += sum over kx of
// in[ox + (kx - r) * s] * mask[kx * plane + ox], for the columns whose input is inside the image.
// `in` is the input row repeated s times along the width; `mask` the row of window column 0.
template <typename T>
using WindowRow = void (*)(const Geometry& g, T* out, const T* in, const T* mask, int64_t plane);

struct Variant {
  WindowRow<float> window_row = nullptr;
  const char* isa = nullptr;  // null: not in this build
};

// The loop for float64, and for float32 on the baseline ISA.
void window_row(const Geometry& g, double* out, const double* in, const double* mask, int64_t plane);
Variant baseline_variant();
// Each compiled for its own instruction set: call only on a CPU that has it (<opbridge/cpu.h>).
// An empty Variant when this build has none.
Variant avx2_variant();
Variant avx512_variant();
// The widest variant this build and this CPU run (the baseline at least).
const Variant& best_variant();

}  // namespace opbridge::carafe_impl
