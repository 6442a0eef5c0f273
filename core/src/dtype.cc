#include "opbridge/dtype.h"

#include "opbridge/tensor_view.h"

#include <algorithm>
#include <limits>

namespace opbridge {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Bool: return "bool";
    case DType::UInt8: return "uint8";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int8: return "int8";
    case DType::Int16: return "int16";
  }
  return "?";
}

std::string_view dtype_onnx_tensor_type(DType t) {
  switch (t) {
    case DType::Float32: return "tensor(float)";
    case DType::Float64: return "tensor(double)";
    case DType::Int32: return "tensor(int32)";
    case DType::Int64: return "tensor(int64)";
    case DType::Bool: return "tensor(bool)";
    case DType::UInt8: return "tensor(uint8)";
    case DType::Float16: return "tensor(float16)";
    case DType::BFloat16: return "tensor(bfloat16)";
    case DType::Int8: return "tensor(int8)";
    case DType::Int16: return "tensor(int16)";
  }
  return "?";
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32: case DType::Int32: return 4;
    case DType::Float64: case DType::Int64: return 8;
    case DType::Bool: case DType::UInt8: case DType::Int8: return 1;
    case DType::Float16: case DType::BFloat16: case DType::Int16: return 2;
  }
  return 0;
}

int64_t TensorView::numel() const {
  for (int64_t d : shape)
    if (d == 0) return 0;  // empty, whatever the other sizes
  int64_t n = 1;
  for (int64_t d : shape)
    OB_CHECK(!__builtin_mul_overflow(n, d, &n), "a tensor of shape ", shape_str(shape), " has more elements than int64 holds");
  return n;
}


void TensorView::check_type(DType t) const {
  OB_CHECK(t == dtype, "kernel reads a ", dtype_name(dtype), " tensor as ", dtype_name(t));
}

void contiguous_strides(const Shape& shape, Shape& s) {
  // An empty tensor may have dimensions whose product exceeds int64; its strides are never used
  // to address memory, so they saturate instead of overflowing. A non-empty tensor's product
  // fits (its bytes were allocated).
  s.assign(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) {
    int64_t next = 0;
    if (__builtin_mul_overflow(s[i], std::max<int64_t>(shape[i], 1), &next)) next = std::numeric_limits<int64_t>::max();
    s[i - 1] = next;
  }
}

Shape contiguous_strides(const Shape& shape) {
  Shape s;
  contiguous_strides(shape, s);
  return s;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace opbridge
