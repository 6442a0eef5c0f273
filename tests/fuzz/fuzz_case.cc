#include "fuzz_case.h"

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include <opbridge/prepare.h>
#include <opbridge/registry.h>
#include <opbridge/shape_infer.h>
#include <opbridge/testing/kernel_harness.h>

namespace opbridge::fuzz {

// ---- element types --------------------------------------------------------------------------

int onnx_type_of(DType t) {
  switch (t) {
    case DType::Float32: return onnx_type::Float;
    case DType::Float64: return onnx_type::Double;
    case DType::Int32: return onnx_type::Int32;
    case DType::Int64: return onnx_type::Int64;
    case DType::Bool: return onnx_type::Bool;
    case DType::UInt8: return onnx_type::UInt8;
    case DType::Float16: return onnx_type::Float16;
    case DType::BFloat16: return onnx_type::BFloat16;
    case DType::Int8: return onnx_type::Int8;
    case DType::Int16: return onnx_type::Int16;
  }
  return 0;
}

std::optional<DType> dtype_of_onnx(int t) {
  for (DType d : kAllDTypes)
    if (onnx_type_of(d) == t) return d;
  return std::nullopt;
}

size_t onnx_type_size(int t) {
  switch (t) {
    case onnx_type::Float: case onnx_type::Int32: return 4;
    case onnx_type::Double: case onnx_type::Int64: return 8;
    case onnx_type::UInt8: case onnx_type::Int8: case onnx_type::Bool: return 1;
    case onnx_type::UInt16: case onnx_type::Int16: case onnx_type::Float16: case onnx_type::BFloat16: return 2;
  }
  return 1;
}

std::string onnx_type_name(int t) {
  if (auto d = dtype_of_onnx(t)) return std::string(dtype_name(*d));
  switch (t) {
    case onnx_type::Int8: return "int8";
    case onnx_type::UInt16: return "uint16";
    case onnx_type::Float16: return "float16";
    case onnx_type::BFloat16: return "bfloat16";
  }
  return "onnx_type_" + std::to_string(t);
}

int64_t InputCase::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d == 0) return 0;
    n = (n > INT64_MAX / std::max<int64_t>(d, 1)) ? INT64_MAX : n * d;
  }
  return n;
}

void InputCase::allocate() {
  nbytes = static_cast<size_t>(numel()) * onnx_type_size(onnx_type);
  data.reset(new std::byte[nbytes]);  // new[0] for an empty tensor: any access is out of bounds
}

namespace {

// ---- randomness -----------------------------------------------------------------------------
// Self-contained (no std distributions, whose results may differ between standard libraries),
// so a seed means the same case everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int64_t range(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool chance(double p) { return real() < p; }
  double real() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double real(double lo, double hi) { return lo + (hi - lo) * real(); }
  template <typename T>
  const T& pick(const std::vector<T>& v) { return v[static_cast<size_t>(range(0, static_cast<int64_t>(v.size()) - 1))]; }

 private:
  uint64_t s_;
};

constexpr int64_t kMaxElements = 1 << 18;  // per input (a "large" case goes up to this)
constexpr int64_t kSmallElements = 600;    // typical cases stay below this

const std::vector<int64_t> kHugeDims = {(1ll << 31) - 1, 1ll << 31, (1ll << 32) + 1, 1ll << 40, 1ll << 62, INT64_MAX};
const std::vector<int64_t> kSpecialInts = {0, -1, -2, 1ll << 31, 1ll << 40, 1ll << 62, INT64_MAX, INT64_MIN, INT32_MIN};
const std::vector<double> kPalette = {1, 0.5, 2, 1.5, 3, 0.25, 0, -1, 4, 0.7, 1.25, 0.1};
const std::vector<double> kSpecialFloats = {NAN, INFINITY, -INFINITY, 1e30, -1e30, FLT_MAX, -FLT_MAX, 1e-40,
                                            -0.0, 1e-30, 3e9, 1e300, -1e300, 5e-324};

// The mutations a case may get (at most one; the rest of the case is valid by construction).
enum class Mut {
  None, ZeroDim, HugeDim, Large, Rank, Dim, DtypeDisallowed, DtypeMixed, AttrMissing, AttrWrongKind,
  AttrOutOfRange, AttrUnknown, InputOmitted, InputsDropped, InputExtra, OutputsFewer, OutputsExtra, ValuesSpecial
};
const char* mut_name(Mut m) {
  switch (m) {
    case Mut::None: return "valid";
    case Mut::ZeroDim: return "zero-dim";
    case Mut::HugeDim: return "huge-dim";
    case Mut::Large: return "large";
    case Mut::Rank: return "rank";
    case Mut::Dim: return "dim";
    case Mut::DtypeDisallowed: return "dtype-disallowed";
    case Mut::DtypeMixed: return "dtype-mixed";
    case Mut::AttrMissing: return "attr-missing";
    case Mut::AttrWrongKind: return "attr-wrong-kind";
    case Mut::AttrOutOfRange: return "attr-out-of-range";
    case Mut::AttrUnknown: return "attr-unknown";
    case Mut::InputOmitted: return "input-omitted";
    case Mut::InputsDropped: return "inputs-dropped";
    case Mut::InputExtra: return "input-extra";
    case Mut::OutputsFewer: return "outputs-fewer";
    case Mut::OutputsExtra: return "outputs-extra";
    case Mut::ValuesSpecial: return "values-special";
  }
  return "?";
}

OnnxAttr make_attr(const std::string& name, const AttrValue& v) {
  OnnxAttr a;
  a.name = name;
  switch (attr_kind_of(v)) {
    case AttrKind::Int: a.type = OnnxAttrType::Int, a.i = std::get<int64_t>(v); break;
    case AttrKind::Bool: a.type = OnnxAttrType::Int, a.i = std::get<bool>(v) ? 1 : 0; break;
    case AttrKind::Float: a.type = OnnxAttrType::Float, a.f = static_cast<float>(std::get<double>(v)); break;
    case AttrKind::String: a.type = OnnxAttrType::String, a.s = std::get<std::string>(v); break;
    case AttrKind::Ints: a.type = OnnxAttrType::Ints, a.ints = std::get<std::vector<int64_t>>(v); break;
    case AttrKind::Floats: {
      a.type = OnnxAttrType::Floats;
      for (double d : std::get<std::vector<double>>(v)) a.floats.push_back(static_cast<float>(d));
      break;
    }
  }
  return a;
}

std::string attr_str(const OnnxAttr& a) {
  std::ostringstream os;
  os.precision(9);
  os << a.name << "=";
  auto list = [&](const auto& v) {
    os << "[";
    for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
    os << "]";
  };
  switch (a.type) {
    case OnnxAttrType::Int: os << a.i; break;
    case OnnxAttrType::Float: os << a.f << "f"; break;
    case OnnxAttrType::String: os << '"' << a.s << '"'; break;
    case OnnxAttrType::Tensor: os << "tensor(" << a.f << ")"; break;
    case OnnxAttrType::Ints: list(a.ints); break;
    case OnnxAttrType::Floats: list(a.floats), os << "f"; break;
    case OnnxAttrType::Strings: os << "strings"; list(a.strings); break;
  }
  return os.str();
}

// ---- the generator --------------------------------------------------------------------------
class Generator {
 public:
  Generator(const OpSpec& op, uint64_t seed) : op_(op), r_(seed) {
    c_.seed = seed;
    c_.op = &op;
  }

  Case run() {
    choose_mutation();
    choose_dtypes();
    // A few tries at a call the spec accepts (its shape rules and checks hold); mutations that
    // must survive come after.
    for (int attempt = 0; attempt < 16; ++attempt) {
      notes_.clear();
      attrs_.clear();
      choose_presence();
      choose_attrs();
      choose_shapes();
      if (mut_ == Mut::ZeroDim || (mut_ == Mut::None && r_.chance(0.12))) zero_dim();
      if (mut_ == Mut::HugeDim || (mut_ == Mut::None && r_.chance(0.04))) huge_dim();
      repair();
      cap_sizes();
      if (spec_accepts()) break;
    }
    c_.mutations = notes_;
    mutate_after_repair();
    build_node();
    fill_values();
    if (mut_ != Mut::None) c_.mutations.insert(c_.mutations.begin(), mut_name(mut_));
    return std::move(c_);
  }

 private:
  size_t n_in() const { return op_.inputs.size(); }

  void choose_mutation() {
    if (r_.chance(0.45)) return;
    std::vector<Mut> all = {Mut::ZeroDim, Mut::HugeDim, Mut::Large, Mut::Rank, Mut::Dim, Mut::DtypeDisallowed,
                            Mut::AttrWrongKind, Mut::AttrUnknown, Mut::InputOmitted, Mut::InputsDropped,
                            Mut::InputExtra, Mut::OutputsFewer, Mut::OutputsExtra, Mut::ValuesSpecial};
    bool shared_type = false, required_attr = false, any_attr = !op_.attrs.empty(), numeric_attr = false;
    for (size_t i = 0; i < n_in(); ++i)
      for (size_t j = i + 1; j < n_in(); ++j)
        shared_type |= op_.inputs[i].type == op_.inputs[j].type && op_.type(op_.inputs[i].type).allowed.size() > 1;
    for (const AttrSpec& a : op_.attrs) {
      required_attr |= !a.default_value.has_value();
      numeric_attr |= a.kind != AttrKind::String;
    }
    if (shared_type) all.push_back(Mut::DtypeMixed);
    if (required_attr) all.push_back(Mut::AttrMissing);
    if (numeric_attr) all.insert(all.end(), {Mut::AttrOutOfRange, Mut::AttrOutOfRange});
    if (!any_attr) all.erase(std::remove(all.begin(), all.end(), Mut::AttrWrongKind), all.end());
    mut_ = r_.pick(all);
  }

  void choose_dtypes() {
    std::map<std::string, int> chosen;
    for (const TypeConstraint& t : op_.types) chosen[t.name] = onnx_type_of(r_.pick(t.allowed));
    type_.resize(n_in());
    for (size_t i = 0; i < n_in(); ++i) type_[i] = chosen[op_.inputs[i].type];
  }

  // Optional inputs all given, all omitted, or each at random (ops often want them together).
  void choose_presence() {
    present_.resize(n_in());
    const int how = static_cast<int>(r_.range(0, 2));
    for (size_t i = 0; i < n_in(); ++i) present_[i] = !op_.inputs[i].optional || (how == 2 ? r_.chance(0.5) : how == 0);
    c_.drop_trailing_omitted = r_.chance(0.5);
  }

  bool spec_accepts() const {
    std::vector<TensorView> views(n_in());
    std::vector<const TensorView*> in(n_in(), nullptr);
    for (size_t i = 0; i < n_in(); ++i) {
      if (!present_[i]) continue;
      views[i] = TensorView{nullptr, *dtype_of_onnx(type_[i]), shape_[i], {}};
      in[i] = &views[i];
    }
    try {
      prepare_call(op_, in, resolved_attrs());
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }

  // ---- attributes ----
  int64_t near_int(int64_t def) {
    if (r_.chance(0.75)) return def >= 1 ? r_.range(def, def + 2) : def + r_.range(-1, 2);
    return r_.range(0, 4);
  }
  AttrValue attr_value(const AttrSpec& a) {
    const std::optional<AttrValue>& d = a.default_value;
    switch (a.kind) {
      case AttrKind::Int: return d ? near_int(std::get<int64_t>(*d)) : r_.range(1, 3);
      case AttrKind::Bool: return r_.chance(0.5);
      case AttrKind::Float: {
        double def = d ? std::get<double>(*d) : 1.0;
        return r_.chance(0.5) ? def * r_.pick(kPalette) : r_.real(-2, 2);
      }
      case AttrKind::String: return d && r_.chance(0.7) ? std::get<std::string>(*d) : std::string(r_.chance(0.5) ? "" : "x");
      case AttrKind::Ints: {
        std::vector<int64_t> def = d ? std::get<std::vector<int64_t>>(*d) : std::vector<int64_t>{1, 1};
        if (r_.chance(0.1)) def.resize(static_cast<size_t>(r_.range(0, 4)), 1);
        for (int64_t& v : def) v = r_.chance(0.5) ? v : near_int(v);
        return def;
      }
      case AttrKind::Floats: {
        std::vector<double> def = d ? std::get<std::vector<double>>(*d) : std::vector<double>{1, 1};
        if (r_.chance(0.1)) def.resize(static_cast<size_t>(r_.range(0, 4)), 1);
        for (double& v : def) v = r_.chance(0.5) ? v : v * r_.pick(kPalette);
        return def;
      }
    }
    return int64_t{0};
  }
  void choose_attrs() {
    for (const AttrSpec& a : op_.attrs) {
      if (a.default_value && r_.chance(0.5)) continue;  // the default
      attrs_[a.name] = attr_value(a);
    }
  }
  // The attributes as resolve_attrs would fill them, for evaluating shape expressions.
  std::vector<AttrValue> resolved_attrs() const {
    std::vector<AttrValue> out;
    for (const AttrSpec& a : op_.attrs) {
      auto it = attrs_.find(a.name);
      if (it != attrs_.end()) out.push_back(it->second);
      else if (a.default_value) out.push_back(*a.default_value);
      else out.push_back(a.kind == AttrKind::Int ? AttrValue{int64_t{1}} : AttrValue{std::vector<int64_t>{1, 1}});
    }
    return out;
  }

  // ---- shapes ----
  void choose_shapes() {
    large_ = mut_ == Mut::Large;  // dimensions big enough that parallel loops split into chunks
    shape_.resize(n_in());
    for (size_t i = 0; i < n_in(); ++i) {
      int rank = op_.inputs[i].rank >= 0 ? op_.inputs[i].rank : static_cast<int>(r_.pick(std::vector<int64_t>{0, 1, 1, 2, 2, 2, 3, 3, 4}));
      Shape s(static_cast<size_t>(rank));
      for (int64_t& d : s) d = large_ ? r_.range(4, 40) : r_.chance(0.85) ? r_.range(1, 4) : r_.range(5, 9);
      shape_[i] = s;
    }
    // Shape rules over whole inputs: equal shapes, or shapes that broadcast together.
    for (const OutputSpec& o : op_.outputs) {
      if (o.shape.kind == ShapeRule::Kind::Dims) continue;
      std::vector<size_t> ins;
      for (const std::string& name : o.shape.inputs) ins.push_back(static_cast<size_t>(op_.input_index(name)));
      Shape full = shape_[ins[0]];
      if (o.shape.kind == ShapeRule::Kind::Broadcast && r_.chance(0.3)) full.insert(full.begin(), r_.range(1, 3));
      for (size_t k = 0; k < ins.size(); ++k) {
        Shape s = full;
        if (o.shape.kind == ShapeRule::Kind::Broadcast && r_.chance(0.5)) {
          s.erase(s.begin(), s.begin() + r_.range(0, static_cast<int64_t>(s.size())));
          for (int64_t& d : s)
            if (r_.chance(0.3)) d = 1;
        }
        shape_[ins[k]] = s;
      }
    }
  }

  std::vector<std::pair<size_t, size_t>> axes() const {  // (input, axis) of present inputs
    std::vector<std::pair<size_t, size_t>> out;
    for (size_t i = 0; i < n_in(); ++i)
      if (present_[i])
        for (size_t a = 0; a < shape_[i].size(); ++a) out.push_back({i, a});
    return out;
  }
  void zero_dim() {
    auto ax = axes();
    if (ax.empty()) return;
    auto [i, a] = r_.pick(ax);
    shape_[i][a] = 0;
  }
  // A huge dimension on an input that stays empty (another of its axes is 0), so it can exist.
  void huge_dim() {
    std::vector<std::pair<size_t, size_t>> ax;
    for (auto [i, a] : axes())
      if (shape_[i].size() >= 2) ax.push_back({i, a});
    if (ax.empty()) return;
    auto [i, a] = r_.pick(ax);
    const int64_t huge = r_.pick(kHugeDims);
    shape_[i][a] = huge;
    notes_.push_back("huge(" + op_.inputs[i].name + ")");
    // Often an integer attribute too (a stride, a size): huge sizes that cancel each other in a
    // shape rule give small outputs from huge, empty inputs.
    // Preferably one the shape rules combine with this dimension.
    std::vector<std::pair<std::string, int64_t>> related = related_attrs(op_.inputs[i].name, static_cast<int64_t>(a)), any;
    for (const AttrSpec& s : op_.attrs)
      if (s.kind == AttrKind::Int || s.kind == AttrKind::Ints) any.push_back({s.name, -1});
    if (!any.empty() && r_.chance(0.5)) {
      auto [name, index] = !related.empty() && r_.chance(0.7) ? r_.pick(related) : r_.pick(any);
      AttrValue v = resolved_attrs()[static_cast<size_t>(op_.attr_index(name))];
      if (auto* n = std::get_if<int64_t>(&v)) *n = huge;
      if (auto* l = std::get_if<std::vector<int64_t>>(&v); l && !l->empty()) {
        if (index < 0 || index >= static_cast<int64_t>(l->size())) index = r_.range(0, static_cast<int64_t>(l->size()) - 1);
        (*l)[static_cast<size_t>(index)] = huge;
      }
      attrs_[name] = v;
      notes_.push_back("huge(" + name + ")");
    }
    size_t other = (a + 1 + static_cast<size_t>(r_.range(0, static_cast<int64_t>(shape_[i].size()) - 2))) % shape_[i].size();
    shape_[i][other] = 0;
  }

  // The integer attributes (and list elements) that an output's shape expression combines with
  // dimension `axis` of `input`.
  std::vector<std::pair<std::string, int64_t>> related_attrs(const std::string& input, int64_t axis) const {
    std::vector<std::pair<std::string, int64_t>> out;
    for (const OutputSpec& o : op_.outputs)
      for (const DimExpr& e : o.shape.dims) {
        bool has_dim = false;
        std::vector<std::pair<std::string, int64_t>> attrs;
        walk(e, [&](const DimNode& n) {
          if (n.kind == DimNode::Kind::Dim && n.value == axis &&
              std::find(n.inputs.begin(), n.inputs.end(), input) != n.inputs.end())
            has_dim = true;
          if (n.kind == DimNode::Kind::Attr) attrs.push_back({n.name, -1});
          if (n.kind == DimNode::Kind::AttrAt) attrs.push_back({n.name, n.value});
        });
        if (has_dim) out.insert(out.end(), attrs.begin(), attrs.end());
      }
    return out;
  }
  template <typename F>
  static void walk(const DimExpr& e, F&& f) {
    if (!e.node) return;
    f(*e.node);
    walk(e.node->lhs, f);
    walk(e.node->rhs, f);
  }

  // Makes the spec's dimension checks hold where a check names one input dimension or attribute
  // on one side: that side is set to the other side's value. A few rounds settle chains of checks.
  void repair() {
    for (int round = 0; round < 6; ++round) {
      bool changed = false;
      for (const DimCheck& chk : op_.checks) {
        std::vector<AttrValue> attrs = resolved_attrs();
        std::vector<const Shape*> in;
        for (size_t i = 0; i < n_in(); ++i) in.push_back(present_[i] ? &shape_[i] : nullptr);
        ShapeInference<int64_t> si(op_, in, attrs);
        int64_t l = 0, r = 0;
        try {
          l = si.eval(chk.lhs);
          r = si.eval(chk.rhs);
        } catch (const std::exception&) {
          continue;
        }
        using R = DimCheck::Rel;
        bool ok = chk.rel == R::Eq ? l == r : chk.rel == R::Ge ? l >= r : chk.rel == R::Gt ? l > r
                : chk.rel == R::Le ? l <= r : l < r;
        if (ok) continue;
        // Move the left side to the nearest value that satisfies the relation.
        int64_t want = chk.rel == R::Gt ? r + 1 : chk.rel == R::Lt ? r - 1 : r;
        if (set(chk.lhs, want) || (chk.rel == R::Eq && set(chk.rhs, l))) changed = true;
      }
      if (!changed) break;
    }
  }
  bool set(const DimExpr& e, int64_t v) {
    const DimNode& n = *e.node;
    if (v < 0) return false;
    if (n.kind == DimNode::Kind::Dim) {
      for (const std::string& name : n.inputs) {
        size_t i = static_cast<size_t>(op_.input_index(name));
        if (!present_[i]) continue;
        int64_t r = static_cast<int64_t>(shape_[i].size()), a = n.value < 0 ? n.value + r : n.value;
        if (a < 0 || a >= r) return false;
        shape_[i][static_cast<size_t>(a)] = v;
        return true;
      }
      return false;
    }
    if (n.kind == DimNode::Kind::Attr || n.kind == DimNode::Kind::AttrAt) {
      const AttrSpec& spec = op_.attrs[static_cast<size_t>(op_.attr_index(n.name))];
      if (n.kind == DimNode::Kind::Attr) {
        attrs_[n.name] = v;
        return true;
      }
      AttrValue cur = resolved_attrs()[static_cast<size_t>(op_.attr_index(n.name))];
      auto* list = std::get_if<std::vector<int64_t>>(&cur);
      if (!list || spec.kind != AttrKind::Ints || n.value >= static_cast<int64_t>(list->size())) return false;
      (*list)[static_cast<size_t>(n.value)] = v;
      attrs_[n.name] = *list;
      return true;
    }
    return false;
  }

  // Inputs stay allocatable and small: one past the element budget gets an empty axis instead.
  void cap_sizes() {
    const int64_t budget = large_ ? kMaxElements : kSmallElements * 8;
    for (size_t i = 0; i < n_in(); ++i) {
      InputCase t;
      t.shape = shape_[i];
      if (t.numel() <= budget) continue;
      shape_[i][static_cast<size_t>(r_.range(0, static_cast<int64_t>(shape_[i].size()) - 1))] = 0;
      notes_.push_back("capped(" + op_.inputs[i].name + ")");
    }
  }

  // ---- mutations that must survive repair ----
  void mutate_after_repair() {
    auto ax = axes();
    switch (mut_) {
      case Mut::Rank: {
        std::vector<size_t> ins;
        for (size_t i = 0; i < n_in(); ++i)
          if (present_[i]) ins.push_back(i);
        if (ins.empty()) break;
        size_t i = r_.pick(ins);
        if (!shape_[i].empty() && r_.chance(0.5)) shape_[i].pop_back();
        else shape_[i].push_back(r_.range(1, 3));
        c_.mutations.push_back("input '" + op_.inputs[i].name + "'");
        break;
      }
      case Mut::Dim: {
        if (ax.empty()) break;
        auto [i, a] = r_.pick(ax);
        shape_[i][a] = r_.chance(0.5) ? r_.range(0, 9) : shape_[i][a] + r_.range(-1, 1);
        shape_[i][a] = std::max<int64_t>(0, shape_[i][a]);
        break;
      }
      case Mut::DtypeDisallowed: {
        size_t i = static_cast<size_t>(r_.range(0, static_cast<int64_t>(n_in()) - 1));
        const auto& allowed = op_.type(op_.inputs[i].type).allowed;
        std::vector<int> others = {onnx_type::UInt16};  // a type opbridge has no name for, and every one the op refuses
        for (DType d : kAllDTypes)
          if (std::find(allowed.begin(), allowed.end(), d) == allowed.end()) others.push_back(onnx_type_of(d));
        type_[i] = r_.pick(others);
        present_[i] = true;
        c_.structural = true;
        c_.mutations.push_back("input '" + op_.inputs[i].name + "' " + onnx_type_name(type_[i]));
        break;
      }
      case Mut::DtypeMixed: {
        std::vector<std::pair<size_t, size_t>> pairs;
        for (size_t i = 0; i < n_in(); ++i)
          for (size_t j = 0; j < n_in(); ++j)
            if (i != j && op_.inputs[i].type == op_.inputs[j].type && op_.type(op_.inputs[i].type).allowed.size() > 1)
              pairs.push_back({i, j});
        auto [i, j] = r_.pick(pairs);
        present_[i] = present_[j] = true;
        for (DType d : op_.type(op_.inputs[i].type).allowed)
          if (onnx_type_of(d) != type_[j]) type_[i] = onnx_type_of(d);
        c_.structural = true;
        c_.mutations.push_back("inputs '" + op_.inputs[i].name + "', '" + op_.inputs[j].name + "'");
        break;
      }
      case Mut::AttrMissing: {
        std::vector<std::string> req;
        for (const AttrSpec& a : op_.attrs)
          if (!a.default_value) req.push_back(a.name);
        std::string name = r_.pick(req);
        attrs_.erase(name);
        c_.mutations.push_back(name);
        break;
      }
      case Mut::AttrWrongKind: {
        const AttrSpec& a = op_.attrs[static_cast<size_t>(r_.range(0, static_cast<int64_t>(op_.attrs.size()) - 1))];
        OnnxAttr w;
        w.name = a.name;
        std::vector<OnnxAttrType> kinds = {OnnxAttrType::Int, OnnxAttrType::Float, OnnxAttrType::String, OnnxAttrType::Ints,
                                           OnnxAttrType::Floats, OnnxAttrType::Strings, OnnxAttrType::Tensor};
        w.type = r_.pick(kinds);
        w.i = r_.range(-1, 3), w.f = static_cast<float>(r_.real(-2, 2)), w.s = "x";
        int64_t len = r_.range(0, 3);
        for (int64_t k = 0; k < len; ++k) {
          w.ints.push_back(r_.range(0, 3));
          w.floats.push_back(static_cast<float>(r_.real(0, 2)));
          w.strings.push_back("s");
        }
        attrs_.erase(a.name);
        raw_attrs_.push_back(w);
        c_.mutations.push_back(attr_str(w));
        break;
      }
      case Mut::AttrOutOfRange: {
        std::vector<const AttrSpec*> numeric;
        for (const AttrSpec& a : op_.attrs)
          if (a.kind != AttrKind::String) numeric.push_back(&a);
        const AttrSpec& a = *r_.pick(numeric);
        AttrValue v = resolved_attrs()[static_cast<size_t>(op_.attr_index(a.name))];
        if (auto* i = std::get_if<int64_t>(&v)) *i = r_.pick(kSpecialInts);
        if (auto* f = std::get_if<double>(&v)) *f = r_.pick(kSpecialFloats);
        if (auto* b = std::get_if<bool>(&v)) *b = !*b;
        if (auto* l = std::get_if<std::vector<int64_t>>(&v)) {
          if (l->empty() || r_.chance(0.2)) l->push_back(1);
          (*l)[static_cast<size_t>(r_.range(0, static_cast<int64_t>(l->size()) - 1))] = r_.pick(kSpecialInts);
        }
        if (auto* l = std::get_if<std::vector<double>>(&v)) {
          if (l->empty() || r_.chance(0.2)) l->push_back(1);
          (*l)[static_cast<size_t>(r_.range(0, static_cast<int64_t>(l->size()) - 1))] = r_.pick(kSpecialFloats);
        }
        attrs_[a.name] = v;
        c_.mutations.push_back(a.name);
        break;
      }
      case Mut::AttrUnknown: {
        OnnxAttr w;
        w.name = "fuzz_unknown";
        w.type = OnnxAttrType::Int;
        w.i = 7;
        raw_attrs_.push_back(w);
        break;
      }
      case Mut::InputOmitted: {
        std::vector<size_t> req;
        for (size_t i = 0; i < n_in(); ++i)
          if (!op_.inputs[i].optional) req.push_back(i);
        if (req.empty()) break;
        size_t i = r_.pick(req);
        present_[i] = false;
        c_.drop_trailing_omitted = false;  // written as "" in its place
        c_.structural = true;
        c_.mutations.push_back(op_.inputs[i].name);
        break;
      }
      case Mut::InputsDropped: {
        drop_ = static_cast<size_t>(r_.range(1, static_cast<int64_t>(n_in())));
        c_.structural = true;
        break;
      }
      case Mut::InputExtra: {
        extra_inputs_ = static_cast<int>(r_.range(1, 2));
        c_.structural = true;
        break;
      }
      case Mut::OutputsFewer:
      case Mut::OutputsExtra: c_.structural = true; break;
      default: break;
    }
  }

  void build_node() {
    for (size_t i = 0; i < n_in(); ++i) {
      InputCase t;
      t.present = present_[i];
      t.onnx_type = type_[i];
      t.shape = shape_[i];
      c_.inputs.push_back(std::move(t));
    }
    if (drop_ > 0) {  // left off the node entirely: the node has fewer inputs than the op
      size_t keep = n_in() - std::min(drop_, n_in());
      c_.inputs.resize(keep);
      c_.mutations.push_back("kept " + std::to_string(keep));
    }
    for (int k = 0; k < extra_inputs_; ++k) {
      InputCase t;
      t.onnx_type = c_.inputs.empty() ? onnx_type::Float : c_.inputs[0].onnx_type;
      t.shape = {static_cast<int64_t>(r_.range(1, 3))};
      c_.inputs.push_back(std::move(t));
    }
    for (const AttrSpec& a : op_.attrs) {
      auto it = attrs_.find(a.name);
      if (it != attrs_.end()) c_.attrs.push_back(make_attr(a.name, it->second));
    }
    for (OnnxAttr& a : raw_attrs_) c_.attrs.push_back(std::move(a));
    c_.node_outputs = static_cast<int>(op_.outputs.size());
    if (mut_ == Mut::OutputsFewer) c_.node_outputs = static_cast<int>(r_.range(0, c_.node_outputs - 1));
    if (mut_ == Mut::OutputsExtra) c_.node_outputs += static_cast<int>(r_.range(1, 2));
  }

  // ---- values ----
  template <typename T>
  void fill_float(InputCase& t, bool special) {
    T* p = reinterpret_cast<T*>(t.data.get());
    const int64_t n = t.numel();
    int mode = special ? 4 : static_cast<int>(r_.pick(std::vector<int64_t>{0, 0, 1, 1, 1, 2, 3, 3, 5, 6, 7, 7, 7}));
    static const char* names[] = {"uniform", "positive", "palette", "ones", "special", "integers", "constant", "leading-ones"};
    t.values = names[mode];
    const double constant = r_.chance(0.2) ? r_.pick(kSpecialFloats) : r_.pick(kPalette);
    for (int64_t k = 0; k < n; ++k) {
      double v = 0;
      switch (mode) {
        case 0: v = r_.real(-2, 2); break;
        case 1: v = r_.real(0.05, 4); break;
        case 2: v = r_.pick(kPalette); break;
        case 3: v = r_.chance(0.5) ? 1.0 : r_.pick(kPalette); break;
        case 4: v = r_.chance(0.15) ? r_.pick(kSpecialFloats) : r_.real(-2, 2); break;
        case 5: v = static_cast<double>(r_.range(-3, 10)); break;
        case 6: v = constant; break;
        case 7: v = k < n / 2 ? 1.0 : r_.pick(std::vector<double>{0.5, 2, 1.5, 3, 0.25, 1.25, 4, 1}); break;  // scale-like
      }
      p[k] = narrow<T>(static_cast<compute_t<T>>(v));  // rounds for the 16-bit floats
    }
  }
  // Integers: small values, cumulative counts that end at another input's leading size (the
  // usual meaning of an integer input next to float ones: offsets, lengths), or extremes.
  template <typename T>
  void fill_int(InputCase& t, bool special) {
    T* p = reinterpret_cast<T*>(t.data.get());
    const int64_t n = t.numel();
    int mode = special ? 2 : static_cast<int>(r_.pick(std::vector<int64_t>{0, 1, 1, 1, 1, 2, 3}));
    static const char* names[] = {"small", "cumulative", "extreme", "iota"};
    t.values = names[mode];
    int64_t target = 0;
    std::vector<int64_t> sizes;
    for (size_t i = 0; i < n_in(); ++i)
      if (present_[i] && !shape_[i].empty() && dtype_of_onnx(type_[i]) && (type_[i] == onnx_type::Float || type_[i] == onnx_type::Double))
        sizes.push_back(shape_[i][0]);
    if (!sizes.empty()) target = r_.pick(sizes);
    int64_t prev = 0;
    const int64_t disorder = mode == 1 && r_.chance(0.1) ? r_.range(0, std::max<int64_t>(0, n - 1)) : -1;
    for (int64_t k = 0; k < n; ++k) {
      int64_t v = 0;
      switch (mode) {
        case 0: v = r_.range(-2, 8); break;
        case 1: {  // in 128 bits: a target near INT64_MAX would overflow the step and the sum
          const __int128 step = std::max<__int128>(1, static_cast<__int128>(target / std::max<int64_t>(n, 1)) * 2);
          const __int128 sum = prev + static_cast<__int128>(r_.range(0, static_cast<int64_t>(std::min<__int128>(step, INT64_MAX - 1))));
          v = k + 1 == n ? target : static_cast<int64_t>(std::max<__int128>(prev, std::min<__int128>(target, sum)));
          break;
        }
        case 2: v = r_.chance(0.3) ? r_.pick(kSpecialInts) : r_.range(-2, 8); break;
        case 3: v = k; break;
      }
      if (k == disorder) v = prev - 1;  // occasionally out of order
      prev = v;
      p[k] = static_cast<T>(v);
    }
  }
  void fill_values() {
    const size_t special_input = mut_ == Mut::ValuesSpecial ? static_cast<size_t>(r_.range(0, static_cast<int64_t>(c_.inputs.size()) - 1)) : SIZE_MAX;
    for (size_t i = 0; i < c_.inputs.size(); ++i) {
      InputCase& t = c_.inputs[i];
      if (!t.present) continue;
      t.allocate();
      const bool special = i == special_input || (mut_ == Mut::None && r_.chance(0.08));
      switch (t.onnx_type) {
        case onnx_type::Float: fill_float<float>(t, special); break;
        case onnx_type::Double: fill_float<double>(t, special); break;
        case onnx_type::Int32: fill_int<int32_t>(t, special); break;
        case onnx_type::Int64: fill_int<int64_t>(t, special); break;
        case onnx_type::Float16: fill_float<Float16>(t, special); break;
        case onnx_type::BFloat16: fill_float<BFloat16>(t, special); break;
        case onnx_type::Int8: fill_int<int8_t>(t, special); break;
        case onnx_type::Int16: fill_int<int16_t>(t, special); break;
        case onnx_type::Bool:
          for (size_t k = 0; k < t.nbytes; ++k) t.data[k] = std::byte(r_.range(0, 1));
          t.values = "bool";
          break;
        default:
          for (size_t k = 0; k < t.nbytes; ++k) t.data[k] = std::byte(r_.range(0, 255));
          t.values = "bytes";
      }
    }
  }

  const OpSpec& op_;
  Rng r_;
  Case c_;
  Mut mut_ = Mut::None;
  bool large_ = false;
  std::vector<int> type_;
  std::vector<bool> present_;
  std::vector<Shape> shape_;
  std::map<std::string, AttrValue> attrs_;
  std::vector<OnnxAttr> raw_attrs_;
  std::vector<std::string> notes_;  // what this attempt did beyond the plain case
  size_t drop_ = 0;
  int extra_inputs_ = 0;
};

// ---- a backward op's calls, from its forward's ----------------------------------------------
// A backward op's valid calls depend on what its forward made of the data (resize_bicubic's
// output size comes from the scales' values), which no spec states: generated alone, nearly all of
// them are refusals. So some of its cases run the forward on one of the forward's own valid cases
// and pass what autograd would (the naming that python/opbridge/_export/autograd.py relies on):
// inputs and outputs of the forward by name, grad_<output> at that output's shape and dtype, and
// the forward's attributes that the backward shares.
const OpSpec* forward_of(const OpSpec& op) {
  for (const OpSpec& f : registry().ops())
    if (f.backward == op.name && f.cpu_kernel) return &f;
  return nullptr;
}

// The position of the spec named `name` in `specs` (inputs or outputs), SIZE_MAX when none is.
template <typename Spec>
size_t index_of(const std::vector<Spec>& specs, const std::string& name) {
  for (size_t k = 0; k < specs.size(); ++k)
    if (specs[k].name == name) return k;
  return SIZE_MAX;
}

InputCase input_of(const testing::Tensor& t) {
  InputCase c;
  c.onnx_type = onnx_type_of(t.view.dtype);
  c.shape = t.view.shape;
  c.allocate();
  if (c.nbytes) std::memcpy(c.data.get(), t.view.data, c.nbytes);  // the harness's outputs are contiguous
  return c;
}

InputCase copy_of(const InputCase& t) {
  InputCase c;
  c.present = t.present;
  c.onnx_type = t.onnx_type;
  c.shape = t.shape;
  c.values = t.values;
  if (t.present) {
    c.allocate();
    if (c.nbytes) std::memcpy(c.data.get(), t.data.get(), c.nbytes);
  }
  return c;
}

void fill_gradient(InputCase& t, Rng& r) {
  t.allocate();
  t.values = "gradient";
  const DType d = *dtype_of_onnx(t.onnx_type);
  if (d != DType::Float32 && d != DType::Float64 && d != DType::Float16 && d != DType::BFloat16) {
    if (t.nbytes) std::memset(t.data.get(), 0, t.nbytes);  // an integer output has no gradient: zeros
    return;
  }
  visit_dtype<float, double, Float16, BFloat16>(d, [&](auto zero) {
    using T = decltype(zero);
    T* p = reinterpret_cast<T*>(t.data.get());
    for (int64_t k = 0; k < t.numel(); ++k) p[k] = narrow<T>(static_cast<compute_t<T>>(r.real(-2, 2)));
  });
}

std::optional<Case> from_forward(const OpSpec& bwd, const OpSpec& fwd, uint64_t seed) {
  Rng r(seed);
  for (int attempt = 0; attempt < 8; ++attempt) {
    Case f = Generator(fwd, r.next()).run();
    if (!f.mutations.empty() || f.inputs.size() != fwd.inputs.size()) continue;
    std::vector<std::optional<testing::Tensor>> in;
    for (const InputCase& t : f.inputs) {
      if (!t.present) {
        in.push_back(std::nullopt);
        continue;
      }
      std::optional<DType> d = dtype_of_onnx(t.onnx_type);
      if (!d) break;
      in.push_back(testing::Tensor{nullptr, TensorView{t.data.get(), *d, t.shape, contiguous_strides(t.shape)}});
    }
    if (in.size() != f.inputs.size()) continue;
    const std::map<std::string, AttrValue> given = read_attrs(f).given;
    std::vector<testing::Tensor> out;
    try {
      out = testing::run(fwd.name, in, given, /*threaded=*/false);
    } catch (const std::exception&) {
      continue;  // the forward refuses these values: another case
    }
    bool small = true;
    for (const testing::Tensor& t : out) small &= t.view.numel() <= kMaxElements;
    if (!small) continue;
    Case c;
    c.seed = seed;
    c.op = &bwd;
    c.from_forward = true;
    for (const InputSpec& i : bwd.inputs) {
      const size_t k_in = index_of(fwd.inputs, i.name), k_out = index_of(fwd.outputs, i.name);
      const size_t k_grad = i.name.rfind("grad_", 0) == 0 ? index_of(fwd.outputs, i.name.substr(5)) : SIZE_MAX;
      if (k_grad != SIZE_MAX) {
        InputCase g;
        g.onnx_type = onnx_type_of(out[k_grad].view.dtype);
        g.shape = out[k_grad].view.shape;
        fill_gradient(g, r);
        c.inputs.push_back(std::move(g));
      } else if (k_in != SIZE_MAX) {
        c.inputs.push_back(copy_of(f.inputs[k_in]));
      } else if (k_out != SIZE_MAX) {
        c.inputs.push_back(input_of(out[k_out]));
      } else {
        return std::nullopt;  // an input the forward's call does not give: the generator's cases only
      }
    }
    for (const AttrSpec& a : bwd.attrs) {
      auto it = given.find(a.name);
      if (it != given.end()) c.attrs.push_back(make_attr(a.name, it->second));
    }
    c.node_outputs = static_cast<int>(bwd.outputs.size());
    return c;
  }
  return std::nullopt;
}

}  // namespace

Case generate_case(const OpSpec& op, uint64_t seed) {
  if (const OpSpec* fwd = forward_of(op); fwd && Rng(seed ^ 0x6261636b77617264ull).chance(0.5))
    if (std::optional<Case> c = from_forward(op, *fwd, seed)) return std::move(*c);
  return Generator(op, seed).run();
}

std::string Case::describe() const {
  std::ostringstream os;
  os << op->qualified_name() << "(";
  for (size_t i = 0; i < inputs.size(); ++i) {
    const InputCase& t = inputs[i];
    os << (i ? ", " : "") << (i < op->inputs.size() ? op->inputs[i].name : "extra" + std::to_string(i)) << "=";
    if (!t.present) {
      os << "omitted";
      continue;
    }
    os << onnx_type_name(t.onnx_type) << shape_str(t.shape);
    if (!t.values.empty()) os << ":" << t.values;
  }
  if (inputs.size() < op->inputs.size()) os << (inputs.empty() ? "" : ", ") << "<" << op->inputs.size() - inputs.size() << " left off>";
  os << "; ";
  for (size_t i = 0; i < attrs.size(); ++i) os << (i ? ", " : "") << attr_str(attrs[i]);
  os << ") -> " << node_outputs << " outputs";
  os << " [" << (mutations.empty() ? (from_forward ? "valid, from a run of the forward" : "valid") : "");
  for (size_t i = 0; i < mutations.size(); ++i) os << (i ? " " : "") << mutations[i];
  os << "]";
  return os.str();
}

OnnxNodeModel Case::model() const {
  OnnxNodeModel m;
  m.op_type = op->export_as.onnx_name;
  m.domain = op->export_as.onnx_domain;
  m.domain_version = op->export_as.onnx_version;
  size_t last = inputs.size();
  if (drop_trailing_omitted)
    while (last > 0 && !inputs[last - 1].present) --last;
  for (size_t i = 0; i < last; ++i) {
    const InputCase& t = inputs[i];
    std::string name = t.present ? "in" + std::to_string(i) : "";
    m.node_inputs.push_back(name);
    if (t.present) m.graph_inputs.push_back({name, t.onnx_type, true, t.shape});
  }
  // Output types: what the spec gives for the chosen dtypes (a guess when the dtypes are wrong);
  // shapes unknown, so ONNX Runtime checks nothing about them.
  std::map<std::string, int> chosen;
  for (size_t i = 0; i < op->inputs.size() && i < inputs.size(); ++i)
    if (inputs[i].present && !chosen.count(op->inputs[i].type)) chosen[op->inputs[i].type] = inputs[i].onnx_type;
  for (int j = 0; j < node_outputs; ++j) {
    std::string name = "out" + std::to_string(j);
    m.node_outputs.push_back(name);
    int type = onnx_type::Float;
    if (j < static_cast<int>(op->outputs.size())) {
      const std::string& tc = op->outputs[static_cast<size_t>(j)].type;
      type = chosen.count(tc) ? chosen[tc] : onnx_type_of(op->type(tc).allowed.front());
    }
    m.graph_outputs.push_back({name, type, false, {}});
  }
  m.attrs = attrs;
  return m;
}

ReadAttrs read_attrs(const Case& c) {
  ReadAttrs out;
  for (const OnnxAttr& a : c.attrs) {
    int idx = c.op->attr_index(a.name);
    if (idx < 0) continue;
    const AttrSpec& s = c.op->attrs[static_cast<size_t>(idx)];
    using T = OnnxAttrType;
    // ONNX Runtime's list getters read any empty list, and a tensor, as an empty list; a list of
    // strings is asked for explicitly (a non-empty one is the wrong kind).
    const bool empty_list = (a.type == T::Ints && a.ints.empty()) || (a.type == T::Floats && a.floats.empty()) ||
                            (a.type == T::Strings && a.strings.empty()) || a.type == T::Tensor;
    std::optional<AttrValue> v;
    switch (s.kind) {
      case AttrKind::Int: if (a.type == T::Int) v = a.i; break;
      case AttrKind::Bool: if (a.type == T::Int) v = a.i != 0; break;
      case AttrKind::Float: if (a.type == T::Float) v = static_cast<double>(a.f); break;
      case AttrKind::String: if (a.type == T::String) v = a.s; break;
      case AttrKind::Ints:
        if (a.type == T::Ints && !a.ints.empty()) v = a.ints;
        else if (empty_list) v = std::vector<int64_t>{};
        break;
      case AttrKind::Floats:
        if (a.type == T::Floats && !a.floats.empty()) v = std::vector<double>(a.floats.begin(), a.floats.end());
        else if (empty_list) v = std::vector<double>{};
        break;
    }
    if (!v) {
      if (out.error.empty()) out.error = "attribute '" + a.name + "' has the wrong kind";
      continue;
    }
    out.given[a.name] = *v;
  }
  return out;
}

}  // namespace opbridge::fuzz
