// 16-bit floating-point storage types: IEEE binary16 (float16) and bfloat16. Kernels load them
// into float, compute in float (what PyTorch's CPU kernels do for these types) and round once
// when storing, to nearest, ties to even, as PyTorch and ONNX Runtime convert.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace opbridge {

struct Float16 {
  uint16_t bits = 0;
};
struct BFloat16 {
  uint16_t bits = 0;
};

namespace detail {
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace detail

inline float to_float(Float16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu, mant = h.bits & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return detail::bits_float(detail::float_bits(v) | sign);
  }
  if (exp == 31) return detail::bits_float(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  return detail::bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline Float16 to_float16(float f) {
  const uint32_t x = detail::float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u)  // inf stays inf; NaN stays a quiet NaN with its top payload bits
    return {static_cast<uint16_t>(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0u))};
  if (a >= 0x477ff000u) return {static_cast<uint16_t>(sign | 0x7c00u)};  // >= 65520 rounds to inf
  if (a < 0x38800000u) {
    // Below the smallest normal (2^-14): adding 0.5 leaves the value in float's last 2^-24
    // places, so the FPU does the round to nearest even; the bits beyond 0.5 are the result.
    const float shifted = detail::bits_float(a) + 0.5f;
    return {static_cast<uint16_t>(sign | (detail::float_bits(shifted) - 0x3f000000u))};
  }
  a += 0xfffu + ((a >> 13) & 1u);  // round to nearest even on the 13 dropped bits
  return {static_cast<uint16_t>(sign | ((a - (112u << 23)) >> 13))};
}

inline float to_float(BFloat16 b) { return detail::bits_float(static_cast<uint32_t>(b.bits) << 16); }

inline BFloat16 to_bfloat16(float f) {
  uint32_t x = detail::float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((x >> 16) | 0x40u)};  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return {static_cast<uint16_t>(x >> 16)};
}

// The type a kernel computes in for storage type T (float for the 16-bit floats), and the
// conversions in and out of it: `widen(v)` loads, `narrow<T>(c)` stores.
template <typename T>
using compute_t = std::conditional_t<std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>, float, T>;

template <typename T>
inline compute_t<T> widen(T v) {
  if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) return to_float(v);
  else return v;
}

template <typename T>
inline T narrow(compute_t<T> c) {
  if constexpr (std::is_same_v<T, Float16>) return to_float16(c);
  else if constexpr (std::is_same_v<T, BFloat16>) return to_bfloat16(c);
  else return c;
}

}  // namespace opbridge
