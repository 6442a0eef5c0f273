#include "inputs.h"

#include <cstdint>
#include <map>
#include <new>
#include <random>
#include <set>

#include "common.h"
#include "element_types.h"
#include "random_data.h"

namespace opbridge::run {
namespace {

// The size of a symbolic dim and where it came from: "--dim", a .npy file, or the default 1.
struct DimSize {
  int64_t value = 1;
  std::string from;
  bool defaulted = false;
};
using DimSizes = std::map<std::string, DimSize>;

std::string input_names(const std::vector<ModelInput>& ins) {
  std::vector<std::string> names;
  for (const auto& in : ins) names.push_back(in.name);
  return names.empty() ? "none" : join(names, ", ");
}

DimSizes sizes_from_command_line(const std::vector<ModelInput>& ins, const Options& o) {
  std::set<std::string> names;
  for (const auto& in : ins)
    for (size_t k = 0; k < in.dims.size(); ++k)
      if (in.dims[k] < 0 && !in.syms[k].empty()) names.insert(in.syms[k]);
  DimSizes sizes;
  for (const auto& [name, value] : o.dims) {
    if (!names.count(name))
      throw UsageError(cat("--dim ", name, ": the model has no symbolic dimension '", name, "' (it has: ",
                           names.empty() ? "none" : join(names, ", "), ")"));
    sizes[name] = {value, "--dim"};
  }
  return sizes;
}

// A .npy's shape against the declared one; the sizes of symbolic dims are recorded in `sizes`,
// or checked against it.
void check_shape(const ModelInput& in, const std::string& file, const std::vector<int64_t>& shape, DimSizes& sizes) {
  // A model input without any shape information reads as rank 0 here; ONNX Runtime checks those.
  if (in.dims.empty()) return;
  const std::string has = cat("--input ", in.name, ": ", file, " has ");
  if (shape.size() != in.dims.size())
    throw RunError(cat(has, "shape ", shape_str(shape), " (rank ", shape.size(), "), the model input has rank ",
                       in.dims.size()));
  for (size_t k = 0; k < in.dims.size(); ++k) {
    if (in.dims[k] >= 0 && in.dims[k] != shape[k])
      throw RunError(cat(has, "shape ", shape_str(shape), ", the model input needs ", in.dims[k], " in axis ", k));
    if (in.dims[k] >= 0 || in.syms[k].empty()) continue;
    const auto [known, fresh] = sizes.emplace(in.syms[k], DimSize{shape[k], file});
    if (!fresh && known->second.value != shape[k])
      throw RunError(cat(has, shape[k], " in axis ", k, " ('", in.syms[k], "'), but ", known->second.from, " gives ",
                         in.syms[k], "=", known->second.value));
  }
}

void load_npy_input(ModelInput& in, const std::string& file, DimSizes& sizes) {
  npy::Array a;
  try {
    a = npy::load(file);
  } catch (const npy::Error& e) {
    throw RunError(cat("--input ", in.name, ": ", e.what()));
  }
  if (a.dtype != in.dtype)
    throw RunError(cat("--input ", in.name, ": ", file, " holds ", npy::type_name(a.dtype), ", the model input is ",
                       npy::type_name(in.dtype)));
  check_shape(in, file, a.shape, sizes);
  in.shape = a.shape;
  in.data = std::move(a.data);
  in.source = file;
}

void load_npy_inputs(std::vector<ModelInput>& ins, const Options& o, DimSizes& sizes) {
  std::map<std::string, ModelInput*> by_name;
  for (auto& in : ins) by_name[in.name] = &in;
  for (const auto& [name, file] : o.inputs) {
    const auto it = by_name.find(name);
    if (it == by_name.end())
      throw RunError(cat("--input ", name, ": the model has no input '", name, "' (its inputs: ", input_names(ins), ")"));
    load_npy_input(*it->second, file, sizes);
  }
}

// A random input's shape: a symbolic dim takes its size from `sizes`, else 1 (recorded there as
// the default); an unnamed dynamic dim is 1, which `notes` tells.
std::vector<int64_t> random_shape(const ModelInput& in, DimSizes& sizes, std::vector<std::string>& notes) {
  std::vector<int64_t> shape = in.dims;
  for (size_t k = 0; k < in.dims.size(); ++k) {
    if (in.dims[k] >= 0) continue;
    if (in.syms[k].empty()) {
      shape[k] = 1;
      notes.push_back(cat("axis ", k, " of '", in.name, "' is dynamic and unnamed: 1 (feed a .npy to choose)"));
    } else {
      shape[k] = sizes.emplace(in.syms[k], DimSize{1, "default", true}).first->second.value;
    }
  }
  return shape;
}

void fill_random_input(ModelInput& in, std::mt19937_64& gen) {
  const int64_t n = npy::checked_numel(in.shape);
  const size_t item = npy::itemsize(in.dtype);
  if (n < 0 || static_cast<uint64_t>(n) > SIZE_MAX / item)
    throw RunError(cat("input '", in.name, "' of shape ", shape_str(in.shape), " is too large"));
  try {
    in.data.resize(static_cast<size_t>(n) * item);
  } catch (const std::bad_alloc&) {
    throw RunError(cat("input '", in.name, "' of shape ", shape_str(in.shape), " needs ", static_cast<uint64_t>(n) * item,
                       " bytes: out of memory"));
  }
  fill_random(in.dtype, in.data.data(), n, gen);
}

}  // namespace

std::vector<ModelInput> describe_inputs(Ort::Session& session, OrtAllocator* alloc) {
  std::vector<ModelInput> ins(session.GetInputCount());
  for (size_t i = 0; i < ins.size(); ++i) {
    ModelInput& in = ins[i];
    in.name = session.GetInputNameAllocated(i, alloc).get();
    const Ort::TypeInfo info = session.GetInputTypeInfo(i);
    if (info.GetONNXType() != ONNX_TYPE_TENSOR)
      throw RunError(cat("model input '", in.name, "' is a ", onnx_kind_name(info.GetONNXType()),
                         "; opbridge-run feeds tensors only"));
    const auto t = info.GetTensorTypeAndShapeInfo();
    const npy::DType* d = npy_type(t.GetElementType());
    if (!d)
      throw RunError(cat("model input '", in.name, "' has element type ", onnx_type_name(t.GetElementType()),
                         ", which opbridge-run cannot feed"));
    in.dtype = *d;
    in.dims = t.GetShape();
    for (const char* s : t.GetSymbolicDimensions()) in.syms.emplace_back(s ? s : "");
    in.syms.resize(in.dims.size());
  }
  return ins;
}

std::vector<std::string> bind_inputs(std::vector<ModelInput>& ins, const Options& o) {
  DimSizes sizes = sizes_from_command_line(ins, o);
  load_npy_inputs(ins, o, sizes);
  std::vector<std::string> notes;
  // One generator drawn input by input in the model's order, so that a seed gives the same data.
  std::mt19937_64 gen(o.seed);
  for (auto& in : ins) {
    if (!in.source.empty()) continue;
    if (!o.random)
      throw RunError(cat("model input '", in.name, "' has no data: pass --input ", in.name, "=FILE.npy or --random"));
    in.shape = random_shape(in, sizes, notes);
    fill_random_input(in, gen);
    in.source = cat("random, seed ", o.seed);
  }
  std::vector<std::string> lines;
  for (const auto& [name, size] : sizes)
    lines.push_back(size.defaulted ? cat(name, "=1 (default; set it with --dim ", name, "=N)")
                                   : cat(name, "=", size.value, " (from ", size.from, ")"));
  lines.insert(lines.end(), notes.begin(), notes.end());
  return lines;
}

}  // namespace opbridge::run
