// Element types an opbridge kernel can see. The set is the intersection that PyTorch, ONNX and
// ONNX Runtime all name the same way; adapters translate to and from their own enums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "opbridge/half.h"

namespace opbridge {

enum class DType : int8_t { Float32, Float64, Int32, Int64, Bool, UInt8, Float16, BFloat16, Int8, Int16 };

inline constexpr DType kAllDTypes[] = {DType::Float32, DType::Float64,  DType::Int32, DType::Int64, DType::Bool,
                                       DType::UInt8,   DType::Float16, DType::BFloat16, DType::Int8, DType::Int16};

// "float32", "int64", ... (the names numpy and torch print).
std::string_view dtype_name(DType t);
// ONNX's spelling in type constraints: "tensor(float)", "tensor(int64)", ...
std::string_view dtype_onnx_tensor_type(DType t);
size_t dtype_size(DType t);

template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::Float32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::Float64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::Int32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::Bool; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::UInt8; };
template <> struct DTypeOf<Float16> { static constexpr DType value = DType::Float16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::BFloat16; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::Int8; };
template <> struct DTypeOf<int16_t> { static constexpr DType value = DType::Int16; };

// Calls f(T{}) for the C++ type T of `t`, restricted to Ts. A dtype outside Ts means the op's
// type constraints and its kernel disagree, which validation makes unreachable; it throws.
template <typename... Ts, typename F>
void visit_dtype(DType t, F&& f);

}  // namespace opbridge

#include "opbridge/error.h"

namespace opbridge {
template <typename... Ts, typename F>
void visit_dtype(DType t, F&& f) {
  bool done = ((DTypeOf<Ts>::value == t ? (f(Ts{}), true) : false) || ...);
  if (!done) throw Error(std::string("kernel has no instantiation for dtype ") + std::string(dtype_name(t)));
}
}  // namespace opbridge
