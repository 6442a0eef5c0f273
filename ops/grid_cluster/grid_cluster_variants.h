// grid_cluster's cluster pass for float32 positions in 2 or 3 dimensions, in one variant per
// instruction set: sixteen (AVX-512) or eight (AVX2) rows at a time, deinterleaved into one
// register per coordinate, so the quotients, their conversion and the int64 index sum are all
// vector operations. grid_cluster_avx2.cc and grid_cluster_avx512.cc build them with their ISA's
// flags (opbridge_add_op_library in cmake/OpBridgeFunctions.cmake); grid_cluster_kernel.cc picks
// one at run time and takes every row they leave (a quotient out of the fast-path range: NaN,
// infinite, far outside the grid; and the last rows of a range) on its exact baseline path.
#pragma once

#include <cstdint>

namespace opbridge::grid_cluster_impl {

// The grid as the vector loops read it, per dimension j < d (d = 2 or 3).
struct FastGrid {
  float start[3], size[3];
  // Quotients q with -bound < q < bound make no int64 overflow in the index (see Grid::bound in
  // grid_cluster_kernel.cc); bound32 = min(bound, 2^31) also fits int32.
  float bound[3], bound32[3];
  int64_t stride[3];
};

// Cluster indices out[r] of rows r in [b, e) of pos (d float32 columns): the same
// subtract-then-divide in float32 as the baseline, hence bit-exact. Stops at the first group of
// rows (16 or 8) with a quotient outside the range it handles, or when fewer than a group are
// left; returns the first row it did not write.
using FastRows = int64_t (*)(const float* pos, int64_t b, int64_t e, const FastGrid& g, int64_t* out);

struct Variant {
  FastRows rows2 = nullptr, rows3 = nullptr;  // d = 2, d = 3
  const char* isa = nullptr;                  // null: not in this build
};

// Each compiled for its own instruction set: call only on a CPU that has it (cpu_has_avx2() /
// cpu_has_avx512() of <opbridge/cpu.h>). An empty Variant when this build has none.
Variant avx2_variant();
Variant avx512_variant();
// The widest variant this build and this CPU run; an empty one on other CPUs.
const Variant& best_variant();

}  // namespace opbridge::grid_cluster_impl
