#include "element_types.h"

#include "common.h"

namespace opbridge::run {
namespace {

using npy::DType;

struct TypeMap {
  ONNXTensorElementDataType onnx;
  DType npy;
};
constexpr TypeMap kTypeMap[] = {
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL, DType::Bool},       {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, DType::Int8},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, DType::UInt8},     {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16, DType::Int16},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16, DType::UInt16},   {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, DType::Int32},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32, DType::UInt32},   {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, DType::Int64},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64, DType::UInt64},   {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, DType::Float16},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, DType::Float32},   {ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, DType::Float64},
};

}  // namespace

const DType* npy_type(ONNXTensorElementDataType t) {
  for (const auto& m : kTypeMap)
    if (m.onnx == t) return &m.npy;
  return nullptr;
}

ONNXTensorElementDataType onnx_type(DType t) {
  for (const auto& m : kTypeMap)
    if (m.npy == t) return m.onnx;
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

std::string onnx_type_name(ONNXTensorElementDataType t) {
  if (const DType* d = npy_type(t)) return npy::type_name(*d);
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING: return "string";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX64: return "complex64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_COMPLEX128: return "complex128";
    default: return cat("ONNX element type ", static_cast<int>(t));
  }
}

std::string onnx_kind_name(ONNXType t) {
  switch (t) {
    case ONNX_TYPE_TENSOR: return "tensor";
    case ONNX_TYPE_SEQUENCE: return "sequence";
    case ONNX_TYPE_MAP: return "map";
    case ONNX_TYPE_OPTIONAL: return "optional";
    case ONNX_TYPE_SPARSETENSOR: return "sparse tensor";
    default: return "non-tensor value";
  }
}

}  // namespace opbridge::run
