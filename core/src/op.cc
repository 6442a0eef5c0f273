// The builder's members (op.h). Defined here rather than inline in the header: every op's source
// would otherwise compile and optimise its own copy of them and of the spec's copies, moves and
// destructors, which was most of the code of a small op's translation unit.
#include "opbridge/op.h"

namespace opbridge {

// ---- ExportTo --------------------------------------------------------------------------------
ExportTo::ExportTo(std::string onnx_type, int min_opset) {
  rule_.op_type = std::move(onnx_type);
  rule_.min_opset = min_opset;
}
ExportTo::ExportTo(const ExportTo&) = default;
ExportTo::ExportTo(ExportTo&&) noexcept = default;
ExportTo& ExportTo::operator=(const ExportTo&) = default;
ExportTo& ExportTo::operator=(ExportTo&&) noexcept = default;
ExportTo::~ExportTo() = default;

ExportTo ExportTo::opbridge_op(std::string op_name, int min_opset) {
  ExportTo t("", min_opset);
  t.rule_.target = ExportRule::Target::OpbridgeOp;
  if (auto sep = op_name.find("::"); sep != std::string::npos) {
    t.rule_.library = op_name.substr(0, sep);
    op_name = op_name.substr(sep + 2);
  }
  t.rule_.op_type = std::move(op_name);
  return t;
}

ExportTo ExportTo::node(std::string domain, std::string op_type, int min_opset) {
  ExportTo t(std::move(op_type), min_opset);
  t.rule_.target = ExportRule::Target::Node;
  t.rule_.domain = std::move(domain);
  return t;
}

ExportTo& ExportTo::target_types(std::string type, std::initializer_list<DType> dtypes) {
  rule_.target_types.push_back({std::move(type), dtypes});
  return *this;
}

ExportTo& ExportTo::portable_only(std::string why) {
  rule_.portable_only = std::move(why);
  return *this;
}

ExportTo& ExportTo::inputs(std::vector<std::string> names) {
  rule_.inputs.clear();
  for (std::string& n : names) rule_.inputs.push_back({std::move(n), {}});
  return *this;
}

ExportTo& ExportTo::input_when(std::string input, std::string flag) {
  rule_.conditions.push_back({std::move(input), std::move(flag)});
  return *this;
}

ExportTo& ExportTo::attr(std::string name, std::vector<std::string> from) { return add({std::move(name), std::move(from), std::nullopt}); }
ExportTo& ExportTo::attr_int(std::string name, int64_t v) { return add({std::move(name), {}, AttrValue{v}}); }
ExportTo& ExportTo::attr_float(std::string name, double v) { return add({std::move(name), {}, AttrValue{v}}); }
ExportTo& ExportTo::attr_string(std::string name, std::string v) { return add({std::move(name), {}, AttrValue{std::move(v)}}); }
ExportRule ExportTo::build() && { return std::move(rule_); }

ExportTo& ExportTo::add(ExportAttr a) {
  rule_.maps_attrs = true;
  rule_.attrs.push_back(std::move(a));
  return *this;
}

// ---- OpBuilder -------------------------------------------------------------------------------
OpBuilder::OpBuilder(std::string name) { spec_.name = std::move(name); }
OpBuilder::OpBuilder(const OpBuilder&) = default;
OpBuilder::OpBuilder(OpBuilder&&) noexcept = default;
OpBuilder& OpBuilder::operator=(const OpBuilder&) = default;
OpBuilder& OpBuilder::operator=(OpBuilder&&) noexcept = default;
OpBuilder::~OpBuilder() = default;

OpBuilder& OpBuilder::doc(std::string d) {
  spec_.doc = std::move(d);
  return *this;
}

OpBuilder& OpBuilder::types(std::string name, std::initializer_list<DType> allowed) {
  spec_.types.push_back({std::move(name), allowed});
  return *this;
}

OpBuilder& OpBuilder::input(std::string name, std::string type, std::string doc, int rank) {
  spec_.inputs.push_back({std::move(name), std::move(type), std::move(doc), false, rank});
  return *this;
}

OpBuilder& OpBuilder::optional_input(std::string name, std::string type, std::string doc, int rank) {
  spec_.inputs.push_back({std::move(name), std::move(type), std::move(doc), true, rank});
  return *this;
}

OpBuilder& OpBuilder::int_attr(std::string name, std::string doc) { return attr(std::move(name), AttrKind::Int, std::nullopt, std::move(doc)); }
OpBuilder& OpBuilder::int_attr(std::string name, int64_t def, std::string doc) { return attr(std::move(name), AttrKind::Int, AttrValue{def}, std::move(doc)); }
OpBuilder& OpBuilder::sym_int_attr(std::string name, std::string doc) { return attr(std::move(name), AttrKind::Int, std::nullopt, std::move(doc), true); }
OpBuilder& OpBuilder::sym_int_attr(std::string name, int64_t def, std::string doc) { return attr(std::move(name), AttrKind::Int, AttrValue{def}, std::move(doc), true); }
OpBuilder& OpBuilder::float_attr(std::string name, std::string doc) { return attr(std::move(name), AttrKind::Float, std::nullopt, std::move(doc)); }
OpBuilder& OpBuilder::float_attr(std::string name, double def, std::string doc) { return attr(std::move(name), AttrKind::Float, AttrValue{def}, std::move(doc)); }
OpBuilder& OpBuilder::ints_attr(std::string name, std::string doc) { return attr(std::move(name), AttrKind::Ints, std::nullopt, std::move(doc)); }
OpBuilder& OpBuilder::ints_attr(std::string name, std::vector<int64_t> def, std::string doc) { return attr(std::move(name), AttrKind::Ints, AttrValue{std::move(def)}, std::move(doc)); }
OpBuilder& OpBuilder::floats_attr(std::string name, std::string doc) { return attr(std::move(name), AttrKind::Floats, std::nullopt, std::move(doc)); }
OpBuilder& OpBuilder::floats_attr(std::string name, std::vector<double> def, std::string doc) { return attr(std::move(name), AttrKind::Floats, AttrValue{std::move(def)}, std::move(doc)); }
OpBuilder& OpBuilder::bool_attr(std::string name, bool def, std::string doc) { return attr(std::move(name), AttrKind::Bool, AttrValue{def}, std::move(doc)); }
OpBuilder& OpBuilder::string_attr(std::string name, std::string def, std::string doc) { return attr(std::move(name), AttrKind::String, AttrValue{std::move(def)}, std::move(doc)); }

OpBuilder& OpBuilder::output(std::string name, std::string type, ShapeRule shape, std::string doc) {
  spec_.outputs.push_back({std::move(name), std::move(type), std::move(doc), std::move(shape)});
  return *this;
}

OpBuilder& OpBuilder::output(std::string name, DType dtype, ShapeRule shape, std::string doc) {
  std::string type = "T_" + name;
  spec_.types.push_back({type, {dtype}});
  return output(std::move(name), std::move(type), std::move(shape), std::move(doc));
}

OpBuilder& OpBuilder::check(DimCheck c, std::string what) {
  c.what = std::move(what);
  spec_.checks.push_back(std::move(c));
  return *this;
}

OpBuilder& OpBuilder::cpu_kernel(Kernel k) {
  spec_.cpu_kernel = std::move(k);
  return *this;
}

OpBuilder& OpBuilder::backward(std::string op) {
  spec_.backward = std::move(op);
  return *this;
}

OpBuilder& OpBuilder::random_when(std::string attr) {
  spec_.random_when = std::move(attr);
  return *this;
}

OpBuilder& OpBuilder::export_standard(std::string onnx_type, int min_opset) { return export_as(ExportTo(std::move(onnx_type), min_opset)); }

OpBuilder& OpBuilder::export_as(ExportTo rule) {
  spec_.export_as.rules.push_back(std::move(rule).build());
  return *this;
}

OpBuilder& OpBuilder::export_function(int min_opset, std::string body) {
  spec_.export_as.function_opset = min_opset;
  spec_.export_as.function_body = std::move(body);
  return *this;
}

OpBuilder& OpBuilder::replaces(std::string target, std::vector<std::string> params,
                               std::vector<std::pair<std::string, AttrValue>> fixed, std::vector<std::string> returns) {
  spec_.python_operators.push_back({std::move(target), std::move(params), std::move(fixed), std::move(returns)});
  return *this;
}

OpBuilder& OpBuilder::existing_torch_op(std::string qualified) {
  spec_.existing_torch_op = std::move(qualified);
  return *this;
}

OpBuilder& OpBuilder::onnx_node(std::string onnx_type, std::string domain, int version) {
  spec_.export_as.onnx_version = domain.empty() ? 0 : version;  // in the library's domain: its version
  spec_.export_as.onnx_name = std::move(onnx_type);
  spec_.export_as.onnx_domain = std::move(domain);
  return *this;
}

OpSpec OpBuilder::build() && { return std::move(spec_); }

OpBuilder& OpBuilder::attr(std::string name, AttrKind kind, std::optional<AttrValue> def, std::string doc, bool symbolic) {
  spec_.attrs.push_back({std::move(name), kind, std::move(def), std::move(doc), symbolic});
  return *this;
}

OpRegistrar::OpRegistrar(OpBuilder& b) { registry().add(std::move(b).build()); }

}  // namespace opbridge
