#include "opbridge/op_spec.h"

#include <algorithm>
#include <cmath>
#include <cctype>
#include <set>

#include "opbridge/error.h"
#include "opbridge/library.h"

namespace opbridge {

std::string_view attr_kind_name(AttrKind k) {
  switch (k) {
    case AttrKind::Int: return "int";
    case AttrKind::Float: return "float";
    case AttrKind::Ints: return "int[]";
    case AttrKind::Floats: return "float[]";
    case AttrKind::String: return "str";
    case AttrKind::Bool: return "bool";
  }
  return "?";
}

std::string_view param_type_name(ParamKind k) {
  switch (k) {
    case ParamKind::Input: return "const TensorView&";
    case ParamKind::OptionalInput: return "const TensorView*";
    case ParamKind::Output: return "TensorView&";
    case ParamKind::Int: return "int64_t";
    case ParamKind::Float: return "double";
    case ParamKind::Bool: return "bool";
    case ParamKind::String: return "const std::string&";
    case ParamKind::Ints: return "const std::vector<int64_t>&";
    case ParamKind::Floats: return "const std::vector<double>&";
  }
  return "?";
}

AttrKind attr_kind_of(const AttrValue& v) {
  static constexpr AttrKind kinds[] = {AttrKind::Int,    AttrKind::Float,  AttrKind::Ints,
                                       AttrKind::Floats, AttrKind::String, AttrKind::Bool};
  return kinds[v.index()];
}

// ---- DimExpr --------------------------------------------------------------------------------
namespace {
DimExpr make(DimNode n) { return DimExpr(std::make_shared<const DimNode>(std::move(n))); }
DimExpr binary(DimNode::Kind k, DimExpr a, DimExpr b) {
  DimNode n{k};
  n.lhs = std::move(a);
  n.rhs = std::move(b);
  return make(std::move(n));
}
}  // namespace

DimExpr dim(std::string input, int64_t axis) { return dim_of_first({std::move(input)}, axis); }
DimExpr dim_of_first(std::vector<std::string> inputs, int64_t axis) {
  DimNode n{DimNode::Kind::Dim};
  n.value = axis;
  n.inputs = std::move(inputs);
  return make(std::move(n));
}
DimExpr attr(std::string name) {
  DimNode n{DimNode::Kind::Attr};
  n.name = std::move(name);
  return make(std::move(n));
}
DimExpr attr_at(std::string name, int64_t index) {
  DimNode n{DimNode::Kind::AttrAt};
  n.name = std::move(name);
  n.value = index;
  return make(std::move(n));
}
DimExpr constant(int64_t v) { return DimExpr(v); }
DimExpr::DimExpr(int64_t v) {
  auto n = std::make_shared<DimNode>(DimNode::Kind::Const);
  n->value = v;
  node = std::move(n);
}
std::string DimCheck::str() const {
  static constexpr const char* ops[] = {" == ", " >= ", " > ", " <= ", " < "};
  const char* op = ops[static_cast<int>(rel)];
  return lhs.str() + op + rhs.str();
}

DimExpr data_dependent(std::string name) {
  DimNode n{DimNode::Kind::Data};
  n.name = std::move(name);
  return make(std::move(n));
}

bool OutputSpec::data_dependent() const {
  for (const DimExpr& e : shape.dims)
    if (e.node->kind == DimNode::Kind::Data) return true;
  return false;
}

bool OpSpec::has_data_dependent_output() const {
  for (const OutputSpec& o : outputs)
    if (o.data_dependent()) return true;
  return false;
}

std::string OpSpec::check_op() const { return has_data_dependent_output() ? "_check_" + name : ""; }

DimExpr operator+(DimExpr a, DimExpr b) { return binary(DimNode::Kind::Add, std::move(a), std::move(b)); }
DimExpr operator-(DimExpr a, DimExpr b) { return binary(DimNode::Kind::Sub, std::move(a), std::move(b)); }
DimExpr operator*(DimExpr a, DimExpr b) { return binary(DimNode::Kind::Mul, std::move(a), std::move(b)); }
DimExpr operator/(DimExpr a, DimExpr b) { return binary(DimNode::Kind::FloorDiv, std::move(a), std::move(b)); }

std::string DimExpr::str() const {
  const DimNode& n = *node;
  using K = DimNode::Kind;
  switch (n.kind) {
    case K::Const: return std::to_string(n.value);
    case K::Data: return n.name.empty() ? "<data-dependent>" : "<data-dependent " + n.name + ">";
    case K::Dim: {
      std::string s = n.inputs.front();
      for (size_t i = 1; i < n.inputs.size(); ++i) s += " or " + n.inputs[i];
      return (n.inputs.size() > 1 ? "(" + s + ")" : s) + ".shape[" + std::to_string(n.value) + "]";
    }
    case K::Attr: return n.name;
    case K::AttrAt: return n.name + "[" + std::to_string(n.value) + "]";
    case K::Add: return "(" + n.lhs.str() + " + " + n.rhs.str() + ")";
    case K::Sub: return "(" + n.lhs.str() + " - " + n.rhs.str() + ")";
    case K::Mul: return n.lhs.str() + " * " + n.rhs.str();
    case K::FloorDiv: return n.lhs.str() + " // " + n.rhs.str();
  }
  return "?";
}

std::string ShapeRule::str() const {
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
    return s;
  };
  switch (kind) {
    case Kind::Broadcast: return "broadcast(" + join(inputs) + ")";
    case Kind::Same: return "same(" + join(inputs) + ")";
    case Kind::Dims: {
      std::vector<std::string> d;
      for (const DimExpr& e : dims) d.push_back(e.str());
      return "[" + join(d) + "]";
    }
  }
  return "?";
}

namespace shape {
ShapeRule broadcast(std::vector<std::string> inputs) { return {ShapeRule::Kind::Broadcast, std::move(inputs), {}}; }
ShapeRule same(std::vector<std::string> inputs) { return {ShapeRule::Kind::Same, std::move(inputs), {}}; }
ShapeRule dims(std::vector<DimExpr> dims) { return {ShapeRule::Kind::Dims, {}, std::move(dims)}; }
}  // namespace shape

// ---- OpSpec ---------------------------------------------------------------------------------
const TypeConstraint& OpSpec::type(const std::string& n) const {
  for (const TypeConstraint& t : types)
    if (t.name == n) return t;
  throw Error(detail::concat("op '", name, "' has no type constraint '", n, "'"));
}

int OpSpec::input_index(std::string_view n) const {
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].name == n) return static_cast<int>(i);
  return -1;
}

std::vector<size_t> OpSpec::symbolic_attrs() const {
  std::vector<size_t> out;
  for (size_t i = 0; i < attrs.size(); ++i)
    if (attrs[i].symbolic) out.push_back(i);
  return out;
}

int OpSpec::attr_index(std::string_view n) const {
  for (size_t i = 0; i < attrs.size(); ++i)
    if (attrs[i].name == n) return static_cast<int>(i);
  return -1;
}

std::string OpSpec::qualified_name() const {
  return existing_torch_op.empty() ? std::string(this_library().torch_namespace) + "::" + name : existing_torch_op;
}

std::string camel_case(std::string_view snake) {
  std::string out;
  bool up = true;
  for (char c : snake) {
    if (c == '_') { up = true; continue; }
    out += up ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    up = false;
  }
  return out;
}

// ---- validation -----------------------------------------------------------------------------
namespace {
// Every name becomes a Python keyword argument (torch.ops, the export glue) and an identifier in
// a torch schema: it must be one, and not a Python keyword.
void check_name(const std::string& what, const std::string& name) {
  static const std::set<std::string> keywords = {
      "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
      "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in",
      "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while", "with", "yield"};
  bool ok = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0]));
  for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  OB_CHECK(ok, what, " name '", name, "' is not an identifier");
  OB_CHECK(!keywords.count(name), what, " name '", name, "' is a Python keyword");
}

void check_expr(const OpSpec& op, const DimExpr& e) {
  const DimNode& n = *e.node;
  using K = DimNode::Kind;
  switch (n.kind) {
    case K::Dim:
      for (const std::string& in : n.inputs) OB_CHECK(op.input_index(in) >= 0, "shape rule names unknown input '", in, "'");
      OB_CHECK(!op.inputs[op.input_index(n.inputs.back())].optional, "shape rule ", e.str(),
               " must end with a required input");
      break;
    case K::Attr:
    case K::AttrAt: {
      int a = op.attr_index(n.name);
      OB_CHECK(a >= 0, "shape rule names unknown attribute '", n.name, "'");
      OB_CHECK(op.attrs[a].kind == (n.kind == K::Attr ? AttrKind::Int : AttrKind::Ints), "shape rule uses attribute '",
               n.name, "' of kind ", attr_kind_name(op.attrs[a].kind));
      break;
    }
    case K::Add: case K::Sub: case K::Mul: case K::FloorDiv:
      check_expr(op, n.lhs);
      check_expr(op, n.rhs);
      break;
    case K::Const: break;
    case K::Data: OB_CHECK(false, "data_dependent() must stand alone as an output dimension");
  }
}
// The kernel's parameters after its KernelContext are the op's inputs, attributes and outputs, in
// order, each of the kind its C++ type takes (bind_kernel recorded them).
void check_kernel_params(const OpSpec& op) {
  struct Slot {
    ParamKind kind;
    std::string what;
  };
  std::vector<Slot> want;
  for (const InputSpec& in : op.inputs)
    want.push_back({in.optional ? ParamKind::OptionalInput : ParamKind::Input,
                    (in.optional ? "optional input '" : "input '") + in.name + "'"});
  static constexpr ParamKind by_attr[] = {ParamKind::Int,    ParamKind::Float,  ParamKind::Ints,
                                          ParamKind::Floats, ParamKind::String, ParamKind::Bool};
  for (const AttrSpec& a : op.attrs)
    want.push_back({by_attr[static_cast<int>(a.kind)],
                    "attribute '" + a.name + "' (" + std::string(attr_kind_name(a.kind)) + ")"});
  for (const OutputSpec& o : op.outputs) want.push_back({ParamKind::Output, "output '" + o.name + "'"});
  const std::vector<ParamKind>& got = op.cpu_kernel.params;
  auto signature = [&] {
    std::string s;
    for (const Slot& w : want) s += (s.empty() ? "" : ", ") + std::string(param_type_name(w.kind)) + " (" + w.what + ")";
    return s;
  };
  OB_CHECK(got.size() == want.size(), "the kernel takes ", got.size(), " arguments after its KernelContext; the op has ",
           want.size(), ": ", signature());
  for (size_t p = 0; p < got.size(); ++p)
    OB_CHECK(got[p] == want[p].kind, "kernel argument ", p + 1, " is ", param_type_name(got[p]), ", but it binds ",
             want[p].what, ": take it as ", param_type_name(want[p].kind));
}
}  // namespace

namespace {
// Every required input and attribute without a default is bound once, by a parameter or a fixed
// value of the right kind; nothing else is named.
void check_python_operator(const OpSpec& op, const PythonOperator& p) {
  const std::string& t = p.target;
  OB_CHECK(t.find('.') != std::string::npos && t.front() != '.' && t.back() != '.',
           "replaces: '", t, "' is not a qualified name such as 'package.module.Function'");
  std::set<std::string> bound;
  for (const std::string& name : p.params) {
    if (name.empty()) continue;
    OB_CHECK(op.input_index(name) >= 0 || op.attr_index(name) >= 0, "replaces '", t, "': parameter binds '", name,
             "', which is neither an input nor an attribute");
    OB_CHECK(bound.insert(name).second, "replaces '", t, "': two parameters bind '", name, "'");
  }
  for (const auto& [name, value] : p.fixed) {
    const int a = op.attr_index(name);
    OB_CHECK(a >= 0, "replaces '", t, "': fixes '", name, "', which is not an attribute");
    OB_CHECK(attr_kind_of(value) == op.attrs[a].kind, "replaces '", t, "': the value fixed for '", name,
             "' is not of its kind");
    OB_CHECK(bound.insert(name).second, "replaces '", t, "': '", name, "' is both a parameter and fixed");
  }
  for (const std::string& name : p.returns)
    OB_CHECK(std::any_of(op.outputs.begin(), op.outputs.end(), [&](const OutputSpec& o) { return o.name == name; }),
             "replaces '", t, "': returns '", name, "', which is not an output");
  for (const InputSpec& in : op.inputs)
    OB_CHECK(in.optional || bound.count(in.name), "replaces '", t, "': no parameter binds input '", in.name, "'");
  for (const AttrSpec& a : op.attrs)
    OB_CHECK(a.default_value || bound.count(a.name), "replaces '", t, "': no parameter binds attribute '", a.name,
             "', which has no default");
}
}  // namespace

void validate_spec(const OpSpec& op) {
  check_name("op", op.name);
  OB_CHECK(!op.doc.empty(), "op '", op.name, "' has no doc");
  std::set<std::string> names;
  for (const TypeConstraint& t : op.types) {
    OB_CHECK(names.insert(t.name).second, "duplicate type constraint '", t.name, "'");
    OB_CHECK(!t.allowed.empty(), "type constraint '", t.name, "' allows no dtype");
  }
  names.clear();
  bool seen_optional = false;
  std::set<std::string> bound_types;
  for (const InputSpec& in : op.inputs) {
    check_name("input", in.name);
    OB_CHECK(names.insert(in.name).second, "duplicate input '", in.name, "'");
    op.type(in.type);
    OB_CHECK(in.optional || !seen_optional, "required input '", in.name, "' follows an optional one");
    seen_optional |= in.optional;
    if (!in.optional) bound_types.insert(in.type);
  }
  for (const AttrSpec& a : op.attrs) {
    check_name("attribute", a.name);
    OB_CHECK(names.insert(a.name).second, "attribute '", a.name, "' reuses a name");
    OB_CHECK(!a.default_value || attr_kind_of(*a.default_value) == a.kind, "attribute '", a.name,
             "' has a default of the wrong kind");
    OB_CHECK(!a.symbolic || a.kind == AttrKind::Int, "attribute '", a.name, "' is symbolic but ",
             attr_kind_name(a.kind), "; only an int can be computed from sizes");
    if (a.default_value && a.kind == AttrKind::Float)
      OB_CHECK(std::isfinite(std::get<double>(*a.default_value)), "attribute '", a.name, "' has a non-finite default");
    if (a.default_value && a.kind == AttrKind::Floats)
      for (double v : std::get<std::vector<double>>(*a.default_value))
        OB_CHECK(std::isfinite(v), "attribute '", a.name, "' has a non-finite default");
  }
  if (!op.random_when.empty()) {
    const int a = op.attr_index(op.random_when);
    OB_CHECK(a >= 0 && op.attrs[a].kind == AttrKind::Bool, "random_when names '", op.random_when,
             "', which is not a bool attribute");
  }
  OB_CHECK(!op.outputs.empty(), "op '", op.name, "' has no outputs");
  for (const OutputSpec& o : op.outputs) {
    check_name("output", o.name);
    OB_CHECK(names.insert(o.name).second, "output '", o.name, "' reuses a name");
    // An output's dtype must follow from the required inputs, or be fixed.
    OB_CHECK(op.type(o.type).allowed.size() == 1 || bound_types.count(o.type), "output '", o.name,
             "' has type '", o.type, "', which no required input determines");
    for (const std::string& in : o.shape.inputs) OB_CHECK(op.input_index(in) >= 0, "shape rule names unknown input '", in, "'");
    // A data-dependent size stands alone as a dimension (check_expr refuses it anywhere else).
    for (const DimExpr& e : o.shape.dims)
      if (e.node->kind != DimNode::Kind::Data) check_expr(op, e);
  }
  for (const DimCheck& c : op.checks) {
    check_expr(op, c.lhs);
    check_expr(op, c.rhs);
  }
  if (op.defines_torch_op()) OB_CHECK(op.cpu_kernel, "op '", op.name, "' has no CPU kernel");
  if (op.cpu_kernel) check_kernel_params(op);
  check_export(op);
  for (const PythonOperator& p : op.python_operators) check_python_operator(op, p);
}

namespace {
// The kind of a target attribute filled from `from`: a single attribute keeps its kind; several
// are concatenated into a list of their element kind.
AttrKind mapped_kind(const OpSpec& op, const ExportAttr& a) {
  if (a.value) return attr_kind_of(*a.value);
  OB_CHECK(!a.from.empty(), "export attribute '", a.name, "' maps from no attribute");
  bool ints = false, floats = false;
  for (const std::string& f : a.from) {
    int i = op.attr_index(f);
    OB_CHECK(i >= 0, "export attribute '", a.name, "' maps from unknown attribute '", f, "'");
    if (a.from.size() == 1) return op.attrs[i].kind;
    switch (op.attrs[i].kind) {
      case AttrKind::Int: case AttrKind::Ints: case AttrKind::Bool: ints = true; break;
      case AttrKind::Float: case AttrKind::Floats: floats = true; break;
      case AttrKind::String: OB_CHECK(false, "export attribute '", a.name, "' cannot concatenate string attribute '", f, "'");
    }
  }
  OB_CHECK(!(ints && floats), "export attribute '", a.name, "' concatenates int and float attributes");
  return ints ? AttrKind::Ints : AttrKind::Floats;
}
}  // namespace

std::string ExportRule::opbridge_op() const {
  return (library.empty() ? std::string(this_library().torch_namespace) : library) + "::" + op_type;
}

void resolve_export(OpSpec& op) {
  ExportSpec& ex = op.export_as;
  if (ex.onnx_name.empty()) ex.onnx_name = camel_case(op.name);
  if (ex.onnx_domain.empty()) ex.onnx_domain = this_library().onnx_domain;
  if (ex.onnx_version == 0) ex.onnx_version = this_library().onnx_domain_version;
  std::stable_sort(ex.rules.begin(), ex.rules.end(),
                   [](const ExportRule& a, const ExportRule& b) { return a.min_opset < b.min_opset; });
  for (ExportRule& r : ex.rules) {
    if (r.inputs.empty())
      for (const InputSpec& in : op.inputs) r.inputs.push_back({in.name, {}});
    for (const ExportInput& c : r.conditions) {
      auto it = std::find_if(r.inputs.begin(), r.inputs.end(), [&](const ExportInput& in) { return in.name == c.name; });
      OB_CHECK(it != r.inputs.end(), "export rule ", r.op_type, ": input_when names input '", c.name,
               "', which the rule does not write");
      it->when = c.when;
    }
    for (ExportAttr& a : r.attrs) a.kind = mapped_kind(op, a);
    // An opbridge op's node is resolved by the export glue, which sees every loaded library.
    if (r.target == ExportRule::Target::Standard) r.target_type = r.op_type;
    if (r.target == ExportRule::Target::Node) {
      r.target_domain = r.domain;
      r.target_type = r.op_type;
    }
  }
}

void check_export(const OpSpec& op) {
  const ExportSpec& ex = op.export_as;
  bool function = !ex.function_body.empty();
  OB_CHECK(op.cpu_kernel || function || !ex.rules.empty(), "op '", op.name,
           "' has neither a kernel, an export rule nor a function body: nothing to export");
  if (function) {
    OB_CHECK(!op.cpu_kernel && ex.rules.empty(), "op '", op.name,
             "' is exported as a function and must have no kernel and no other export rule");
    OB_CHECK(ex.function_opset >= 1, "op '", op.name, "': the function body needs an ai.onnx opset >= 1");
  }
  for (size_t k = 0; k < ex.rules.size(); ++k) {
    const ExportRule& r = ex.rules[k];
    OB_CHECK(!r.op_type.empty(), "an export rule names no op");
    OB_CHECK(r.min_opset >= 1, "export rule ", r.op_type, " has min_opset ", r.min_opset);
    OB_CHECK(k == 0 || ex.rules[k - 1].min_opset < r.min_opset, "two export rules start at opset ", r.min_opset);
    for (const ExportInput& in : r.inputs) {
      OB_CHECK(in.name.empty() || op.input_index(in.name) >= 0, "export rule ", r.op_type, " names unknown input '",
               in.name, "'");
      if (!in.when.empty()) {
        int a = op.attr_index(in.when);
        OB_CHECK(a >= 0 && op.attrs[a].kind == AttrKind::Bool, "export rule ", r.op_type, ": input '", in.name,
                 "' depends on '", in.when, "', which is not a bool attribute");
      }
    }
    for (const ExportAttr& a : r.attrs) mapped_kind(op, a);
    OB_CHECK(r.portable_only.empty() || op.cpu_kernel, "export rule ", r.op_type,
             ": portable_only needs the op's own kernel to export instead");
    if (r.target == ExportRule::Target::Node)
      OB_CHECK(!r.domain.empty() && r.domain != "ai.onnx", "export rule ", r.op_type,
               ": a node of the standard domain is written with ExportTo(op_type, min_opset)");
    for (const TypeConstraint& t : r.target_types) {
      const TypeConstraint& own = op.type(t.name);
      OB_CHECK(!t.allowed.empty(), "export rule ", r.op_type, ": target_types for '", t.name, "' allows no dtype");
      for (DType d : t.allowed)
        OB_CHECK(std::find(own.allowed.begin(), own.allowed.end(), d) != own.allowed.end(), "export rule ", r.op_type,
                 ": target_types names ", dtype_name(d), " for '", t.name, "', which the op does not take");
    }
  }
}

}  // namespace opbridge
