// multi_scale_deformable_attention's hot loops, in one variant per instruction set: the baseline
// (msda_variants.cc), AVX2+FMA (msda_avx2.cc) and AVX-512 (msda_avx512.cc) builds of the same
// loops (msda_variant_impl.h), each compiled with its own flags by opbridge_add_op_library. The
// kernel (msda_kernel.cc) validates the call and picks the widest variant the CPU runs.
#pragma once

#include <cstdint>

namespace opbridge::msda_impl {

// One call's geometry, read and checked by the kernel. Levels are stored one after another along
// value's S axis: level l is levels_h[l] x levels_w[l] positions from row level_start[l].
struct Geometry {
  int64_t batch, spatial, heads, channels;  // value (B, S, H, D)
  int64_t queries, levels, points;          // sampling_locations (B, Q, H, L, P, 2)
  const int64_t* level_h;
  const int64_t* level_w;
  const int64_t* level_start;
};

// output[b, q, h * D + d] for the queries q in [q_begin, q_end) of batch item b.
template <typename T>
using ForwardRows = void (*)(const Geometry& g, const T* value, const T* locations, const T* weights, int64_t b,
                             int64_t q_begin, int64_t q_end, T* output);

// For batch item b and heads [h_begin, h_end), over every query: grad_value[b, :, h, :] (added to;
// zeroed by the caller), and grad_locations and grad_weights of (b, q, h, ...) (written).
template <typename T>
using BackwardHeads = void (*)(const Geometry& g, const T* grad_output, const T* value, const T* locations,
                               const T* weights, int64_t b, int64_t h_begin, int64_t h_end, T* grad_value,
                               T* grad_locations, T* grad_weights);

struct Variant {
  ForwardRows<float> forward = nullptr;
  BackwardHeads<float> backward = nullptr;
  const char* isa = nullptr;  // null: not in this build
};

// The loops for float64, and for float32 on the baseline ISA.
void forward_rows(const Geometry& g, const double* value, const double* locations, const double* weights, int64_t b,
                  int64_t q_begin, int64_t q_end, double* output);
void backward_heads(const Geometry& g, const double* grad_output, const double* value, const double* locations,
                    const double* weights, int64_t b, int64_t h_begin, int64_t h_end, double* grad_value,
                    double* grad_locations, double* grad_weights);
Variant baseline_variant();
// Each compiled for its own instruction set: call only on a CPU that has it (<opbridge/cpu.h>).
// An empty Variant when this build has none.
Variant avx2_variant();
Variant avx512_variant();
// The widest variant this build and this CPU run (the baseline at least).
const Variant& best_variant();

}  // namespace opbridge::msda_impl
