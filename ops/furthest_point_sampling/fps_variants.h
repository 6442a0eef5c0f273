// One pick of furthest point sampling over a segment's points laid out in spatial blocks
// (fps_kernel.cc builds the layout), in one variant per instruction set: fps_avx2.cc and
// fps_avx512.cc build fps_step_impl.h with their ISA's vectors (opbridge_add_op_library in
// cmake/OpBridgeFunctions.cmake), fps_kernel.cc builds it with plain scalars and picks one at run
// time. Every variant computes the same values: no FMA, the same order of operations.
#pragma once

#include <cstdint>

namespace opbridge::fps {

// A segment's non-skipped points grouped into blocks of nearby points; C is the compute type.
// Plain pointers only, so that the ISA sources instantiate no library code.
template <typename C>
struct Blocks {
  int64_t dims = 0;
  int64_t stride = 0;  // points, padded: each block starts at a multiple of 16
  int64_t blocks = 0;  // blocks, padded to a multiple of 16 with empty ones
  C* coord = nullptr;  // [dims][stride], coordinate c of position i at c * stride + i
  C* dist = nullptr;   // [stride] running minimum; -inf at padding positions
  const uint64_t* key = nullptr;  // [stride] tie key (the lower wins); ~0 at padding
  const int64_t* begin = nullptr;  // [blocks + 1] first position of each block
  const C* lo = nullptr;  // [dims][blocks] bounding box of each block's points; +inf for an empty block
  const C* hi = nullptr;  // [dims][blocks]; -inf for an empty block
  C* top = nullptr;       // [blocks] the largest running minimum of each block; -inf when empty
  int64_t* best = nullptr;  // [blocks] its position, the lowest key among equals
};

template <typename C>
struct Found {
  C dist;
  int64_t pos;
};

// Lowers the running minima by the distances to point `p` (dims coordinates) and returns the
// largest minimum with its position (ties by key).
template <typename C>
using Step = Found<C> (*)(const Blocks<C>& b, const C* p);

struct Variant {
  Step<float> step_f = nullptr, step3_f = nullptr;  // any number of coordinates, exactly 3
  Step<double> step_d = nullptr, step3_d = nullptr;
  const char* isa = nullptr;  // null: not in this build
};

// Each compiled for its own instruction set: call only on a CPU that has it (cpu_has_avx2() /
// cpu_has_avx512() of <opbridge/cpu.h>). An empty Variant when this build has none.
Variant avx2_variant();
Variant avx512_variant();
Variant scalar_variant();  // every CPU
// The widest variant this build and this CPU run, else the scalar one.
const Variant& best_variant();

}  // namespace opbridge::fps
