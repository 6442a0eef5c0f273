// Generic validation and shape inference from an OpSpec. Templated on the dimension type so the
// same rules run on int64_t (kernels, ONNX Runtime) and on c10::SymInt (PyTorch's Meta kernel
// under torch.export); the torch adapter supplies DimTraits<c10::SymInt>.
// Messages never name the op: each adapter prefixes its own qualified name.
#pragma once

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "opbridge/error.h"
#include "opbridge/op_spec.h"

namespace opbridge {

// Dimension arithmetic. Shape rules can see hostile sizes and attributes (a hand-made ONNX node
// may say anything), so int64 arithmetic is checked and division floors, as Python's // does.
template <typename D>
struct DimTraits {  // int64_t
  static D from(int64_t v) { return v; }
  static bool eq(const D& a, const D& b) { return a == b; }
  static std::optional<bool> maybe_ge(const D& a, const D& b) { return a >= b; }
  static std::optional<bool> maybe_gt(const D& a, const D& b) { return a > b; }
  static bool known_negative(const D& a) { return a < 0; }
  static D add(D a, D b) {
    D r;
    OB_CHECK(!__builtin_add_overflow(a, b, &r), "shape rule overflows int64 (", a, " + ", b, ")");
    return r;
  }
  static D sub(D a, D b) {
    D r;
    OB_CHECK(!__builtin_sub_overflow(a, b, &r), "shape rule overflows int64 (", a, " - ", b, ")");
    return r;
  }
  static D mul(D a, D b) {
    D r;
    OB_CHECK(!__builtin_mul_overflow(a, b, &r), "shape rule overflows int64 (", a, " * ", b, ")");
    return r;
  }
  static D floordiv(D a, D b) {
    OB_CHECK(b != 0, "shape rule divides by zero");
    OB_CHECK(!(b == -1 && a == INT64_MIN), "shape rule overflows int64 (", a, " // ", b, ")");
    D q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
  }
};

template <typename D>
std::string dims_str(const std::vector<D>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

template <typename D>
class ShapeInference {
 public:
  using Dims = std::vector<D>;
  using T = DimTraits<D>;

  // in[i] is nullptr for an absent optional input. `in` and `attrs` are referred to, not copied:
  // they must outlive the ShapeInference (a temporary in the expression that runs it does).
  ShapeInference(const OpSpec& op, const std::vector<const Dims*>& in, const std::vector<AttrValue>& attrs)
      : op_(op), in_(in), attrs_(attrs) {}
  // `symbolic[i]`, where set, is the value of int attribute i as a dimension (a size PyTorch's
  // Meta kernel only knows symbolically, AttrSpec::symbolic), and replaces attrs[i] in the rules.
  ShapeInference(const OpSpec& op, const std::vector<const Dims*>& in, const std::vector<AttrValue>& attrs,
                 const std::vector<std::optional<D>>& symbolic)
      : op_(op), in_(in), attrs_(attrs), symbolic_(&symbolic) {}

  std::vector<Dims> run() const {
    std::vector<Dims> out;
    run(out);
    return out;
  }

  // The output shapes into `out`, reusing its storage.
  void run(std::vector<Dims>& out) const {
    OB_CHECK(in_.size() == op_.inputs.size(), "expected ", op_.inputs.size(), " inputs, got ", in_.size());
    for (size_t i = 0; i < in_.size(); ++i) {
      const InputSpec& s = op_.inputs[i];
      OB_CHECK(in_[i] || s.optional, "required input '", s.name, "' is missing");
      OB_CHECK(!in_[i] || s.rank < 0 || static_cast<int>(in_[i]->size()) == s.rank, "input '", s.name,
               "' must have rank ", s.rank, ", got shape ", dims_str(*in_[i]));
    }
    for (const DimCheck& c : op_.checks) {
      D l = eval(c.lhs), r = eval(c.rhs);
      // An undecided inequality (symbolic sizes) passes: the kernel's run decides.
      using R = DimCheck::Rel;
      bool ok = c.rel == R::Eq   ? T::eq(l, r)
                : c.rel == R::Ge ? T::maybe_ge(l, r).value_or(true)
                : c.rel == R::Gt ? T::maybe_gt(l, r).value_or(true)
                : c.rel == R::Le ? T::maybe_ge(r, l).value_or(true)
                                 : T::maybe_gt(r, l).value_or(true);
      if (!ok) throw Error(check_message(c, l, r));
    }
    out.resize(op_.outputs.size());
    for (size_t i = 0; i < out.size(); ++i) output(op_.outputs[i], out[i]);
  }

  D eval(const DimExpr& e) const {
    const DimNode& n = *e.node;
    using K = DimNode::Kind;
    switch (n.kind) {
      case K::Const: return T::from(n.value);
      case K::Dim: {
        const Dims* s = first_present(n.inputs);
        int64_t r = static_cast<int64_t>(s->size()), a = n.value < 0 ? n.value + r : n.value;
        OB_CHECK(a >= 0 && a < r, "input '", n.inputs.front(), "' has rank ", r, "; shape rule needs axis ", n.value);
        return (*s)[static_cast<size_t>(a)];
      }
      case K::Attr: {
        const size_t i = static_cast<size_t>(op_.attr_index(n.name));
        if (symbolic_ && i < symbolic_->size() && (*symbolic_)[i]) return *(*symbolic_)[i];
        return T::from(std::get<int64_t>(attrs_.at(i)));
      }
      case K::AttrAt: {
        const auto& v = std::get<std::vector<int64_t>>(attrs_.at(op_.attr_index(n.name)));
        OB_CHECK(n.value < static_cast<int64_t>(v.size()), "attribute '", n.name, "' needs at least ",
                 n.value + 1, " values, got ", v.size());
        return T::from(v[static_cast<size_t>(n.value)]);
      }
      case K::Add: return naming(e, [&] { return T::add(eval(n.lhs), eval(n.rhs)); });
      case K::Sub: return naming(e, [&] { return T::sub(eval(n.lhs), eval(n.rhs)); });
      case K::Mul: return naming(e, [&] { return T::mul(eval(n.lhs), eval(n.rhs)); });
      case K::FloorDiv: {
        D divisor = eval(n.rhs);  // name the expression: "divides by zero" alone says too little
        OB_CHECK(!T::eq(divisor, T::from(0)), "shape rule ", e.str(), " divides by zero (", n.rhs.str(), " = 0)");
        return T::floordiv(eval(n.lhs), divisor);
      }
      case K::Data: break;  // only ever a whole output dimension (validate_spec), see output()
    }
    throw Error("unknown shape expression");
  }

 private:
  // "k must be >= 1, got 0" when one side is a constant; both sides named and valued otherwise.
  static std::string check_message(const DimCheck& c, const D& l, const D& r) {
    if (c.rhs.node->kind == DimNode::Kind::Const) return detail::concat(c.what, ", got ", l);
    if (c.lhs.node->kind == DimNode::Kind::Const) return detail::concat(c.what, ", got ", r);
    return detail::concat(c.what, " (", c.lhs.str(), " = ", l, ", ", c.rhs.str(), " = ", r, ")");
  }

  // An arithmetic failure (overflow) names the expression, and so the inputs and attributes in it.
  template <typename F>
  static D naming(const DimExpr& e, F&& f) {
    try {
      return f();
    } catch (const Error& err) {
      const std::string what = err.what();
      if (what.rfind("shape rule overflows", 0) != 0) throw;
      throw Error("shape rule " + e.str() + what.substr(std::string("shape rule").size()));
    }
  }

  const Dims* first_present(const std::vector<std::string>& names) const {
    for (const std::string& name : names) {
      const Dims* s = in_.at(static_cast<size_t>(op_.input_index(name)));
      if (s) return s;
    }
    throw Error(detail::concat("shape rule needs input '", names.front(), "', which is absent"));
  }

  void output(const OutputSpec& o, Dims& d) const {
    using K = ShapeRule::Kind;
    const ShapeRule& r = o.shape;
    d.clear();
    if (r.kind == K::Dims) {
      for (const DimExpr& e : r.dims) {
        if (e.node->kind == DimNode::Kind::Data) {  // the kernel decides, see allocate_output
          d.push_back(T::from(kDataDependentDim));
          continue;
        }
        d.push_back(eval(e));
        OB_CHECK(!T::known_negative(d.back()), "output '", o.name, "' would have a negative size (", e.str(),
                 " = ", d.back(), ")");
      }
      return;
    }
    // Broadcast / Same over the present named inputs, accumulated in d.
    const Dims* first = nullptr;
    std::string_view first_name;
    Dims& acc = d;
    for (const std::string& name : r.inputs) {
      const Dims* s = in_.at(static_cast<size_t>(op_.input_index(name)));
      if (!s) continue;
      if (!first) {
        first = s, first_name = name, acc = *s;
        continue;
      }
      if (r.kind == K::Same) {
        bool same = s->size() == acc.size();
        for (size_t i = 0; same && i < acc.size(); ++i) same = T::eq((*s)[i], acc[i]);
        OB_CHECK(same, "inputs '", first_name, "' ", dims_str(acc), " and '", name, "' ", dims_str(*s),
                 " must have the same shape");
      } else {
        acc = broadcast2(acc, *s, first_name, name);
      }
    }
    OB_CHECK(first, "output '", o.name, "' is shaped by inputs that are all absent");
  }

  Dims broadcast2(const Dims& a, const Dims& b, std::string_view an, std::string_view bn) const {
    size_t r = std::max(a.size(), b.size());
    Dims out(r, T::from(1));
    for (size_t i = 0; i < r; ++i) {
      // Align from the right, as numpy does.
      std::optional<D> da, db;
      if (i + a.size() >= r) da = a[i + a.size() - r];
      if (i + b.size() >= r) db = b[i + b.size() - r];
      if (!da) { out[i] = *db; continue; }
      if (!db) { out[i] = *da; continue; }
      if (T::eq(*db, T::from(1))) { out[i] = *da; continue; }
      if (T::eq(*da, T::from(1)) || T::eq(*da, *db)) { out[i] = *db; continue; }
      throw Error(detail::concat("inputs '", an, "' ", dims_str(a), " and '", bn, "' ", dims_str(b),
                                 " cannot be broadcast together"));
    }
    return out;
  }

  const OpSpec& op_;
  const std::vector<const Dims*>& in_;
  const std::vector<AttrValue>& attrs_;
  const std::vector<std::optional<D>>* symbolic_ = nullptr;
};

}  // namespace opbridge
