// The ONNX Runtime adapter: turns every OpSpec of this library into ONNX Runtime custom ops in
// the library's domain (or the domain an op names for its node), with no per-op code. One OrtCustomOp is registered per combination of
// the op's input dtypes (as onnxruntime-extensions does), so ONNX Runtime's own type inference
// knows every output dtype and rejects a wrong dtype when the session is created.
//
// Built against ONNX Runtime's C API headers only and never linked with libonnxruntime: the API
// table comes from RegisterCustomOps, negotiated with the runtime (see "the API version"), so the
// library loads into ONNX Runtime 1.17 and every newer release, including runtimes older than its
// headers. Kernels are immutable after creation: one session may run on many threads.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_c_api.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "opbridge/kernel_call.h"
#include "opbridge/prepare.h"
#include "opbridge/registry.h"
#include "opbridge/thread_lease.h"

namespace opbridge {
namespace {

// ---- the API version ------------------------------------------------------------------------
// OrtApi only grows: version N is the table of ONNX Runtime 1.N, and a runtime serves every
// version up to its own. The adapter asks for the newest it was built with and settles for the
// runtime's, down to the oldest it needs, and calls no entry newer than the version it got.
// Entries used, with the version that added them:
//   1   statuses, custom-op domains, tensor type/shape/data, KernelInfoGetAttribute_{int64,float,string},
//       KernelContext_{GetInputCount,GetInput,GetOutput}, GetAllocatorWithDefaultOptions, releases
//   8   KernelInfoGetAttributeArray_{int64,float}
//   14  KernelInfo_GetInputCount, KernelInfo_GetInputTypeInfo
//   15  KernelInfo_GetNodeName
//   17  KernelContext_ParallelFor (the floor: kernels run on the session's thread pool)
//   24  GetTensorElementTypeAndShapeDataReference (optional: an input's shape without allocating)
//   25  KernelInfoGetAttributeArray_string (optional: see string_list_size)
// A runtime reads the OrtCustomOp fields of the op's version: those set here are all within the
// floor (GetInputMemoryType 13, variadic arity 14, CreateKernelV2/KernelComputeV2 16,
// GetStartVersion/GetEndVersion 17).
constexpr uint32_t kMinApiVersion = 17;
constexpr uint32_t kShapeReferenceApiVersion = 24;
constexpr uint32_t kStringListApiVersion = 25;
static_assert(ORT_API_VERSION >= kStringListApiVersion, "build against ONNX Runtime 1.25 headers or newer");

const OrtApi* g_api = nullptr;
uint32_t g_api_version = 0;  // the version g_api was obtained with

// The API version a runtime's version string names ("1.20.1" -> 20; 0 when it names none).
// ONNX Runtime prints an error line for every GetApi version it lacks, so the search starts here.
uint32_t api_version_of(const char* version) {
  unsigned major = 0, minor = 0;
  if (!version || std::sscanf(version, "%u.%u", &major, &minor) != 2) return 0;
  return major == 1 ? minor : 0;
}

struct ApiTable {
  const OrtApi* api = nullptr;  // nullptr: the runtime is older than the floor
  uint32_t version = 0;
};

// The newest OrtApi both the runtime and this library have.
ApiTable negotiate(const OrtApiBase* base) {
  uint32_t v = ORT_API_VERSION;
  if (uint32_t runtime = api_version_of(base->GetVersionString())) v = std::min(v, runtime);
  for (; v >= kMinApiVersion; --v)
    if (const OrtApi* api = base->GetApi(v)) return {api, v};
  return {};
}

// An OrtStatus turned into an exception, so API failures unwind like kernel errors.
struct OrtFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(OrtStatus* s) {
  if (!s) return;
  std::string msg = g_api->GetErrorMessage(s);
  g_api->ReleaseStatus(s);
  throw OrtFailure(msg);
}

ONNXTensorElementDataType to_onnx(DType t) {
  switch (t) {
    case DType::Float32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    case DType::Float64: return ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE;
    case DType::Int32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
    case DType::Int64: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    case DType::Bool: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL;
    case DType::UInt8: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
    case DType::Float16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    case DType::BFloat16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
    case DType::Int8: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
    case DType::Int16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16;
  }
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

DType from_onnx(ONNXTensorElementDataType t, const std::string& input) {
  for (DType d : kAllDTypes)
    if (to_onnx(d) == t) return d;
  throw Error(detail::concat("input '", input, "' has ONNX element type ", static_cast<int>(t),
                             ", which opbridge kernels do not take"));
}

// One registration: an op at one assignment of dtypes to its type constraints.
struct CustomOp : OrtCustomOp {
  const OpSpec* spec = nullptr;
  std::vector<ONNXTensorElementDataType> input_types, output_types;
  bool refusing = false;  // takes nodes whose inputs of one constraint disagree, and refuses them by name
};

struct Kernel {
  const OpSpec* spec;
  std::vector<AttrValue> attrs;
  std::string where;  // "<ns>::<op> (node 'name')", the prefix of every error
  // The symbolic attributes (OpSpec::symbolic_attrs; the k-th is given by input op.inputs.size() + k
  // when the node has it) and whether the node's attribute or the default gives a value without it.
  std::vector<size_t> symbolic;
  std::vector<bool> symbolic_given;
};

OrtStatus* fail(OrtErrorCode code, const std::string& msg) { return g_api->CreateStatus(code, msg.c_str()); }

// ---- attributes -----------------------------------------------------------------------------
// What the node holds under an attribute name, as far as ONNX Runtime's getters can tell. The
// scalar getters check the attribute's type; the list getters do not (they "succeed" with zero
// elements on any attribute), so lists are probed last and an empty result stays ambiguous.
struct Found {
  enum class What { Absent, Value, EmptyList, Other } what = What::Absent;  // Other: a kind opbridge never takes
  AttrValue value;
  std::string_view kind;  // for messages: "int", "float", "str", "int[]", "float[]", "an empty list"
};

// The length of a list-of-strings attribute (0 when it is none). Runtimes before 1.25 cannot read
// one: there a list of strings looks like an empty list (documented in docs/architecture.md).
size_t string_list_size(const OrtKernelInfo* info, const char* name) {
  if (g_api_version < kStringListApiVersion) return 0;
  OrtAllocator* alloc = nullptr;
  check(g_api->GetAllocatorWithDefaultOptions(&alloc));
  size_t n = 0;
  if (OrtStatus* s = g_api->KernelInfoGetAttributeArray_string(info, name, alloc, nullptr, &n)) {
    g_api->ReleaseStatus(s);
    return 0;
  }
  return n;
}

Found probe(const OrtKernelInfo* info, const char* name) {
  auto ok = [](OrtStatus* s) {
    if (!s) return true;
    g_api->ReleaseStatus(s);
    return false;
  };
  auto found = [](AttrValue v, std::string_view kind) { return Found{Found::What::Value, std::move(v), kind}; };
  int64_t i = 0;
  if (ok(g_api->KernelInfoGetAttribute_int64(info, name, &i))) return found(i, "int");
  float x = 0;
  if (ok(g_api->KernelInfoGetAttribute_float(info, name, &x))) return found(double{x}, "float");
  size_t n = 0;
  if (ok(g_api->KernelInfoGetAttribute_string(info, name, nullptr, &n))) {
    std::string v(n, '\0');
    check(g_api->KernelInfoGetAttribute_string(info, name, v.data(), &n));
    v.resize(n ? n - 1 : 0);  // n counts the terminating NUL
    return found(std::move(v), "str");
  }
  bool any_list = false;
  if (ok(g_api->KernelInfoGetAttributeArray_int64(info, name, nullptr, &n))) {
    any_list = true;
    if (n) {
      std::vector<int64_t> v(n);
      check(g_api->KernelInfoGetAttributeArray_int64(info, name, v.data(), &n));
      return found(std::move(v), "int[]");
    }
  }
  if (ok(g_api->KernelInfoGetAttributeArray_float(info, name, nullptr, &n))) {
    any_list = true;
    if (n) {
      std::vector<float> v(n);
      check(g_api->KernelInfoGetAttributeArray_float(info, name, v.data(), &n));
      return found(std::vector<double>(v.begin(), v.end()), "float[]");
    }
  }
  // The numeric list getters read a list of strings as empty: ask for strings explicitly, so a
  // string list is the wrong kind at session creation rather than an empty list at run time.
  if (any_list && string_list_size(info, name) > 0) return Found{Found::What::Other, {}, "str[]"};
  // An empty list of any element type, or an attribute kind opbridge does not read (tensor,
  // graph); indistinguishable through the C API.
  if (any_list) return Found{Found::What::EmptyList, {}, "an empty list or an unsupported kind"};
  return Found{};
}

// The node's value for `a` (nullopt when absent); a value of another kind is an error.
std::optional<AttrValue> read_attr(const OrtKernelInfo* info, const AttrSpec& a) {
  Found f = probe(info, a.name.c_str());
  using W = Found::What;
  if (f.what == W::Absent) return std::nullopt;
  bool is_list = a.kind == AttrKind::Ints || a.kind == AttrKind::Floats;
  if (f.what == W::EmptyList && is_list)
    return a.kind == AttrKind::Ints ? AttrValue{std::vector<int64_t>{}} : AttrValue{std::vector<double>{}};
  if (f.what == W::Value) {
    if (attr_kind_of(f.value) == a.kind) return f.value;
    if (a.kind == AttrKind::Bool && f.kind == "int") return AttrValue{std::get<int64_t>(f.value) != 0};
  }
  throw Error(detail::concat("attribute '", a.name, "' must be ", attr_kind_name(a.kind), ", got ", f.kind));
}

std::string node_name(const OrtKernelInfo* info) {
  size_t n = 0;
  if (OrtStatus* s = g_api->KernelInfo_GetNodeName(info, nullptr, &n)) {
    g_api->ReleaseStatus(s);
    return "";
  }
  std::string name(n, '\0');
  check(g_api->KernelInfo_GetNodeName(info, name.data(), &n));
  name.resize(n ? n - 1 : 0);
  return name;
}

// The value of symbolic attribute `a` from its input: an int64 scalar or 1-element tensor.
int64_t symbolic_value(const OrtValue* v, const AttrSpec& a) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  check(g_api->GetTensorTypeAndShape(v, &info));
  std::unique_ptr<OrtTensorTypeAndShapeInfo, void (*)(OrtTensorTypeAndShapeInfo*)> guard(info, g_api->ReleaseTensorTypeAndShapeInfo);
  ONNXTensorElementDataType et;
  size_t rank = 0;
  check(g_api->GetTensorElementType(info, &et));
  check(g_api->GetDimensionsCount(info, &rank));
  Shape shape(rank);
  check(g_api->GetDimensions(info, shape.data(), rank));
  const bool one = rank == 0 || (rank == 1 && shape[0] == 1);
  OB_CHECK(et == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 && one, "input '", a.name, "_value' gives attribute '", a.name,
           "' and must be an int64 scalar or 1-element tensor, got ",
           et == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 ? "int64" : "another element type", " of shape ", shape_str(shape));
  void* data = nullptr;
  check(g_api->GetTensorMutableData(const_cast<OrtValue*>(v), &data));
  return *static_cast<const int64_t*>(data);
}

// ---- compute --------------------------------------------------------------------------------
// ONNX Runtime's output `i`, allocated with `shape`: its data.
void* output_data(const OrtKernelContext* ctx, size_t i, const Shape& shape) {
  OrtValue* out = nullptr;
  if (OrtStatus* s = g_api->KernelContext_GetOutput(const_cast<OrtKernelContext*>(ctx), i, shape.data(), shape.size(),
                                                    &out)) {
    std::string msg = g_api->GetErrorMessage(s);
    g_api->ReleaseStatus(s);
    // The runtime's allocator says it with its source file and signature: an allocation that
    // failed is std::bad_alloc, which the core reports naming the output, its shape and bytes.
    if (msg.find("Failed to allocate memory") != std::string::npos) throw std::bad_alloc();
    throw OrtFailure(msg);
  }
  void* data = nullptr;
  check(g_api->GetTensorMutableData(out, &data));
  return data;
}

// ONNX Runtime as a kernel's host: outputs are the node's outputs, parallel work runs on the
// session's intra-op thread pool.
class OrtHost final : public KernelHost {
 public:
  explicit OrtHost(const OrtKernelContext* ort) : ort_(ort) {}
  void* output_memory(size_t i, DType, const Shape& shape) override { return output_data(ort_, i, shape); }

  void parallel_for(int64_t n, int64_t grain, ParallelBody fn) override {
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    // Divisions rounded up without n + d - 1, which overflows for a range near 2^63.
    const auto ceil_div = [](int64_t a, int64_t d) { return a / d + (a % d != 0); };
    const int64_t chunks = std::min<int64_t>(ceil_div(n, grain), 1024);
    if (chunks == 1) return fn(0, n);
    Job job{fn, n, ceil_div(n, chunks), {}, {}};
    check(g_api->KernelContext_ParallelFor(ort_, &Job::run, static_cast<size_t>(chunks), 0, &job));
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  // Exceptions must not cross ONNX Runtime's thread pool: keep the first, rethrow on return.
  struct Job {
    ParallelBody fn;
    int64_t n, chunk;
    std::mutex mu;
    std::exception_ptr error;
    static void run(void* self, size_t i) {
      auto* j = static_cast<Job*>(self);
      const int64_t begin = static_cast<int64_t>(i) * j->chunk;
      const int64_t end = j->chunk >= j->n - begin ? j->n : begin + j->chunk;
      try {
        if (begin < end) j->fn(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(j->mu);
        if (!j->error) j->error = std::current_exception();
      }
    }
  };
  const OrtKernelContext* ort_;
};

// What compute() keeps from call to call on each thread, so that a warm call allocates nothing
// of its own: the input views, the call's shapes and output views (for a small op the allocations
// were most of the per-call cost). In use while a call runs; a call that finds it in use (never
// expected: ONNX Runtime does not run a node inside another on one thread) uses fresh storage.
struct ComputeBuffers {
  std::vector<TensorView> views;
  std::vector<AttrValue> attrs;  // the kernel's, with the symbolic attributes' inputs applied
  std::vector<const TensorView*> inputs;
  CallBuffers call;
  bool in_use = false;
};

void compute(const Kernel& k, OrtKernelContext* ctx) {
  thread_local ComputeBuffers kept;
  ThreadLease<ComputeBuffers> lease(kept);
  ComputeBuffers& b = lease.get();
  const OpSpec& op = *k.spec;
  size_t n_in = 0;
  check(g_api->KernelContext_GetInputCount(ctx, &n_in));
  b.views.resize(op.inputs.size());
  b.inputs.assign(op.inputs.size(), nullptr);
  for (size_t i = 0; i < op.inputs.size() && i < n_in; ++i) {
    const OrtValue* v = nullptr;
    check(g_api->KernelContext_GetInput(ctx, i, &v));
    if (!v) continue;  // an optional input given as ""
    TensorView& view = b.views[i];
    ONNXTensorElementDataType et;
    if (g_api_version < kShapeReferenceApiVersion) {  // an info object, allocated per call
      OrtTensorTypeAndShapeInfo* info = nullptr;
      check(g_api->GetTensorTypeAndShape(v, &info));
      std::unique_ptr<OrtTensorTypeAndShapeInfo, void (*)(OrtTensorTypeAndShapeInfo*)> guard(info, g_api->ReleaseTensorTypeAndShapeInfo);
      size_t rank = 0;
      check(g_api->GetTensorElementType(info, &et));
      check(g_api->GetDimensionsCount(info, &rank));
      view.shape.resize(rank);
      check(g_api->GetDimensions(info, view.shape.data(), rank));
    } else {  // the value's own shape, nothing allocated
      const int64_t* dims = nullptr;
      size_t rank = 0;
      check(g_api->GetTensorElementTypeAndShapeDataReference(v, &et, &dims, &rank));
      view.shape.assign(dims, dims + rank);
    }
    check(g_api->GetTensorMutableData(const_cast<OrtValue*>(v), &view.data));
    view.dtype = from_onnx(et, op.inputs[i].name);
    contiguous_strides(view.shape, view.strides);
    b.inputs[i] = &view;
  }
  const std::vector<AttrValue>* attrs = &k.attrs;
  if (!k.symbolic.empty()) {  // an input given for a symbolic attribute wins over the attribute
    b.attrs = k.attrs;
    attrs = &b.attrs;
    const std::vector<size_t>& symbolic = k.symbolic;
    for (size_t j = 0; j < symbolic.size(); ++j) {
      const AttrSpec& a = op.attrs[symbolic[j]];
      const OrtValue* v = nullptr;
      if (op.inputs.size() + j < n_in) check(g_api->KernelContext_GetInput(ctx, op.inputs.size() + j, &v));
      if (v) b.attrs[symbolic[j]] = symbolic_value(v, a);
      else OB_CHECK(k.symbolic_given[j], "required attribute '", a.name, "' (int) is missing: the node gives it "
                    "neither as an attribute nor as input '", a.name, "_value'");
    }
  }
  OrtHost host(ctx);
  run_kernel(op, b.inputs, *attrs, host, b.call);
}

// Runs f, turning any exception into a failed status that names the op (and node).
template <typename F>
OrtStatus* guarded(const std::string& where, F&& f) {
  try {
    f();
    return nullptr;
  } catch (const Error& e) {
    return fail(ORT_INVALID_ARGUMENT, where + ": " + e.what());
  } catch (const std::exception& e) {
    return fail(ORT_FAIL, where + ": " + e.what());
  } catch (...) {
    return fail(ORT_FAIL, where + ": unknown error");
  }
}

// ---- the OrtCustomOp table ------------------------------------------------------------------
const CustomOp& self(const OrtCustomOp* op) { return *static_cast<const CustomOp*>(op); }

// The node's input dtypes as the adapter sees them (nullopt: absent or not a tensor).
std::vector<std::optional<DType>> node_input_dtypes(const OpSpec& op, const OrtKernelInfo* info) {
  size_t n = 0;
  check(g_api->KernelInfo_GetInputCount(info, &n));
  std::vector<std::optional<DType>> out(op.inputs.size());
  for (size_t i = 0; i < n && i < out.size(); ++i) {
    OrtTypeInfo* type = nullptr;
    if (OrtStatus* s = g_api->KernelInfo_GetInputTypeInfo(info, i, &type)) {
      g_api->ReleaseStatus(s);
      continue;
    }
    std::unique_ptr<OrtTypeInfo, void (*)(OrtTypeInfo*)> guard(type, g_api->ReleaseTypeInfo);
    const OrtTensorTypeAndShapeInfo* tensor = nullptr;
    check(g_api->CastTypeInfoToTensorInfo(type, &tensor));
    ONNXTensorElementDataType et = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    if (tensor) check(g_api->GetTensorElementType(tensor, &et));
    if (et != ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED) out[i] = from_onnx(et, op.inputs[i].name);
  }
  return out;
}

// A node no typed entry takes (inputs of one constraint that disagree, or a dtype outside a
// constraint): say which inputs and which dtypes, in the words eager PyTorch uses, when the
// session is created.
[[noreturn]] void refuse_dtypes(const OpSpec& op, const OrtKernelInfo* info) {
  resolve_types(op, node_input_dtypes(op, info));  // throws naming the input and the dtypes expected
  throw Error("no kernel for this combination of input dtypes");
}

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp* op, const OrtApi*, const OrtKernelInfo* info, void** out) {
  const OpSpec& spec = *self(op).spec;
  std::string where = spec.qualified_name();
  return guarded(where, [&] {
    std::string node = node_name(info);
    if (!node.empty()) where += " (node '" + node + "')";
    if (self(op).refusing) refuse_dtypes(spec, info);
    auto kernel = std::make_unique<Kernel>(Kernel{&spec, {}, where, spec.symbolic_attrs(), {}});
    // Only the op's own attributes can be asked for: the C API lists none of a node's (through
    // version 29), so one the op does not take is named by `opbridge inspect` and the ONNX checker.
    std::vector<std::optional<AttrValue>> given;
    for (const AttrSpec& a : spec.attrs) given.push_back(read_attr(info, a));
    // A symbolic attribute may come as the node's input instead (read per call, see compute).
    size_t n_in = 0;
    check(g_api->KernelInfo_GetInputCount(info, &n_in));
    const std::vector<size_t>& symbolic = kernel->symbolic;
    for (size_t j = 0; j < symbolic.size(); ++j) {
      const AttrSpec& a = spec.attrs[symbolic[j]];
      const bool has_value = given[symbolic[j]] || a.default_value;
      OB_CHECK(has_value || spec.inputs.size() + j < n_in, "required attribute '", a.name, "' (int) is missing: the "
               "node gives it neither as an attribute nor as input '", a.name, "_value'");
      if (!has_value) given[symbolic[j]] = AttrValue{int64_t{0}};  // never read: compute takes the input
      kernel->symbolic_given.push_back(has_value);
    }
    kernel->attrs = resolve_attrs(spec, std::move(given));
    *out = kernel.release();
  });
}

OrtStatus* ORT_API_CALL compute_kernel(void* kernel, OrtKernelContext* ctx) {
  const Kernel& k = *static_cast<const Kernel*>(kernel);
  return guarded(k.where, [&] { compute(k, ctx); });
}

void fill_table(CustomOp& c) {
  std::memset(static_cast<OrtCustomOp*>(&c), 0, sizeof(OrtCustomOp));
  // A runtime refuses a custom op of a newer version than its own, and reads only the fields its
  // version had: the negotiated version, not the headers'.
  c.version = g_api_version;
  c.GetName = [](const OrtCustomOp* op) { return self(op).spec->export_as.onnx_name.c_str(); };
  c.GetExecutionProviderType = [](const OrtCustomOp*) -> const char* { return "CPUExecutionProvider"; };
  c.GetInputTypeCount = [](const OrtCustomOp* op) { return self(op).input_types.size(); };
  c.GetInputType = [](const OrtCustomOp* op, size_t i) { return self(op).input_types[i]; };
  c.GetOutputTypeCount = [](const OrtCustomOp* op) { return self(op).output_types.size(); };
  c.GetOutputType = [](const OrtCustomOp* op, size_t i) { return self(op).output_types[i]; };
  c.GetInputCharacteristic = [](const OrtCustomOp* op, size_t i) {
    // Past the op's inputs: the optional inputs of its symbolic attributes.
    const auto& inputs = self(op).spec->inputs;
    return i >= inputs.size() || inputs[i].optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  };
  c.GetOutputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
  c.GetInputMemoryType = [](const OrtCustomOp*, size_t) { return OrtMemTypeDefault; };
  c.GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
  c.GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
  c.GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
  c.GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
  c.CreateKernelV2 = create_kernel;
  c.KernelComputeV2 = compute_kernel;
  c.KernelDestroy = [](void* kernel) { delete static_cast<Kernel*>(kernel); };
  // ONNX Runtime keeps one schema per custom op name, from version 1, and serves any version of
  // the domain a model imports with it: the range cannot refuse a newer domain version (the
  // Python session and inspect check a model's imports against the library instead).
  c.GetStartVersion = [](const OrtCustomOp*) { return 1; };
  c.GetEndVersion = [](const OrtCustomOp*) { return INT_MAX; };
}

// Every assignment of allowed dtypes to the op's type constraints (output-only constraints are
// single-dtype, validate_spec, or follow an input constraint: they take their first).
void assignments(const OpSpec& op, size_t t, std::vector<DType>& chosen, std::vector<std::vector<DType>>& out) {
  if (t == op.types.size()) {
    out.push_back(chosen);
    return;
  }
  bool used_by_input = false;
  for (const InputSpec& in : op.inputs) used_by_input |= in.type == op.types[t].name;
  const auto& allowed = op.types[t].allowed;
  for (size_t i = 0; i < (used_by_input ? allowed.size() : 1); ++i) {
    chosen.push_back(allowed[i]);
    assignments(op, t + 1, chosen, out);
    chosen.pop_back();
  }
}

// An entry for one assignment: each input and output the dtype of its constraint.
std::unique_ptr<CustomOp> entry(const OpSpec& op, const std::vector<DType>& chosen) {
  auto c = std::make_unique<CustomOp>();
  fill_table(*c);
  c->spec = &op;
  auto dtype_of = [&](const std::string& type) {
    for (size_t i = 0; i < op.types.size(); ++i)
      if (op.types[i].name == type) return to_onnx(chosen[i]);
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  };
  for (const InputSpec& in : op.inputs) c->input_types.push_back(dtype_of(in.type));
  for (size_t j = 0; j < op.symbolic_attrs().size(); ++j) c->input_types.push_back(ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64);
  for (const OutputSpec& o : op.outputs) c->output_types.push_back(dtype_of(o.type));
  return c;
}

// An op's entries: one per assignment of dtypes (typed), then the refusing ones, for nodes whose
// inputs of one type constraint disagree (a float32 and a float64 operand), where ONNX Runtime
// would say only "could not find an implementation". A refusing entry takes such a node and
// refuses it when the session is created, naming the inputs and their dtypes in the words eager
// PyTorch uses. Per constraint that two or more inputs share, and per assignment: its first input
// of that constraint and every other input as assigned, the constraint's other inputs any dtype,
// the outputs as assigned (ONNX Runtime infers a node's output types from the entry that matches).
// ONNX Runtime tries entries in order (a node with an absent optional input may match a typed and
// a refusing one) and builds every entry's kernel definition for each session, so they must be
// few: one entry per mixed combination instead (4^5 - 4 for a five-input op of four dtypes, 4,700
// in all) made each session with the library 100 ms slower to create.
void add_entries(const OpSpec& op, std::vector<std::unique_ptr<CustomOp>>& out) {
  std::vector<std::vector<DType>> all;
  std::vector<DType> chosen;
  assignments(op, 0, chosen, all);
  for (const auto& a : all) out.push_back(entry(op, a));
  for (const TypeConstraint& t : op.types) {
    std::vector<size_t> users;
    for (size_t i = 0; i < op.inputs.size(); ++i)
      if (op.inputs[i].type == t.name) users.push_back(i);
    if (users.size() < 2 || t.allowed.size() < 2) continue;
    for (const auto& a : all) {
      auto c = entry(op, a);
      c->refusing = true;
      for (size_t k = 1; k < users.size(); ++k) c->input_types[users[k]] = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
      out.push_back(std::move(c));
    }
  }
}

// The custom ops and their domains live as long as this library is loaded: ONNX Runtime keeps
// pointers to them in every session created with options they were registered with, and unloads
// the library only after those. The domains are released with the library, so loading and
// unloading it many times leaks nothing. Ops are in the library's domain unless one names its own
// (OpBuilder::onnx_node): one OrtCustomOpDomain per domain used.
struct Domains {
  Domains() {
    for (const OpSpec& op : registry().ops()) {
      if (!op.cpu_kernel) continue;  // ops without a kernel export to standard ops or functions
      size_t first = ops.size();
      add_entries(op, ops);
      OrtCustomOpDomain* domain = find_or_create(op.export_as.onnx_domain);
      for (size_t i = first; i < ops.size(); ++i) check(g_api->CustomOpDomain_Add(domain, ops[i].get()));
    }
    if (domains.empty()) find_or_create(this_library().onnx_domain);  // a library of mappings only
  }
  ~Domains() {
    for (auto& [name, domain] : domains) g_api->ReleaseCustomOpDomain(domain);
  }
  Domains(const Domains&) = delete;
  Domains& operator=(const Domains&) = delete;

  OrtCustomOpDomain* find_or_create(const std::string& name) {
    for (auto& [n, d] : domains)
      if (n == name) return d;
    OrtCustomOpDomain* d = nullptr;
    check(g_api->CreateCustomOpDomain(name.c_str(), &d));
    domains.emplace_back(name, d);
    return d;
  }

  std::vector<std::unique_ptr<CustomOp>> ops;
  std::vector<std::pair<std::string, OrtCustomOpDomain*>> domains;
};

Domains& domains() {
  static Domains d;
  return d;
}

}  // namespace
}  // namespace opbridge

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  using namespace opbridge;
  const ApiTable got = negotiate(api_base);
  if (!got.api) {
    // Below the floor. Every runtime still serves API 1, which can carry the message.
    std::string msg = std::string("opbridge library '") + this_library().name + "' (lib" + this_library().name +
                      "_ort.so) needs ONNX Runtime 1." + std::to_string(kMinApiVersion) + " or newer (C API version " +
                      std::to_string(kMinApiVersion) + "), but is loaded into ONNX Runtime " +
                      api_base->GetVersionString();
    if (const OrtApi* old = api_base->GetApi(1)) return old->CreateStatus(ORT_FAIL, msg.c_str());
    std::fprintf(stderr, "%s\n", msg.c_str());
    return nullptr;
  }
  // One process has one runtime: the first registration decides (the custom ops carry its version).
  static std::once_flag once;
  std::call_once(once, [&] {
    g_api = got.api;
    g_api_version = got.version;
  });
  const OrtApi* api = got.api;
  if (!registry().errors().empty())
    return api->CreateStatus(ORT_FAIL, ("opbridge: invalid op definitions: " + registry().errors().front()).c_str());
  try {
    for (auto& [name, domain] : domains().domains)
      if (OrtStatus* status = api->AddCustomOpDomain(options, domain)) return status;
    return nullptr;
  } catch (const std::exception& e) {
    return api->CreateStatus(ORT_FAIL, (std::string("opbridge: ") + e.what()).c_str());
  }
}
