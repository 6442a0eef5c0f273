#include "random_data.h"

#include <onnxruntime_cxx_api.h>

#include <cmath>
#include <type_traits>

namespace opbridge::run {
namespace {

// Uniform in [-1, 1) on a grid the type represents exactly (2^-(bits-1) steps), so rounding can
// never produce 1. mt19937_64 is fully specified, so a seed gives the same data everywhere.
double uniform_pm1(std::mt19937_64& g, int bits) {
  return std::ldexp(static_cast<double>(g() >> (64 - bits)), 1 - bits) - 1.0;
}

template <typename T>
void fill_ints(unsigned char* p, int64_t n, std::mt19937_64& g) {
  auto* out = reinterpret_cast<T*>(p);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(g() % kRandomIntRange);
}

// `bits`: the significand's precision, the sign excluded (11 for float16, 24 for float, 53 for double).
template <typename T>
void fill_floats(unsigned char* p, int64_t n, std::mt19937_64& g, int bits) {
  auto* out = reinterpret_cast<T*>(p);
  for (int64_t i = 0; i < n; ++i) out[i] = T(static_cast<float>(uniform_pm1(g, bits)));
}

}  // namespace

void fill_random(npy::DType t, unsigned char* p, int64_t n, std::mt19937_64& g) {
  using npy::DType;
  switch (t) {
    case DType::Bool:
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(g() >> 63);
      break;
    case DType::Int8: fill_ints<int8_t>(p, n, g); break;
    case DType::UInt8: fill_ints<uint8_t>(p, n, g); break;
    case DType::Int16: fill_ints<int16_t>(p, n, g); break;
    case DType::UInt16: fill_ints<uint16_t>(p, n, g); break;
    case DType::Int32: fill_ints<int32_t>(p, n, g); break;
    case DType::UInt32: fill_ints<uint32_t>(p, n, g); break;
    case DType::Int64: fill_ints<int64_t>(p, n, g); break;
    case DType::UInt64: fill_ints<uint64_t>(p, n, g); break;
    case DType::Float16: fill_floats<Ort::Float16_t>(p, n, g, 11); break;
    case DType::Float32: fill_floats<float>(p, n, g, 24); break;
    case DType::Float64: {
      auto* out = reinterpret_cast<double*>(p);
      for (int64_t i = 0; i < n; ++i) out[i] = uniform_pm1(g, 53);
      break;
    }
  }
}

}  // namespace opbridge::run
