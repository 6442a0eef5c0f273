// The k = 1 leaf scan of knn_query's kernel in one variant per instruction set: knn_leaf_avx2.cc
// and knn_leaf_avx512.cc hold the vector ones (built with their ISA's flags by
// opbridge_add_op_library in cmake/OpBridgeFunctions.cmake), knn_query_kernel.cc the plain one and
// the run-time pick. Every variant computes the same values: (dx*dx + dy*dy) + dz*dz with each
// product rounded (no FMA), the same key.
#pragma once

#include <cstdint>

namespace opbridge::knn_leaf {

// The smallest key (squared distance's bits << 32 | index) among the len <= 32 points (x, y, z,
// idx)[0, len) from the float32 query q: the smallest distance, then the smallest index at it.
// Squared distances are never negative, so their bit patterns order like the values.
using NearestInLeaf = uint64_t (*)(const float* x, const float* y, const float* z, const int32_t* idx, int len,
                                   const float* q);

struct Variant {
  NearestInLeaf nearest_f = nullptr;
  const char* isa = nullptr;  // null: not in this build
};

// Each compiled for its own instruction set: call only on a CPU that has it (cpu_has_avx2() /
// cpu_has_avx512() of <opbridge/cpu.h>). An empty Variant when this build has none.
Variant avx2_variant();
Variant avx512_variant();
Variant scalar_variant();  // every CPU
// The widest variant this build and this CPU run, else the scalar one.
const Variant& best_variant();

}  // namespace opbridge::knn_leaf
