#include "fuzz_run.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include <onnxruntime_cxx_api.h>

#include <opbridge/prepare.h>
#include <opbridge/registry.h>
#include <opbridge/testing/kernel_harness.h>

namespace opbridge::fuzz {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ONNX Runtime's own refusals at session creation, which come before any opbridge code runs:
// wrong dtypes (no registration of the op for them) and wrong input/output counts.
bool ort_own_create_error(const std::string& msg) {
  for (const char* p : {"Type Error", "not in range", "is marked single but has an empty string",
                        "Could not find an implementation", "bound to different types"})
    if (contains(msg, p)) return true;
  return false;
}

// A failure to allocate memory (ONNX Runtime's allocator or the kernel's own): the expected end
// of a call whose outputs or scratch cannot fit, not something the kernel harness should repeat.
bool allocation_error(const std::string& msg) {
  for (const char* p : {"bad_alloc", "Failed to allocate", "failed to allocate", "std::length_error", "vector::_M"})
    if (contains(msg, p)) return true;
  return false;
}

Outcome result() { return {Outcome::Kind::Result, {}}; }
Outcome expected(std::string m) { return {Outcome::Kind::ExpectedError, std::move(m)}; }
Outcome failure(std::string m) { return {Outcome::Kind::Failure, std::move(m)}; }

std::string value_at(DType t, const void* p, int64_t i) {
  std::ostringstream os;
  os.precision(17);
  switch (t) {
    case DType::Float32: os << static_cast<const float*>(p)[i]; break;
    case DType::Float64: os << static_cast<const double*>(p)[i]; break;
    case DType::Int32: os << static_cast<const int32_t*>(p)[i]; break;
    case DType::Int64: os << static_cast<const int64_t*>(p)[i]; break;
    case DType::Bool: case DType::UInt8: os << int(static_cast<const uint8_t*>(p)[i]); break;
    case DType::Float16: os << to_float(static_cast<const Float16*>(p)[i]); break;
    case DType::BFloat16: os << to_float(static_cast<const BFloat16*>(p)[i]); break;
    case DType::Int8: os << int(static_cast<const int8_t*>(p)[i]); break;
    case DType::Int16: os << static_cast<const int16_t*>(p)[i]; break;
  }
  return os.str();
}

// Row-major strides, wrapping instead of overflowing: the driver's own views must not be where
// an empty tensor with huge dimensions trips UndefinedBehaviorSanitizer (the kernels read none).
Shape wrapping_strides(const Shape& shape) {
  Shape s(shape.size(), 1);
  uint64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = static_cast<int64_t>(acc);
    acc *= static_cast<uint64_t>(std::max<int64_t>(shape[i], 1));
  }
  return s;
}

// The op draws random numbers in this call (OpSpec::random_when): its values are not comparable.
bool random_outputs(const OpSpec& op, const std::vector<AttrValue>& attrs) {
  const int a = op.random_when.empty() ? -1 : op.attr_index(op.random_when);
  return a >= 0 && std::get<bool>(attrs[static_cast<size_t>(a)]);
}

bool shape_fits(const Shape& actual, const Shape& rule) {
  if (actual.size() != rule.size()) return false;
  for (size_t d = 0; d < rule.size(); ++d)
    if (rule[d] != kDataDependentDim && rule[d] != actual[d]) return false;
  return true;
}

}  // namespace

struct Runner::Impl {
  Ort::Env env;
  Ort::SessionOptions options;
  Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);

  static Ort::ThreadingOptions threading(int threads) {
    Ort::ThreadingOptions t;
    t.SetGlobalIntraOpNumThreads(threads);
    t.SetGlobalInterOpNumThreads(1);
    return t;
  }
  std::string library;

  Impl(const std::string& lib, int threads)
      : env(threading(threads), ORT_LOGGING_LEVEL_FATAL, "opbridge_fuzz"), options(nullptr), library(lib) {
    reload();
  }
  void reload() {
    options = Ort::SessionOptions(nullptr);  // releases the old options (and the library) first
    options = Ort::SessionOptions();
    options.DisablePerSessionThreads();  // the global pool: no threads created per case
    // No arena and no memory patterns: every tensor is its own heap block, so AddressSanitizer
    // sees a kernel that writes past an output.
    options.DisableCpuMemArena();
    options.DisableMemPattern();
    options.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_DISABLE_ALL);
    options.RegisterCustomOpsLibrary(library.c_str());
  }

  Outcome run(const Case& c);
  Outcome judge_result(const Case& c, std::vector<Ort::Value>& outs, const std::vector<const TensorView*>& views,
                       const std::vector<AttrValue>& attrs, const std::map<std::string, AttrValue>& given);
  Outcome judge_error(const Case& c, const std::string& msg, const std::string& spec_error,
                      const std::vector<const TensorView*>& views, const std::map<std::string, AttrValue>& given);
};

Runner::Runner(const std::string& library, int threads) : impl_(std::make_unique<Impl>(library, threads)) {}
Runner::~Runner() = default;
Outcome Runner::run(const Case& c) { return impl_->run(c); }
void Runner::reload() { impl_->reload(); }

Outcome Runner::Impl::run(const Case& c) {
  const OpSpec& op = *c.op;
  const std::string name = op.qualified_name();
  const OnnxNodeModel m = c.model();
  const std::string bytes = serialize(m);

  // What the adapter will make of the node's attributes.
  ReadAttrs read = read_attrs(c);
  std::string attr_error = read.error;
  std::vector<AttrValue> attrs;
  if (attr_error.empty()) {
    std::vector<std::optional<AttrValue>> given;
    for (const AttrSpec& a : op.attrs) {
      auto it = read.given.find(a.name);
      given.push_back(it == read.given.end() ? std::nullopt : std::optional<AttrValue>(it->second));
    }
    try {
      attrs = resolve_attrs(op, given);
    } catch (const Error& e) {
      attr_error = e.what();
    }
  }

  std::unique_ptr<Ort::Session> session;
  try {
    session = std::make_unique<Ort::Session>(env, bytes.data(), bytes.size(), options);
  } catch (const Ort::Exception& e) {
    const std::string msg = e.what();
    if (contains(msg, name) && (!attr_error.empty() || c.structural)) return expected(msg);
    if (c.structural && ort_own_create_error(msg)) return expected(msg);
    return failure("session creation failed" + std::string(attr_error.empty() ? " (the attributes are valid)" : "") +
                   ": " + msg);
  }
  if (!attr_error.empty())
    return failure("session creation accepted the node, but its attributes are not what the spec reads (" +
                   attr_error + ")");

  // The kernel's view of the inputs: the node's inputs by position, absent beyond its count.
  std::vector<TensorView> view_store(op.inputs.size());
  std::vector<const TensorView*> views(op.inputs.size(), nullptr);
  std::vector<Ort::Value> values;
  std::vector<std::string> names;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const InputCase& t = c.inputs[i];
    if (!t.present || (c.drop_trailing_omitted && i >= m.node_inputs.size())) continue;
    try {
      values.push_back(Ort::Value::CreateTensor(cpu, t.data.get(), t.nbytes, t.shape.data(), t.shape.size(),
                                                static_cast<ONNXTensorElementDataType>(t.onnx_type)));
    } catch (const Ort::Exception& e) {  // e.g. a size product that overflows: ONNX Runtime's limit, not ours
      return expected(std::string("ONNX Runtime cannot hold input ") + std::to_string(i) + " (" + e.what() + ")");
    }
    names.push_back("in" + std::to_string(i));
    if (i < op.inputs.size()) {
      std::optional<DType> d = dtype_of_onnx(t.onnx_type);
      if (!d) return failure("session creation accepted input '" + op.inputs[i].name + "' of type " + onnx_type_name(t.onnx_type));
      view_store[i] = TensorView{t.data.get(), *d, t.shape, wrapping_strides(t.shape)};
      views[i] = &view_store[i];
    }
  }
  std::vector<const char*> in_names, out_names;
  for (const std::string& s : names) in_names.push_back(s.c_str());
  for (const std::string& s : m.node_outputs) out_names.push_back(s.c_str());

  std::string spec_error;
  try {
    prepare_call(op, views, attrs);
  } catch (const Error& e) {
    spec_error = e.what();
  }

  std::vector<Ort::Value> outs;
  try {
    outs = session->Run(Ort::RunOptions{nullptr}, in_names.data(), values.data(), values.size(), out_names.data(),
                        out_names.size());
  } catch (const Ort::Exception& e) {
    return judge_error(c, e.what(), spec_error, views, read.given);
  }
  if (!spec_error.empty()) return failure("ONNX Runtime ran a call the spec rejects (" + spec_error + ")");
  Outcome out = judge_result(c, outs, views, attrs, read.given);
  if (out.kind != Outcome::Kind::Result || random_outputs(op, attrs)) return out;
  // The kernel is immutable after creation: the same session, run again, gives the same bits.
  try {
    std::vector<Ort::Value> again = session->Run(Ort::RunOptions{nullptr}, in_names.data(), values.data(), values.size(),
                                                 out_names.data(), out_names.size());
    for (size_t j = 0; j < outs.size(); ++j) {
      auto a = outs[j].GetTensorTypeAndShapeInfo(), b = again[j].GetTensorTypeAndShapeInfo();
      const size_t n = a.GetElementCount() * onnx_type_size(a.GetElementType());
      if (a.GetShape() != b.GetShape() || (n && std::memcmp(outs[j].GetTensorRawData(), again[j].GetTensorRawData(), n)))
        return failure("a second run of the same session gives another output '" + c.op->outputs[j].name + "'");
    }
  } catch (const Ort::Exception& e) {
    return failure(std::string("a second run of the same session fails: ") + e.what());
  }
  return out;
}

// A result: the spec's output count, dtypes and shapes, and bit for bit the kernel's own result
// in-process (the kernel harness: same validation and shape rules, its own memory and threads).
Outcome Runner::Impl::judge_result(const Case& c, std::vector<Ort::Value>& outs,
                                   const std::vector<const TensorView*>& views, const std::vector<AttrValue>& attrs,
                                   const std::map<std::string, AttrValue>& given) {
  const OpSpec& op = *c.op;
  if (outs.size() != op.outputs.size())
    return failure("ran with " + std::to_string(outs.size()) + " outputs; the op has " + std::to_string(op.outputs.size()));
  PreparedCall want = prepare_call(op, views, attrs);
  std::vector<std::optional<testing::Tensor>> in;
  for (const TensorView* v : views) in.push_back(v ? std::optional<testing::Tensor>(testing::Tensor{nullptr, *v}) : std::nullopt);
  std::vector<testing::Tensor> ref;
  try {
    ref = testing::run(op.name, in, given, /*threaded=*/true);
  } catch (const std::exception& e) {
    return failure(std::string("ONNX Runtime gave a result, the kernel harness an error: ") + e.what());
  }
  const bool random = random_outputs(op, attrs);
  for (size_t j = 0; j < outs.size(); ++j) {
    const std::string oname = "output '" + op.outputs[j].name + "'";
    auto info = outs[j].GetTensorTypeAndShapeInfo();
    std::optional<DType> d = dtype_of_onnx(info.GetElementType());
    if (!d || *d != want.output_dtypes[j])
      return failure(oname + " has type " + onnx_type_name(info.GetElementType()) + "; the spec says " +
                     std::string(dtype_name(want.output_dtypes[j])));
    Shape shape = info.GetShape();
    if (!shape_fits(shape, want.output_shapes[j]))
      return failure(oname + " has shape " + shape_str(shape) + "; the shape rule gives " + shape_str(want.output_shapes[j]));
    if (ref[j].view.shape != shape)
      return failure(oname + " has shape " + shape_str(shape) + "; the kernel harness gives " + shape_str(ref[j].view.shape));
    if (random) continue;  // random values: dtype and shape are all two runs share
    const size_t nbytes = static_cast<size_t>(ref[j].view.numel()) * dtype_size(*d);
    const void* got = outs[j].GetTensorRawData();
    const void* exp = ref[j].view.data;
    if (nbytes && std::memcmp(got, exp, nbytes) != 0) {
      const size_t size = dtype_size(*d);
      int64_t i = 0;
      while (std::memcmp(static_cast<const char*>(got) + i * size, static_cast<const char*>(exp) + i * size, size) == 0) ++i;
      return failure(oname + " differs from the kernel harness at element " + std::to_string(i) + ": " +
                     value_at(*d, got, i) + " vs " + value_at(*d, exp, i));
    }
  }
  return result();
}

// An error at run time: it names the op; where the spec rejects the call it is the spec's
// message; otherwise the kernel harness, given the same call, fails with the same message.
Outcome Runner::Impl::judge_error(const Case& c, const std::string& msg, const std::string& spec_error,
                                  const std::vector<const TensorView*>& views, const std::map<std::string, AttrValue>& given) {
  const OpSpec& op = *c.op;
  if (!contains(msg, op.qualified_name())) return failure("error does not name the op: " + msg);
  if (!spec_error.empty()) {
    if (!contains(msg, spec_error)) return failure("error differs from the spec's (" + spec_error + "): " + msg);
    return expected(msg);
  }
  if (allocation_error(msg)) return expected(msg);
  std::vector<std::optional<testing::Tensor>> in;
  for (const TensorView* v : views) in.push_back(v ? std::optional<testing::Tensor>(testing::Tensor{nullptr, *v}) : std::nullopt);
  try {
    testing::run(op.name, in, given, /*threaded=*/true);
  } catch (const std::exception& e) {
    if (!contains(msg, e.what())) return failure(std::string("error differs from the kernel harness's (") + e.what() + "): " + msg);
    return expected(msg);
  }
  return failure("ONNX Runtime failed where the kernel harness gives a result: " + msg);
}

}  // namespace opbridge::fuzz
