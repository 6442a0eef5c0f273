// ONNX tensor element types: which ones a .npy file can hold, and their names in messages.
#pragma once

#include <onnxruntime_cxx_api.h>

#include <string>

#include "npy.h"

namespace opbridge::run {

// The .npy type of an ONNX element type, or nullptr for one .npy cannot hold (string, bfloat16, ...).
const npy::DType* npy_type(ONNXTensorElementDataType t);
ONNXTensorElementDataType onnx_type(npy::DType t);

std::string onnx_type_name(ONNXTensorElementDataType t);  // NumPy's name where there is one
std::string onnx_kind_name(ONNXType t);                   // "tensor", "sequence", ...

}  // namespace opbridge::run
