// The model's inputs: what the model declares, and the data fed to each (a .npy file or random).
#pragma once

#include <onnxruntime_cxx_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "npy.h"
#include "options.h"

namespace opbridge::run {

struct ModelInput {
  std::string name;
  npy::DType dtype = npy::DType::Float32;
  std::vector<int64_t> dims;      // as declared; -1: dynamic
  std::vector<std::string> syms;  // the dynamic dims' names ("" when unnamed)
  // What is fed:
  std::vector<int64_t> shape;
  std::vector<unsigned char> data;
  std::string source;  // the .npy file, or "random, seed N"
};

// Throws RunError for an input the tool cannot feed: not a tensor, or an element type .npy cannot hold.
std::vector<ModelInput> describe_inputs(Ort::Session& session, OrtAllocator* alloc);

// Binds the --input files and random data to the model's inputs, resolving the symbolic dims: a
// name is one size throughout the model (ONNX's meaning of dim_param), so --dim and every .npy
// must agree on it. Returns the summary's lines on where the dims' sizes came from.
std::vector<std::string> bind_inputs(std::vector<ModelInput>& ins, const Options& o);

}  // namespace opbridge::run
