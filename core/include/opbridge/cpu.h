// What the CPU running this process can execute, for kernels that ship hot loops in variants per
// instruction set (sources named *_avx2.cc / *_avx512.cc, built with those flags by
// opbridge_add_op_library) and pick one at run time. False off x86-64 or off GCC/Clang.
#pragma once

namespace opbridge {

bool cpu_has_avx2();    // AVX2 and FMA
bool cpu_has_avx512();  // AVX-512 F, DQ, VL, BW (and AVX2, FMA)

// The widest variant this CPU runs and this build has (a Variant whose `isa` is set): the
// AVX-512 one, else the AVX2 one, else `fallback`. The CPU check comes first: the *_variant()
// functions are themselves compiled for their instruction set.
template <typename Variant>
Variant widest_variant(Variant (*avx512)(), Variant (*avx2)(), Variant fallback) {
  if (cpu_has_avx512())
    if (Variant v = avx512(); v.isa) return v;
  if (cpu_has_avx2())
    if (Variant v = avx2(); v.isa) return v;
  return fallback;
}

}  // namespace opbridge
