// The PyTorch adapter: turns every OpSpec of this library into a torch op, with no per-op code.
//   schema   generated from the spec, defined in the library's namespace
//   CPU      one boxed kernel: IValues -> TensorViews -> the op's kernel -> tensors
//   Meta     the spec's shape rule evaluated on SymInts (so torch.export sees symbolic shapes)
//   Autograd "not implemented" fallback: forward works, backward raises naming the op
// Errors from validation or kernels become RuntimeError("<ns>::<op>: <reason>").
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <cmath>
#include <cstdio>
#include <memory>

#include "opbridge/kernel_call.h"
#include "opbridge/prepare.h"
#include "opbridge/registry.h"
#include "opbridge/shape_infer.h"
#include "output_cache.h"

namespace opbridge {

template <>
struct DimTraits<c10::SymInt> {
  using S = c10::SymInt;
  static S from(int64_t v) { return S(v); }
  static bool eq(const S& a, const S& b) { return a == b; }
  // Inequalities are decided on known values only: a guard on a symbolic size would constrain
  // the exported program. Undecided ones are checked by the kernel at run time.
  static std::optional<bool> maybe_ge(const S& a, const S& b) {
    return both(a, b) ? std::optional<bool>(*a.maybe_as_int() >= *b.maybe_as_int()) : std::nullopt;
  }
  static std::optional<bool> maybe_gt(const S& a, const S& b) {
    return both(a, b) ? std::optional<bool>(*a.maybe_as_int() > *b.maybe_as_int()) : std::nullopt;
  }
  static bool known_negative(const S& a) { return a.maybe_as_int().value_or(0) < 0; }
  // Concrete values take the checked int64 path, so Meta and eager agree to the last case.
  static S add(const S& a, const S& b) { return both(a, b) ? S(DimTraits<int64_t>::add(*a.maybe_as_int(), *b.maybe_as_int())) : a + b; }
  static S sub(const S& a, const S& b) { return both(a, b) ? S(DimTraits<int64_t>::sub(*a.maybe_as_int(), *b.maybe_as_int())) : a - b; }
  static S mul(const S& a, const S& b) { return both(a, b) ? S(DimTraits<int64_t>::mul(*a.maybe_as_int(), *b.maybe_as_int())) : a * b; }
  static S floordiv(const S& a, const S& b) {
    if (both(a, b)) return S(DimTraits<int64_t>::floordiv(*a.maybe_as_int(), *b.maybe_as_int()));
    OB_CHECK(b.maybe_as_int() != std::optional<int64_t>(0), "shape rule divides by zero");
    return a / b;  // symbolic: floor division of sizes
  }

 private:
  static bool both(const S& a, const S& b) { return a.maybe_as_int() && b.maybe_as_int(); }
};

namespace {

// ---- schema ---------------------------------------------------------------------------------
std::string float_literal(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".";
  return s;
}

std::string default_literal(const AttrValue& v) {
  switch (attr_kind_of(v)) {
    case AttrKind::Int: return std::to_string(std::get<int64_t>(v));
    case AttrKind::Float: return float_literal(std::get<double>(v));
    case AttrKind::Bool: return std::get<bool>(v) ? "True" : "False";
    case AttrKind::String: {
      std::string out = "\"";
      for (char c : std::get<std::string>(v)) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
      return out + "\"";
    }
    case AttrKind::Ints: {
      std::string s = "[";
      for (int64_t x : std::get<std::vector<int64_t>>(v)) s += (s.size() > 1 ? ", " : "") + std::to_string(x);
      return s + "]";
    }
    case AttrKind::Floats: {
      std::string s = "[";
      for (double x : std::get<std::vector<double>>(v)) s += (s.size() > 1 ? ", " : "") + float_literal(x);
      return s + "]";
    }
  }
  return "";
}

// `name` and no outputs: the schema of the validation-only op.
std::string schema_of(const OpSpec& op, const std::string& name = "", bool no_outputs = false) {
  std::string s = (name.empty() ? op.name : name) + "(";
  bool first = true;
  auto arg = [&](const std::string& a) {
    s += (first ? "" : ", ") + a;
    first = false;
  };
  for (const InputSpec& in : op.inputs) arg(in.optional ? "Tensor? " + in.name + "=None" : "Tensor " + in.name);
  // Attributes stay positional (as in torch.ops.ns.op(x, y, 0.5)) until a required one follows
  // a defaulted argument; from there on they are keyword-only, which the schema demands.
  bool seen_default = !op.inputs.empty() && op.inputs.back().optional, kw_only = false;
  for (const AttrSpec& a : op.attrs) {
    if (!kw_only && seen_default && !a.default_value) {
      arg("*");
      kw_only = true;
    }
    seen_default |= a.default_value.has_value();
    // A symbolic attribute is a SymInt, so torch.export keeps a size computed into it symbolic.
    const std::string type = a.symbolic ? "SymInt" : std::string(attr_kind_name(a.kind));
    arg(type + " " + a.name + (a.default_value ? "=" + default_literal(*a.default_value) : ""));
  }
  s += ") -> ";
  if (no_outputs) return s + "()";
  if (op.outputs.size() == 1) return s + "Tensor";
  s += "(";
  for (size_t i = 0; i < op.outputs.size(); ++i) s += (i ? ", Tensor" : "Tensor");
  return s + ")";
}

// ---- conversions ----------------------------------------------------------------------------
DType to_dtype(const OpSpec& op, const std::string& input, c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::Float32;
    case at::kDouble: return DType::Float64;
    case at::kInt: return DType::Int32;
    case at::kLong: return DType::Int64;
    case at::kBool: return DType::Bool;
    case at::kByte: return DType::UInt8;
    case at::kHalf: return DType::Float16;
    case at::kBFloat16: return DType::BFloat16;
    case at::kChar: return DType::Int8;
    case at::kShort: return DType::Int16;
    default: break;
  }
  throw Error(detail::concat("input '", input, "' has dtype ", c10::toString(t), ", which opbridge kernels do not take"));
}

c10::ScalarType to_scalar_type(DType t) {
  switch (t) {
    case DType::Float32: return at::kFloat;
    case DType::Float64: return at::kDouble;
    case DType::Int32: return at::kInt;
    case DType::Int64: return at::kLong;
    case DType::Bool: return at::kBool;
    case DType::UInt8: return at::kByte;
    case DType::Float16: return at::kHalf;
    case DType::BFloat16: return at::kBFloat16;
    case DType::Int8: return at::kChar;
    case DType::Int16: return at::kShort;
  }
  return at::kFloat;
}

AttrValue to_attr(const AttrSpec& a, const c10::IValue& v) {
  switch (a.kind) {
    // A SymInt argument (a symbolic attribute) is concrete here: the Meta kernel keeps symbolic ones.
    case AttrKind::Int: return v.isSymInt() ? v.toSymInt().guard_int(__FILE__, __LINE__) : v.toInt();
    // Float attributes are float32 in ONNX; round here so eager and ONNX Runtime agree.
    case AttrKind::Float: return static_cast<double>(static_cast<float>(v.toDouble()));
    case AttrKind::Bool: return v.toBool();
    case AttrKind::String: return v.toStringRef();
    case AttrKind::Ints: return v.toIntVector();
    case AttrKind::Floats: {
      std::vector<double> out;
      for (double x : v.toDoubleVector()) out.push_back(static_cast<float>(x));
      return out;
    }
  }
  return int64_t{0};
}

// PyTorch as a kernel's host: outputs are new tensors, parallel work runs on at::parallel_for.
class TorchHost final : public KernelHost {
 public:
  explicit TorchHost(const OpSpec& op) : tensors(op.outputs.size()), op_(op) {}
  void* output_memory(size_t i, DType dtype, const Shape& shape) override {
    try {
      // Large outputs reuse blocks of earlier outputs (output_cache.h): no fresh pages per call.
      size_t nbytes = dtype_size(dtype);
      for (int64_t d : shape)  // an impossible size goes to PyTorch's allocator, which reports it
        if (d < 0 || __builtin_mul_overflow(nbytes, static_cast<size_t>(d), &nbytes)) nbytes = 0;
      tensors.at(i) = at::Tensor(at::detail::empty_generic(shape, output_allocator(nbytes),
                                                           c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                           to_scalar_type(dtype), std::nullopt));
    } catch (const c10::Error& e) {  // the allocator's message, in the op's words
      std::string why = e.what_without_backtrace();
      throw Error(detail::concat("cannot allocate output '", op_.outputs.at(i).name, "' of shape ", shape_str(shape),
                                 ": ", why.substr(0, why.find('\n'))));
    }
    return tensors[i].data_ptr();
  }
  void parallel_for(int64_t n, int64_t grain, ParallelBody body) override { at::parallel_for(0, n, grain, body); }
  std::vector<at::Tensor> tensors;

 private:
  const OpSpec& op_;
};

// One boxed functor per op and dispatch key; it holds the spec, so no lookup per call.
class BoxedOp final : public c10::OperatorKernel {
 public:
  // check_only: validate (dtypes, ranks, spec checks, shape rule) and return nothing.
  BoxedOp(const OpSpec& op, bool meta, bool check_only = false) : op_(op), meta_(meta), check_only_(check_only) {}

  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n_in = op_.inputs.size(), n_args = n_in + op_.attrs.size();
    std::vector<at::Tensor> outputs;
    try {
      auto args = torch::jit::last(*stack, n_args);
      std::vector<std::optional<at::Tensor>> tensors;
      for (size_t i = 0; i < n_in; ++i) {
        // PyTorch hands None for a required Tensor as an undefined tensor.
        const bool none = args[i].isNone() || !args[i].toTensor().defined();
        OB_CHECK(!none || op_.inputs[i].optional, "input '", op_.inputs[i].name, "' is None; it is required");
        tensors.push_back(none ? std::nullopt : std::optional<at::Tensor>(args[i].toTensor()));
      }
      std::vector<AttrValue> attrs;
      std::vector<std::optional<c10::SymInt>> symbolic(op_.attrs.size());
      for (size_t i = 0; i < op_.attrs.size(); ++i) {
        const c10::IValue& v = args[n_in + i];
        // A symbolic size (torch.export's) stays symbolic in the shape rules; the attribute's
        // concrete slot is never read for it.
        if (meta_ && op_.attrs[i].symbolic && v.isSymInt() && !v.toSymInt().maybe_as_int()) {
          symbolic[i] = v.toSymInt();
          attrs.push_back(int64_t{0});
          continue;
        }
        attrs.push_back(to_attr(op_.attrs[i], v));
      }
      outputs = meta_ ? run_meta(tensors, attrs, symbolic) : run_cpu(tensors, attrs);
      if (check_only_) outputs.clear();
    } catch (const Error& e) {
      TORCH_CHECK(false, op_.qualified_name(), ": ", e.what());
    } catch (const c10::Error&) {
      throw;  // already PyTorch's own error (e.g. from a tensor operation)
    } catch (const std::exception& e) {
      // A kernel bug (e.g. reading an attribute as the wrong kind) still names the op.
      TORCH_CHECK(false, op_.qualified_name(), ": internal error: ", e.what());
    }
    torch::jit::drop(*stack, n_args);
    for (at::Tensor& t : outputs) stack->emplace_back(std::move(t));
  }

 private:
  std::vector<at::Tensor> run_cpu(const std::vector<std::optional<at::Tensor>>& tensors, const std::vector<AttrValue>& attrs) {
    std::vector<at::Tensor> contiguous;  // keeps the data the views point into alive
    std::vector<TensorView> views(tensors.size());
    std::vector<const TensorView*> inputs;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!tensors[i]) { inputs.push_back(nullptr); continue; }
      contiguous.push_back(tensors[i]->contiguous());
      const at::Tensor& t = contiguous.back();
      views[i] = TensorView{t.data_ptr(), to_dtype(op_, op_.inputs[i].name, t.scalar_type()), t.sizes().vec(),
                            t.strides().vec()};
      inputs.push_back(&views[i]);
    }
    TorchHost host(op_);
    run_kernel(op_, inputs, attrs, host);
    return std::move(host.tensors);
  }

  std::vector<at::Tensor> run_meta(const std::vector<std::optional<at::Tensor>>& tensors, const std::vector<AttrValue>& attrs,
                                   const std::vector<std::optional<c10::SymInt>>& symbolic) {
    std::vector<std::optional<DType>> dtypes;
    std::vector<std::vector<c10::SymInt>> sizes(tensors.size());
    std::vector<const std::vector<c10::SymInt>*> shapes;
    // A meta input sends the call here even when others hold data (on the CPU): that is no shape
    // query but a mix of devices, which the kernels cannot run.
    const at::Tensor* first = nullptr;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!tensors[i]) continue;
      if (!first) first = &*tensors[i];
      OB_CHECK(tensors[i]->device() == first->device(), "input '", op_.inputs[i].name, "' is on ",
               tensors[i]->device().str(), " and another input on ", first->device().str(),
               "; all inputs must be on one device");
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!tensors[i]) {
        dtypes.push_back(std::nullopt);
        shapes.push_back(nullptr);
        continue;
      }
      dtypes.push_back(to_dtype(op_, op_.inputs[i].name, tensors[i]->scalar_type()));
      sizes[i] = tensors[i]->sym_sizes().vec();
      shapes.push_back(&sizes[i]);
    }
    std::vector<DType> out_dtypes = output_dtypes(op_, resolve_types(op_, dtypes));
    auto out_shapes = ShapeInference<c10::SymInt>(op_, shapes, attrs, symbolic).run();
    if (check_only_) return {};
    std::vector<at::Tensor> outputs;
    for (size_t i = 0; i < out_shapes.size(); ++i)
      outputs.push_back(at::empty_symint(out_shapes[i], at::TensorOptions().dtype(to_scalar_type(out_dtypes[i])).device(at::kMeta)));
    return outputs;
  }

  const OpSpec& op_;
  bool meta_;
  bool check_only_;
};

// Defines every op of the registry. Runs at load time, after the op registrations (which have
// a higher init priority, see OPBRIDGE_OP).
struct TorchLibrary {
  TorchLibrary() {
    const LibraryInfo& info = this_library();
    lib = std::make_unique<torch::Library>(torch::Library::FRAGMENT, info.torch_namespace, std::nullopt, __FILE__, __LINE__);
    for (const OpSpec& op : registry().ops()) {
      if (!op.defines_torch_op()) continue;
      // An exception here would abort the process that loads the library: record it instead;
      // the Python loader reports it.
      try {
        lib->def(schema_of(op).c_str());
        lib->impl(op.name.c_str(), torch::dispatch(c10::DispatchKey::CPU, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<BoxedOp>(op, false))));
        // Data-dependent output sizes need fresh symbolic sizes, which only Python's fake
        // tensor mode can make: the glue registers a generic fake kernel for those ops, and
        // it validates the call first through the op's check op (named in the manifest), whose
        // Meta kernel is this adapter's (the same dtype, rank, check and shape-rule validation
        // as every op).
        const std::string check = op.check_op();
        if (check.empty()) {
          lib->impl(op.name.c_str(), torch::dispatch(c10::DispatchKey::Meta, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<BoxedOp>(op, true))));
        } else {
          lib->def(schema_of(op, check, true).c_str());
          lib->impl(check.c_str(), torch::dispatch(c10::DispatchKey::Meta, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<BoxedOp>(op, true, true))));
        }
        // Ops with a backward op get their autograd formula from the glue
        // (torch.library.register_autograd); the others say clearly that none exists.
        if (op.backward.empty())
          lib->impl(op.name.c_str(), torch::dispatch(c10::DispatchKey::Autograd, torch::autograd::autogradNotImplementedFallback()));
      } catch (const c10::Error& e) {
        registry().add_error("op '" + op.name + "': PyTorch rejected schema '" + schema_of(op) +
                             "': " + e.what_without_backtrace());
      } catch (const std::exception& e) {  // e.g. torch::jit::ErrorReport from the schema parser
        registry().add_error("op '" + op.name + "': PyTorch rejected schema '" + schema_of(op) + "': " + e.what());
      }
    }
  }
  std::unique_ptr<torch::Library> lib;
};

const TorchLibrary torch_library;

}  // namespace
}  // namespace opbridge
