// The manifest: every op of the registry as JSON, the one contract between the C++ side and the
// Python export glue (python/opbridge/_manifest.py reads it). Validation happened when the ops
// were registered; this file only writes.
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
  static constexpr const char* targets[] = {"standard", "library", "node"};
  json j = {{"target", targets[static_cast<int>(r.target)]}, {"domain", r.target_domain}, {"op_type", r.target_type},
            {"min_opset", r.min_opset}, {"inputs", std::move(inputs)}, {"attributes", std::move(attrs)},
            {"target_types", std::move(types)}, {"portable_only", r.portable_only}};
  // A library op of another library: the glue finds its node among the loaded libraries.
  if (r.target == ExportRule::Target::Library)
    j["library_op"] = (r.library.empty() ? std::string(this_library().torch_namespace) : r.library) + "::" + r.op_type;
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

// What PyTorch's generic fake kernel needs for an output of data-dependent size: input
// dimensions, constants and fresh sizes.
json fake_dims(const OutputSpec& o) {
  json dims = json::array();
  for (const DimExpr& e : o.shape.dims) {
    const DimNode& n = *e.node;
    if (n.kind == DimNode::Kind::Dim) dims.push_back({{"inputs", n.inputs}, {"axis", n.value}});
    else if (n.kind == DimNode::Kind::Const) dims.push_back({{"const", n.value}});
    else dims.push_back({{"data_dependent", true}});
  }
  return dims;
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
    attrs.push_back(std::move(j));
  }
  for (const OutputSpec& o : op.outputs) {
    json j = {{"name", o.name}, {"type", o.type}, {"shape", o.shape.str()}, {"doc", o.doc}};
    if (op.has_data_dependent_output()) j["fake_dims"] = fake_dims(o);
    outputs.push_back(std::move(j));
  }
  for (const DimCheck& c : op.checks) checks.push_back(c.str() + ": " + c.what);
  return {{"name", op.name}, {"qualified_name", op.qualified_name()}, {"defines_torch_op", op.defines_torch_op()},
          {"doc", op.doc}, {"export", export_json(op)}, {"types", std::move(types)}, {"inputs", std::move(inputs)},
          {"attributes", std::move(attrs)}, {"outputs", std::move(outputs)}, {"checks", std::move(checks)},
          {"backward", op.backward}};
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
