// The manifest: every op of the registry as JSON, the one contract between the C++ side and the
// Python package (python/opbridge/_library/manifest.py reads it). Validation happened when the
// ops were registered; this file only writes.
#include <cmath>

#include <nlohmann/json.hpp>

#include "opbridge/registry.h"

namespace opbridge {
namespace {
using nlohmann::json;

json value(const AttrValue& v) {
  auto finite = [](double x) { return std::isfinite(x) ? json(x) : json(nullptr); };  // JSON has no inf/nan
  switch (attr_kind_of(v)) {
    case AttrKind::Int: return std::get<int64_t>(v);
    case AttrKind::Float: return finite(std::get<double>(v));
    case AttrKind::Ints: return std::get<std::vector<int64_t>>(v);
    case AttrKind::Floats: {
      json out = json::array();
      for (double x : std::get<std::vector<double>>(v)) out.push_back(finite(x));
      return out;
    }
    case AttrKind::String: return std::get<std::string>(v);
    case AttrKind::Bool: return std::get<bool>(v);
  }
  return nullptr;
}

// "kernel": a node of the library's domain run by its kernel; "function": a node of the
// library's domain defined by an ONNX function; "mapping": no node of its own, export rules only.
const char* export_kind(const OpSpec& op) {
  if (!op.export_as.function_body.empty()) return "function";
  return op.cpu_kernel ? "kernel" : "mapping";
}

json rule_json(const OpSpec& op, const ExportRule& r) {
  json inputs = json::array(), attrs = json::array();
  for (const ExportInput& in : r.inputs) inputs.push_back({{"name", in.name}, {"when", in.when}});
  if (!r.maps_attrs) {
    for (const AttrSpec& a : op.attrs)
      attrs.push_back({{"name", a.name}, {"kind", attr_kind_name(a.kind)}, {"from", {a.name}}});
  } else {
    for (const ExportAttr& a : r.attrs) {
      json j = {{"name", a.name}, {"kind", attr_kind_name(a.kind)}};
      if (a.value) j["value"] = value(*a.value);
      else j["from"] = a.from;
      attrs.push_back(std::move(j));
    }
  }
  json types = json::object();
  for (const TypeConstraint& t : r.target_types) {
    json names = json::array();
    for (DType d : t.allowed) names.push_back(dtype_name(d));
    types[t.name] = std::move(names);
  }
  static constexpr const char* targets[] = {"standard", "opbridge_op", "node"};
  json j = {{"target", targets[static_cast<int>(r.target)]}, {"domain", r.target_domain}, {"op_type", r.target_type},
            {"min_opset", r.min_opset}, {"inputs", std::move(inputs)}, {"attributes", std::move(attrs)},
            {"target_types", std::move(types)}, {"portable_only", r.portable_only}};
  // The glue finds an opbridge op's node among the loaded libraries.
  if (r.target == ExportRule::Target::OpbridgeOp) j["opbridge_op"] = r.opbridge_op();
  return j;
}

json export_json(const OpSpec& op) {
  const ExportSpec& ex = op.export_as;
  json rules = json::array();
  for (const ExportRule& r : ex.rules) rules.push_back(rule_json(op, r));
  json j = {{"kind", export_kind(op)}, {"domain", ex.onnx_domain}, {"op_type", ex.onnx_name},
            {"since_version", ex.onnx_version}, {"rules", std::move(rules)}};
  if (!ex.function_body.empty()) j["function"] = {{"opset", ex.function_opset}, {"body", ex.function_body}};
  return j;
}

// Shape rules and checks as the expression trees they are, so that Python evaluates the same
// rule (python/opbridge/_library/shapes.py) instead of reading it back from text:
//   {"const": 3}  {"dim": {"inputs": ["new_xyz", "xyz"], "axis": 0}}  {"attr": "k"}
//   {"attr": "stride", "index": 0}  {"op": "+" | "-" | "*" | "//", "args": [a, b]}
//   {"data": "pairs"} (a data-dependent size; "" for one of its own)
json expr_json(const DimExpr& e) {
  const DimNode& n = *e.node;
  using K = DimNode::Kind;
  switch (n.kind) {
    case K::Const: return {{"const", n.value}};
    case K::Dim: return {{"dim", {{"inputs", n.inputs}, {"axis", n.value}}}};
    case K::Attr: return {{"attr", n.name}};
    case K::AttrAt: return {{"attr", n.name}, {"index", n.value}};
    case K::Data: return {{"data", n.name}};
    case K::Add: case K::Sub: case K::Mul: case K::FloorDiv: {
      static constexpr const char* ops[] = {"+", "-", "*", "//"};
      return {{"op", ops[static_cast<int>(n.kind) - static_cast<int>(K::Add)]},
              {"args", {expr_json(n.lhs), expr_json(n.rhs)}}};
    }
  }
  return nullptr;
}

json shape_json(const ShapeRule& r) {
  static constexpr const char* kinds[] = {"broadcast", "same", "dims"};
  json dims = json::array();
  for (const DimExpr& e : r.dims) dims.push_back(expr_json(e));
  return {{"kind", kinds[static_cast<int>(r.kind)]}, {"inputs", r.inputs}, {"dims", std::move(dims)},
          {"text", r.str()}};
}

json check_json(const DimCheck& c) {
  static constexpr const char* rels[] = {"==", ">=", ">", "<=", "<"};
  return {{"lhs", expr_json(c.lhs)}, {"rel", rels[static_cast<int>(c.rel)]}, {"rhs", expr_json(c.rhs)},
          {"what", c.what}, {"text", c.str()}};
}

json op_json(const OpSpec& op) {
  json types = json::array(), inputs = json::array(), attrs = json::array(), outputs = json::array(),
       checks = json::array();
  for (const TypeConstraint& t : op.types) {
    json names = json::array(), onnx = json::array();
    for (DType d : t.allowed) {
      names.push_back(dtype_name(d));
      onnx.push_back(dtype_onnx_tensor_type(d));
    }
    types.push_back({{"name", t.name}, {"dtypes", std::move(names)}, {"onnx", std::move(onnx)}});
  }
  for (const InputSpec& in : op.inputs)
    inputs.push_back({{"name", in.name}, {"type", in.type}, {"optional", in.optional}, {"rank", in.rank}, {"doc", in.doc}});
  for (const AttrSpec& a : op.attrs) {
    json j = {{"name", a.name}, {"kind", attr_kind_name(a.kind)}, {"doc", a.doc}};
    if (a.default_value) j["default"] = value(*a.default_value);
    if (a.symbolic) j["symbolic"] = true;  // a node may give it as an input (AttrSpec::symbolic)
    attrs.push_back(std::move(j));
  }
  for (const OutputSpec& o : op.outputs)
    outputs.push_back({{"name", o.name}, {"type", o.type}, {"shape", shape_json(o.shape)},
                       {"data_dependent", o.data_dependent()}, {"doc", o.doc}});
  for (const DimCheck& c : op.checks) checks.push_back(check_json(c));
  json replaces = json::array();
  for (const PythonOperator& p : op.python_operators) {
    json fixed = json::object();
    for (const auto& [name, v] : p.fixed) fixed[name] = value(v);
    replaces.push_back({{"target", p.target}, {"params", p.params}, {"fixed", std::move(fixed)}, {"returns", p.returns}});
  }
  return {{"name", op.name}, {"qualified_name", op.qualified_name()}, {"defines_torch_op", op.defines_torch_op()},
          {"doc", op.doc}, {"export", export_json(op)}, {"types", std::move(types)}, {"inputs", std::move(inputs)},
          {"attributes", std::move(attrs)}, {"outputs", std::move(outputs)}, {"checks", std::move(checks)},
          {"backward", op.backward}, {"check_op", op.check_op()}, {"random_when", op.random_when},
          {"replaces", std::move(replaces)}};
}
}  // namespace

std::string manifest_json() {
  const LibraryInfo& lib = this_library();
  json ops = json::array();
  for (const OpSpec& op : registry().ops()) ops.push_back(op_json(op));
  json j = {{"library", lib.name}, {"torch_namespace", lib.torch_namespace}, {"onnx_domain", lib.onnx_domain},
            {"onnx_domain_version", lib.onnx_domain_version}, {"ops", std::move(ops)},
            {"errors", registry().errors()}};
  // Invalid UTF-8 in a doc string is replaced rather than thrown while a library loads.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace opbridge

// The manifest, exported by both libraries of an op library (the only symbol of its PyTorch side,
// beside RegisterCustomOps on its ONNX Runtime side): Python reads it with ctypes, from the ONNX
// Runtime side when PyTorch is not loaded. Its name comes from the build (OpBridgeFunctions.cmake).
extern "C" __attribute__((visibility("default"))) const char* OPBRIDGE_MANIFEST_SYMBOL() {
  static const std::string json = opbridge::manifest_json();
  return json.c_str();
}
