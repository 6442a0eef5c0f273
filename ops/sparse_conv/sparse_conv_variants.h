// sparse_indice_conv's hot loops — a kernel offset's gather, GEMM and scatter-add, and its filter
// gradient — in one variant per instruction set. The rest of the build targets the baseline ISA
// (x86-64: SSE2), where a GEMM runs at a fraction of its AVX2/AVX-512 speed, so
// sparse_conv_avx2.cc and sparse_conv_avx512.cc build the same code (sparse_conv_variant_impl.h)
// for those and best_variant() picks one at run time; sparse_conv_variants.cc builds the baseline.
// This header only declares (no Eigen), so the tests can call every variant.
#pragma once

#include <cstdint>

namespace opbridge::sparse_conv_impl {

template <typename T>
struct Kernels {
  // out[to[i]] += x[from[i]] · w for i < n, w (cin × cout) row-major; rows of x and out are cin and
  // cout apart. A null `from` or `to` means row i itself (a submanifold convolution's centre).
  // Each row of `to` appears once (the caller splits one offset's pairs across threads).
  void (*gather_gemm_scatter)(const T* x, const int32_t* from, const T* w, T* out, const int32_t* to, int64_t n,
                              int64_t cin, int64_t cout) = nullptr;
  // acc (cin × cout, row-major) += x[from]ᵀ · g[to] over i < n.
  void (*weight_grad)(const T* x, const int32_t* from, const T* g, const int32_t* to, T* acc, int64_t n, int64_t cin,
                      int64_t cout) = nullptr;
};

struct Variant {
  Kernels<float> f32;
  Kernels<double> f64;
  const char* isa = nullptr;  // null: not in this build
};

Variant baseline_variant();
// Each compiled for its own instruction set: call only on a CPU that has it (<opbridge/cpu.h>).
// An empty Variant when this build has none (not x86-64, or not GCC/Clang).
Variant avx2_variant();
Variant avx512_variant();
// The fastest variant this build and this CPU can run.
const Variant& best_variant();

template <typename T>
const Kernels<T>& kernels(const Variant& v);
template <>
inline const Kernels<float>& kernels<float>(const Variant& v) { return v.f32; }
template <>
inline const Kernels<double>& kernels<double>(const Variant& v) { return v.f64; }

}  // namespace opbridge::sparse_conv_impl
