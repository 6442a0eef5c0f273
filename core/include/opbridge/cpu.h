// What the CPU running this process can execute, for kernels that ship hot loops in variants per
// instruction set (sources named *_avx2.cc / *_avx512.cc, built with those flags by
// opbridge_add_op_library) and pick one at run time. False off x86-64 or off GCC/Clang.
#pragma once

namespace opbridge {

bool cpu_has_avx2();    // AVX2 and FMA
bool cpu_has_avx512();  // AVX-512 F, DQ, VL, BW (and AVX2, FMA)

}  // namespace opbridge
