// The OpenVINO adapter: every OpSpec of this library as an OpenVINO operation, with no per-op
// code. One class, OpNode, carries any op: its type is the op's ONNX node name in the op's domain,
// its output types and shapes come from the spec's rules (shape_infer.h over ov::Dimension, so a
// dynamic size stays dynamic and a data-dependent one is dynamic), and `evaluate` runs the kernel
// through run_kernel, the path every host shares, with OpenVINO's own thread pool. OpenVINO's CPU
// plugin runs an operation it has no kernel of its own for through `evaluate`.
//
// The library's entry point (create_extensions, OPENVINO_CREATE_EXTENSIONS) gives OpenVINO's ONNX
// frontend one conversion per op: a node of the op's domain and name becomes an OpNode, its
// attributes read by the op's attribute kinds, a symbolic attribute's input folded when constant.
// Built against the headers and CMake package of the `openvino` wheel; loaded with
// ov::Core::add_extension(path).
#include <algorithm>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <openvino/core/extension.hpp>
#include <openvino/core/parallel.hpp>
#include <openvino/frontend/onnx/extension/conversion.hpp>
#include <openvino/frontend/pytorch/extension/conversion.hpp>
#include <openvino/op/constant.hpp>
#include <openvino/op/op.hpp>

#include "opbridge/kernel_call.h"
#include "opbridge/prepare.h"
#include "opbridge/registry.h"
#include "opbridge/shape_infer.h"
#include "opbridge/thread_lease.h"

namespace opbridge {

// Shape rules over OpenVINO's dimensions: a static size is a number, checked as int64; a dynamic
// one stays dynamic through the arithmetic, and a check it takes part in is left to the kernel's
// run (as with PyTorch's symbolic sizes), except that a dynamic size is never known to be zero.
template <>
struct DimTraits<ov::Dimension> {
  using D = ov::Dimension;
  using I = DimTraits<int64_t>;
  static D from(int64_t v) { return v == kDataDependentDim ? D::dynamic() : D(v); }
  static bool eq(const D& a, const D& b) {
    if (a.is_static() && b.is_static()) return a.get_length() == b.get_length();
    return !(zero(a) || zero(b));
  }
  static std::optional<bool> maybe_ge(const D& a, const D& b) {
    return both(a, b) ? std::optional<bool>(a.get_length() >= b.get_length()) : std::nullopt;
  }
  static std::optional<bool> maybe_gt(const D& a, const D& b) {
    return both(a, b) ? std::optional<bool>(a.get_length() > b.get_length()) : std::nullopt;
  }
  static bool known_negative(const D& a) { return a.is_static() && a.get_length() < 0; }
  static D add(const D& a, const D& b) { return both(a, b) ? D(I::add(a.get_length(), b.get_length())) : D::dynamic(); }
  static D sub(const D& a, const D& b) { return both(a, b) ? D(I::sub(a.get_length(), b.get_length())) : D::dynamic(); }
  static D mul(const D& a, const D& b) { return both(a, b) ? D(I::mul(a.get_length(), b.get_length())) : D::dynamic(); }
  static D floordiv(const D& a, const D& b) {
    return both(a, b) ? D(I::floordiv(a.get_length(), b.get_length())) : D::dynamic();
  }

 private:
  static bool both(const D& a, const D& b) { return a.is_static() && b.is_static(); }
  static bool zero(const D& a) { return a.is_static() && a.get_length() == 0; }
};

namespace {

ov::element::Type to_ov(DType t) {
  switch (t) {
    case DType::Float32: return ov::element::f32;
    case DType::Float64: return ov::element::f64;
    case DType::Int32: return ov::element::i32;
    case DType::Int64: return ov::element::i64;
    case DType::Bool: return ov::element::boolean;
    case DType::UInt8: return ov::element::u8;
    case DType::Float16: return ov::element::f16;
    case DType::BFloat16: return ov::element::bf16;
    case DType::Int8: return ov::element::i8;
    case DType::Int16: return ov::element::i16;
  }
  return ov::element::dynamic;
}

std::optional<DType> from_ov(const ov::element::Type& t) {
  switch (ov::element::Type_t(t)) {  // a switch: evaluate asks once per input per call
    case ov::element::Type_t::f32: return DType::Float32;
    case ov::element::Type_t::f64: return DType::Float64;
    case ov::element::Type_t::i32: return DType::Int32;
    case ov::element::Type_t::i64: return DType::Int64;
    case ov::element::Type_t::boolean: return DType::Bool;
    case ov::element::Type_t::u8: return DType::UInt8;
    case ov::element::Type_t::f16: return DType::Float16;
    case ov::element::Type_t::bf16: return DType::BFloat16;
    case ov::element::Type_t::i8: return DType::Int8;
    case ov::element::Type_t::i16: return DType::Int16;
    default: return std::nullopt;
  }
}

// OpenVINO's CPU plugin carries int64 as int32 and float64 as float32 (it lowers a model's
// precisions when it compiles it, an opbridge node's inputs included). An op whose constraint
// allows only the wide type gets its inputs widened and its outputs narrowed back, and a value
// that does not fit int32 is an error naming the output, never a wrapped one.
std::optional<DType> wide_of(DType d) {
  if (d == DType::Int32) return DType::Int64;
  if (d == DType::Float32) return DType::Float64;
  return std::nullopt;
}

template <typename From, typename To>
void cast_values(const void* src, void* dst, size_t n, const char* what) {
  const From* in = static_cast<const From*>(src);
  To* out = static_cast<To*>(dst);
  for (size_t k = 0; k < n; ++k) {
    if constexpr (std::is_integral_v<To> && sizeof(To) < sizeof(From))
      OB_CHECK(in[k] >= std::numeric_limits<To>::min() && in[k] <= std::numeric_limits<To>::max(), what, " holds ",
               in[k], ", past the int32 that OpenVINO's CPU plugin carries int64 as");
    out[k] = static_cast<To>(in[k]);
  }
}

void cast(const void* src, DType from, void* dst, DType to, size_t n, const char* what) {
  using D = DType;
  if (from == D::Int32 && to == D::Int64) return cast_values<int32_t, int64_t>(src, dst, n, what);
  if (from == D::Int64 && to == D::Int32) return cast_values<int64_t, int32_t>(src, dst, n, what);
  if (from == D::Float32 && to == D::Float64) return cast_values<float, double>(src, dst, n, what);
  if (from == D::Float64 && to == D::Float32) return cast_values<double, float>(src, dst, n, what);
  throw Error(detail::concat(what, ": no conversion from ", dtype_name(from), " to ", dtype_name(to)));
}

// OpenVINO identifies an operation's kind by its type info, whose strings it keeps by pointer:
// one per op, alive as long as the library. The name is "<domain>.<node type>": with the node
// type alone, an op named like one of the CPU plugin's own operations crashed the plugin while it
// compiled the model (it took the node for its own).
const ov::DiscreteTypeInfo& type_info(const OpSpec& op) {
  struct Info {
    std::string name;
    std::unique_ptr<ov::DiscreteTypeInfo> info;
  };
  static std::mutex mu;
  static std::map<const OpSpec*, Info> infos;
  std::lock_guard<std::mutex> lock(mu);
  Info& i = infos[&op];
  if (!i.info) {
    i.name = op.export_as.onnx_domain + "." + op.export_as.onnx_name;
    i.info = std::make_unique<ov::DiscreteTypeInfo>(i.name.c_str(), op.export_as.onnx_domain.c_str(),
                                                    &ov::op::Op::get_type_info_static());
  }
  return *i.info;
}

bool same_shape(const ov::Shape& a, const Shape& b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](size_t x, int64_t y) { return static_cast<int64_t>(x) == y; });
}

// OpenVINO's pool as a kernel's host; outputs are the evaluate call's tensors, shaped here.
class OvHost final : public KernelHost {
 public:
  explicit OvHost(ov::TensorVector& outputs) : outputs_(outputs) {}
  void* output_memory(size_t i, DType dtype, const Shape& shape) override {
    ov::Tensor& t = outputs_.at(i);
    // The plugin hands a node of static shapes its outputs allocated and shaped: then nothing is
    // built here (an ov::Shape per call was a fifth of the adapter's per-call work).
    if (!t) t = ov::Tensor(to_ov(dtype), ov::Shape(shape.begin(), shape.end()));
    else if (!same_shape(t.get_shape(), shape)) t.set_shape(ov::Shape(shape.begin(), shape.end()));
    if (t.get_element_type() == to_ov(dtype)) return t.data();
    scratch_.resize(outputs_.size());
    Scratch& k = scratch_[i];  // the plugin's narrower type: the kernel writes here, finish() casts
    k.dtype = dtype;
    k.bytes.resize(t.get_size() * dtype_size(dtype));
    return k.bytes.data();
  }
  // Narrows what the kernel wrote into outputs of another element type.
  void finish(const OpSpec& op) {
    for (size_t i = 0; i < scratch_.size(); ++i) {
      if (scratch_[i].bytes.empty()) continue;
      ov::Tensor& t = outputs_[i];
      const auto to = from_ov(t.get_element_type());
      const std::string what = "output '" + op.outputs[i].name + "'";
      OB_CHECK(to, what, " has element type ", t.get_element_type().get_type_name(), ", which opbridge does not write");
      cast(scratch_[i].bytes.data(), scratch_[i].dtype, t.data(), *to, t.get_size(), what.c_str());
    }
  }
  void parallel_for(int64_t n, int64_t grain, ParallelBody fn) override {
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    const auto ceil_div = [](int64_t a, int64_t d) { return a / d + (a % d != 0); };
    const int64_t chunks = std::min<int64_t>(ceil_div(n, grain), 1024), chunk = ceil_div(n, chunks);
    if (chunks == 1) return fn(0, n);
    std::mutex mu;
    std::exception_ptr error;  // exceptions must not cross the pool: the first is rethrown here
    ov::parallel_for(static_cast<size_t>(chunks), [&](size_t c) {
      const int64_t begin = static_cast<int64_t>(c) * chunk, end = std::min(n, begin + chunk);
      try {
        if (begin < end) fn(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
    });
    if (error) std::rethrow_exception(error);
  }

 private:
  struct Scratch {
    DType dtype = DType::Float32;
    std::vector<uint8_t> bytes;
  };
  ov::TensorVector& outputs_;
  std::vector<Scratch> scratch_;
};

// One node of any op. `slots[i]` is the node input that carries op input i (then the symbolic
// attributes' inputs, in OpSpec::symbolic_attrs order), -1 where absent.
class OpNode final : public ov::op::Op {
  struct Shared;

 public:
  OpNode(const OpSpec& op, const ov::OutputVector& args, std::vector<AttrValue> attrs, std::vector<int> slots,
         std::string node_name)
      : OpNode(op, args, make_shared_data(op, std::move(attrs), std::move(slots)),
               node_name.empty() ? op.export_as.onnx_name : node_name) {}

  // A clone shares the node's attributes and its last validation (make_shared needs it public).
  OpNode(const OpSpec& op, const ov::OutputVector& args, std::shared_ptr<Shared> shared, const std::string& name)
      : ov::op::Op(args), op_(op), d_(std::move(shared)) {
    set_friendly_name(name);
    constructor_validate_and_infer_types();
  }

  const ov::DiscreteTypeInfo& get_type_info() const override { return type_info(op_); }

  void validate_and_infer_types() override {
    // In a model of dynamic sizes the CPU plugin infers this node's output shapes on every
    // inference by cloning it onto the inputs' sizes and validating the clone (it has no shape
    // inference of its own for the node): the rules' answer for the same input types and static
    // sizes is kept, and a clone is a few shared pointers.
    thread_local std::vector<int64_t> key;
    const bool keyed = static_key(key);
    if (keyed) {
      std::lock_guard<std::mutex> lock(d_->mu);
      if (d_->last_valid && d_->last_key == key) {
        for (size_t o = 0; o < d_->last_types.size(); ++o) set_output_type(o, d_->last_types[o], d_->last_shapes[o]);
        return;
      }
    }
    const size_t n_in = op_.inputs.size();
    std::vector<std::optional<DType>> dtypes(n_in);
    std::vector<std::vector<ov::Dimension>> shapes(n_in);
    std::vector<const std::vector<ov::Dimension>*> present(n_in, nullptr);
    bool ranks_known = true;
    for (size_t i = 0; i < n_in; ++i) {
      if (d_->slots[i] < 0) continue;
      const auto t = get_input_element_type(d_->slots[i]);
      if (t.is_static()) {
        dtypes[i] = from_ov(t);
        if (!dtypes[i]) fail("input '" + op_.inputs[i].name + "' has element type " + t.get_type_name() +
                             ", which opbridge kernels do not take");
        const auto wide = wide_of(*dtypes[i]);
        if (wide && !contains(*d_->allowed[i], *dtypes[i]) && contains(*d_->allowed[i], *wide)) dtypes[i] = *wide;
      }
      const ov::PartialShape& ps = get_input_partial_shape(d_->slots[i]);
      if (ps.rank().is_dynamic()) ranks_known = false;
      else shapes[i].assign(ps.begin(), ps.end());
      present[i] = &shapes[i];
    }
    std::vector<DType> out_types;
    std::vector<std::vector<ov::Dimension>> out_shapes;
    try {
      out_types = output_dtypes(op_, resolve_types(op_, dtypes));
      if (ranks_known) {
        std::vector<std::optional<ov::Dimension>> symbolic(op_.attrs.size());
        for (size_t j = 0; j < d_->sym.size(); ++j)
          if (d_->slots[n_in + j] >= 0) symbolic[d_->sym[j]] = ov::Dimension::dynamic();  // read when it runs
        out_shapes = ShapeInference<ov::Dimension>(op_, present, d_->attrs, symbolic).run();
      }
    } catch (const std::exception& e) {
      fail(e.what());
    }
    std::vector<ov::element::Type> types;
    std::vector<ov::PartialShape> partial;
    for (size_t o = 0; o < op_.outputs.size(); ++o) {
      types.push_back(to_ov(out_types[o]));
      partial.push_back(ranks_known ? ov::PartialShape(out_shapes[o]) : ov::PartialShape::dynamic());
      set_output_type(o, types[o], partial[o]);
    }
    if (keyed) {
      std::lock_guard<std::mutex> lock(d_->mu);
      d_->last_key = key;
      d_->last_types = std::move(types);
      d_->last_shapes = std::move(partial);
      d_->last_valid = true;
    }
  }

  std::shared_ptr<ov::Node> clone_with_new_inputs(const ov::OutputVector& args) const override {
    return std::make_shared<OpNode>(op_, args, d_, get_friendly_name());
  }

  bool visit_attributes(ov::AttributeVisitor& v) override {
    // A visitor may set the attributes: this node gets its own copy, apart from its clones.
    d_ = make_shared_data(op_, d_->attrs, d_->slots);
    for (size_t i = 0; i < op_.attrs.size(); ++i) {
      const std::string& name = op_.attrs[i].name;
      std::visit([&](auto& value) {
        using V = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<V, std::vector<double>>) {  // OpenVINO's visitors take float lists
          std::vector<float> f(value.begin(), value.end());
          v.on_attribute(name, f);
          value.assign(f.begin(), f.end());
        } else {
          v.on_attribute(name, value);
        }
      }, d_->attrs[i]);
    }
    return true;
  }

  bool has_evaluate() const override { return true; }

  bool evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const override {
    // Storage kept per thread: for a small op the allocations were most of the per-call cost.
    thread_local Buffers kept;
    ThreadLease<Buffers> lease(kept);
    Buffers& b = lease.get();
    const size_t n_in = op_.inputs.size();
    b.views.resize(n_in);
    b.args.assign(n_in, nullptr);
    b.widened.resize(n_in);
    try {
      for (size_t i = 0; i < n_in; ++i) {
        if (d_->slots[i] < 0) continue;
        const ov::Tensor& t = inputs.at(d_->slots[i]);
        const auto dtype = from_ov(t.get_element_type());
        OB_CHECK(dtype, "input '", op_.inputs[i].name, "' has element type ", t.get_element_type().get_type_name(),
                 ", which opbridge kernels do not take");
        TensorView& view = b.views[i];
        view.dtype = *dtype;
        const ov::Shape& shape = t.get_shape();
        if (!same_shape(shape, view.shape)) {  // the thread's last view of this input kept its strides
          view.shape.assign(shape.begin(), shape.end());
          contiguous_strides(view.shape, view.strides);
        }
        view.data = const_cast<void*>(t.data());
        const auto wide = wide_of(*dtype);
        if (wide && !contains(*d_->allowed[i], *dtype)) {  // the plugin narrowed it
          b.widened[i].resize(t.get_size() * dtype_size(*wide));
          cast(t.data(), *dtype, b.widened[i].data(), *wide, t.get_size(), op_.inputs[i].name.c_str());
          view.dtype = *wide;
          view.data = b.widened[i].data();
        }
        b.args[i] = &view;
      }
      const std::vector<AttrValue>* attrs = &d_->attrs;
      for (size_t j = 0; j < d_->sym.size(); ++j) {
        if (d_->slots[n_in + j] < 0) continue;
        if (attrs == &d_->attrs) b.attrs = d_->attrs, attrs = &b.attrs;
        const ov::Tensor& t = inputs.at(d_->slots[n_in + j]);
        // int64, or the int32 the CPU plugin carries it as
        const bool i64 = t.get_element_type() == ov::element::i64, i32 = t.get_element_type() == ov::element::i32;
        const size_t a = d_->sym[j];
        OB_CHECK((i64 || i32) && t.get_size() == 1, "input '", op_.attrs[a].name, "_value' gives attribute '",
                 op_.attrs[a].name, "' and must be an int64 scalar or 1-element tensor");
        b.attrs[a] = i64 ? *static_cast<const int64_t*>(t.data()) : int64_t{*static_cast<const int32_t*>(t.data())};
      }
      OvHost host(outputs);
      run_kernel(op_, b.args, *attrs, host, b.call);
      host.finish(op_);
    } catch (const std::exception& e) {
      fail(e.what());
    }
    return true;
  }

 private:
  static const std::vector<DType>& allowed_types(const OpSpec& op, const std::string& constraint) {
    for (const TypeConstraint& t : op.types)
      if (t.name == constraint) return t.allowed;
    static const std::vector<DType> none;
    return none;
  }
  static bool contains(const std::vector<DType>& v, DType d) { return std::find(v.begin(), v.end(), d) != v.end(); }

  [[noreturn]] void fail(const std::string& why) const {
    OPENVINO_THROW(op_.qualified_name(), " (node '", get_friendly_name(), "'): ", why);
  }

  // What a node and its clones share: fixed when the node is made, and the last validation.
  struct Shared {
    std::vector<AttrValue> attrs;
    std::vector<int> slots;
    std::vector<size_t> sym;                          // op.symbolic_attrs()
    std::vector<const std::vector<DType>*> allowed;  // per op input, its constraint's dtypes
    std::mutex mu;  // guards the rest: clones validate on any thread
    bool last_valid = false;
    std::vector<int64_t> last_key;  // static_key's
    std::vector<ov::element::Type> last_types;
    std::vector<ov::PartialShape> last_shapes;
  };
  static std::shared_ptr<Shared> make_shared_data(const OpSpec& op, std::vector<AttrValue> attrs,
                                                  std::vector<int> slots) {
    auto d = std::make_shared<Shared>();
    d->attrs = std::move(attrs);
    d->slots = std::move(slots);
    d->sym = op.symbolic_attrs();
    for (const InputSpec& in : op.inputs) d->allowed.push_back(&allowed_types(op, in.type));
    return d;
  }

  // The node's inputs' element types and sizes as numbers, when all are static.
  bool static_key(std::vector<int64_t>& key) const {
    key.clear();
    for (size_t k = 0; k < get_input_size(); ++k) {
      const ov::element::Type& t = get_input_element_type(k);
      const ov::PartialShape& ps = get_input_partial_shape(k);
      if (t.is_dynamic() || ps.is_dynamic()) return false;
      key.push_back(static_cast<int64_t>(ov::element::Type_t(t)));
      key.push_back(static_cast<int64_t>(ps.size()));
      for (const ov::Dimension& d : ps) key.push_back(d.get_length());
    }
    return true;
  }

  struct Buffers {
    std::vector<TensorView> views;
    std::vector<const TensorView*> args;
    std::vector<std::vector<uint8_t>> widened;
    std::vector<AttrValue> attrs;  // the node's, with the symbolic attributes' inputs applied
    CallBuffers call;
    bool in_use = false;
  };

  const OpSpec& op_;
  std::shared_ptr<Shared> d_;  // replaced only by visit_attributes
};

// ---- the ONNX frontend ------------------------------------------------------------------------
// The node's value for attribute `a` as the ONNX frontend reads it (int64, float, string, lists).
std::optional<AttrValue> read_attr(const ov::frontend::NodeContext& node, const AttrSpec& a) {
  ov::Any v = node.get_attribute_as_any(a.name);
  if (v.empty()) return std::nullopt;
  if (v.is<int64_t>()) {
    if (a.kind == AttrKind::Bool) return AttrValue{v.as<int64_t>() != 0};
    if (a.kind == AttrKind::Int) return AttrValue{v.as<int64_t>()};
  }
  if (v.is<double>() && a.kind == AttrKind::Float) return AttrValue{v.as<double>()};
  if (v.is<float>() && a.kind == AttrKind::Float) return AttrValue{double{v.as<float>()}};
  if (v.is<std::string>() && a.kind == AttrKind::String) return AttrValue{v.as<std::string>()};
  if (v.is<std::vector<int64_t>>() && a.kind == AttrKind::Ints) return AttrValue{v.as<std::vector<int64_t>>()};
  if (v.is<std::vector<double>>() && a.kind == AttrKind::Floats) return AttrValue{v.as<std::vector<double>>()};
  if (v.is<std::vector<float>>() && a.kind == AttrKind::Floats) {
    const auto f = v.as<std::vector<float>>();
    return AttrValue{std::vector<double>(f.begin(), f.end())};
  }
  throw Error(detail::concat("attribute '", a.name, "' must be ", attr_kind_name(a.kind), ", got ",
                             v.type_info().name()));
}

// An input the ONNX model leaves empty ("") reaches a converter as the frontend's null node.
bool absent(const ov::Output<ov::Node>& in) {
  return !in.get_node() || std::string(in.get_node()->get_type_name()) == "NullNode";
}

ov::OutputVector convert(const OpSpec& op, const ov::frontend::NodeContext& node) {
  const std::string where = op.qualified_name() + " (node '" + node.get_name() + "')";
  try {
    const size_t n_in = op.inputs.size();
    const std::vector<size_t> sym = op.symbolic_attrs();
    const size_t given = node.get_input_size();
    OB_CHECK(given <= n_in + sym.size(), "the node has ", given, " inputs; the op takes at most ", n_in + sym.size());
    std::vector<std::optional<AttrValue>> attrs;
    for (const AttrSpec& a : op.attrs) attrs.push_back(read_attr(node, a));
    ov::OutputVector args;
    std::vector<int> slots(n_in + sym.size(), -1);
    for (size_t i = 0; i < given; ++i) {
      ov::Output<ov::Node> in = node.get_input(static_cast<int>(i));
      if (absent(in)) continue;
      if (i >= n_in) {  // a symbolic attribute's input: a constant one is the attribute itself
        if (auto c = ov::as_type_ptr<ov::op::v0::Constant>(in.get_node_shared_ptr())) {
          const auto v = c->cast_vector<int64_t>();
          OB_CHECK(v.size() == 1, "input '", op.attrs[sym[i - n_in]].name, "_value' must hold one value");
          attrs[sym[i - n_in]] = AttrValue{v[0]};
          continue;
        }
        if (!attrs[sym[i - n_in]]) attrs[sym[i - n_in]] = AttrValue{int64_t{0}};  // the input decides
      }
      slots[i] = static_cast<int>(args.size());
      args.push_back(in);
    }
    auto n = std::make_shared<OpNode>(op, args, resolve_attrs(op, std::move(attrs)), std::move(slots), node.get_name());
    return n->outputs();
  } catch (const ov::Exception&) {
    throw;  // OpNode's own, already naming the op and node
  } catch (const std::exception& e) {
    OPENVINO_THROW(where, ": ", e.what());
  }
}

// ---- the PyTorch frontend ---------------------------------------------------------------------
// openvino.convert_model of a PyTorch model: a call of the op is a node whose inputs follow its
// PyTorch schema, the op's inputs then its attributes (OpSpec order), an attribute a constant,
// None where an optional input or a defaulted attribute is left out. A symbolic attribute that
// the model computes from sizes is not a constant: it becomes the node's input, read when it runs.
std::optional<AttrValue> torch_attr(const ov::frontend::NodeContext& node, int i, const AttrSpec& a) {
  ov::Any v = node.get_values_from_const_input(i);
  if (v.empty()) return std::nullopt;
  switch (a.kind) {
    case AttrKind::Int: return AttrValue{v.as<int64_t>()};
    case AttrKind::Bool: return AttrValue{v.as<bool>()};
    case AttrKind::Float: return AttrValue{v.as<double>()};
    case AttrKind::String: return AttrValue{v.as<std::string>()};
    case AttrKind::Ints: return AttrValue{v.as<std::vector<int64_t>>()};
    case AttrKind::Floats: return AttrValue{v.as<std::vector<double>>()};
  }
  return std::nullopt;
}

ov::OutputVector convert_torch(const OpSpec& op, const ov::frontend::NodeContext& node) {
  const std::string where = op.qualified_name();  // the PyTorch frontend's calls have no name
  try {
    const size_t n_in = op.inputs.size();
    const std::vector<size_t> sym = op.symbolic_attrs();
    OB_CHECK(static_cast<size_t>(node.get_input_size()) <= n_in + op.attrs.size(), "the call has ",
             node.get_input_size(), " arguments; the op takes ", n_in + op.attrs.size());
    ov::OutputVector args;
    std::vector<int> slots(n_in + sym.size(), -1);
    for (size_t i = 0; i < n_in && i < static_cast<size_t>(node.get_input_size()); ++i) {
      if (node.input_is_none(i)) continue;
      slots[i] = static_cast<int>(args.size());
      args.push_back(node.get_input(static_cast<int>(i)));
    }
    std::vector<std::optional<AttrValue>> attrs(op.attrs.size());
    for (size_t j = 0; j < op.attrs.size() && n_in + j < static_cast<size_t>(node.get_input_size()); ++j) {
      const int i = static_cast<int>(n_in + j);
      if (node.input_is_none(i)) continue;
      const auto s = std::find(sym.begin(), sym.end(), j);
      try {
        attrs[j] = torch_attr(node, i, op.attrs[j]);
      } catch (const std::exception&) {
        OB_CHECK(s != sym.end(), "attribute '", op.attrs[j].name, "' must be a constant");
      }
      if (!attrs[j] && s != sym.end()) {  // computed from sizes: an input of the node
        slots[n_in + static_cast<size_t>(s - sym.begin())] = static_cast<int>(args.size());
        args.push_back(node.get_input(i));
        attrs[j] = AttrValue{int64_t{0}};  // the input decides
      }
    }
    auto n = std::make_shared<OpNode>(op, args, resolve_attrs(op, std::move(attrs)), std::move(slots), "");
    return n->outputs();
  } catch (const ov::Exception&) {
    throw;
  } catch (const std::exception& e) {
    OPENVINO_THROW(where, ": ", e.what());
  }
}

std::vector<ov::Extension::Ptr> extensions() {
  std::vector<ov::Extension::Ptr> out;
  for (const OpSpec& op : registry().ops()) {
    if (!op.cpu_kernel) continue;  // exported as standard ops or functions: nothing to run here
    const OpSpec* spec = &op;
    out.push_back(std::make_shared<ov::frontend::onnx::ConversionExtension>(
        op.export_as.onnx_name, op.export_as.onnx_domain,
        [spec](const ov::frontend::NodeContext& node) { return convert(*spec, node); }));
    // The PyTorch frontend names a call by the op's qualified name (a TorchScript trace) or by
    // its overload's (torch.export: "<namespace>.<op>.default").
    const std::string qualified = op.qualified_name();
    std::string dotted = qualified;
    dotted.replace(dotted.find("::"), 2, ".");
    for (const std::string& name : {qualified, dotted + ".default"})
      out.push_back(std::make_shared<ov::frontend::pytorch::ConversionExtension>(
          name, [spec](const ov::frontend::NodeContext& node) { return convert_torch(*spec, node); }));
  }
  return out;
}

}  // namespace
}  // namespace opbridge

OPENVINO_CREATE_EXTENSIONS(opbridge::extensions());
