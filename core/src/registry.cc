#include "opbridge/registry.h"

#include <cstdio>

#include "opbridge/error.h"

namespace opbridge {

Registry& registry() {
  static Registry r;
  return r;
}

namespace {
// A rule that writes another op of this library must fit that op's signature: the ONNX schema
// registered for it would reject the node, and the two exporters would disagree on the kinds.
void check_library_target(const OpSpec& op, const ExportRule& r, const OpSpec& target) {
  auto where = [&] { return detail::concat("export rule to library op '", target.name, "': "); };
  OB_CHECK(target.cpu_kernel, where(), "the op has no kernel, so no node of its own");
  OB_CHECK(r.inputs.size() <= target.inputs.size(), where(), "writes ", r.inputs.size(), " inputs; the op has ",
           target.inputs.size());
  auto check_attr = [&](const std::string& name, AttrKind kind) {
    int t = target.attr_index(name);
    OB_CHECK(t >= 0, where(), "the op has no attribute '", name, "'");
    OB_CHECK(target.attrs[t].kind == kind, where(), "attribute '", name, "' is ", attr_kind_name(target.attrs[t].kind),
             ", the rule writes ", attr_kind_name(kind));
  };
  if (r.maps_attrs) {
    for (const ExportAttr& a : r.attrs) check_attr(a.name, a.kind);
  } else {
    for (const AttrSpec& a : op.attrs) check_attr(a.name, a.kind);
  }
}
// The backward op's arguments must name this op's: see OpBuilder::backward.
void check_backward(const OpSpec& op, const OpSpec& bwd) {
  auto where = [&] { return detail::concat("backward op '", bwd.name, "': "); };
  OB_CHECK(bwd.cpu_kernel && bwd.defines_torch_op(), where(), "needs a kernel of its own");
  auto is_output = [&](std::string_view n) {
    for (const OutputSpec& o : op.outputs)
      if (o.name == n) return true;
    return false;
  };
  for (const InputSpec& in : bwd.inputs) {
    const bool grad = in.name.rfind("grad_", 0) == 0 && is_output(std::string_view(in.name).substr(5));
    OB_CHECK(grad || op.input_index(in.name) >= 0 || is_output(in.name), where(), "input '", in.name,
             "' is neither grad_<output>, an input nor an output of '", op.name, "'");
  }
  for (const AttrSpec& a : bwd.attrs) {
    const int i = op.attr_index(a.name);
    OB_CHECK(i >= 0 && op.attrs[i].kind == a.kind, where(), "attribute '", a.name, "' must be an attribute of '",
             op.name, "' of the same kind");
  }
  for (const OutputSpec& o : bwd.outputs)
    OB_CHECK(o.name.rfind("grad_", 0) == 0 && op.input_index(std::string_view(o.name).substr(5)) >= 0, where(),
             "output '", o.name, "' must be grad_<input> of '", op.name, "'");
}
}  // namespace

void Registry::add(OpSpec spec) {
  try {
    resolve_export(spec);
    validate_spec(spec);
    OB_CHECK(!find(spec.name), "op '", spec.name, "' is registered twice");
  } catch (const Error& e) {
    errors_.push_back("op '" + spec.name + "': " + e.what());
    std::fprintf(stderr, "opbridge: op '%s' left out: %s\n", spec.name.c_str(), e.what());
    return;
  }
  ops_.push_back(std::move(spec));
  // Rules of this op and of earlier ops that name a library op: resolved as soon as both exist.
  for (OpSpec& op : ops_) resolve_library_rules(op);
  // A backward op is checked once both it and its op exist, i.e. when the later one is added
  // (errors() reports one that never registers).
  const OpSpec& added = ops_.back();
  for (const OpSpec& op : ops_) {
    const OpSpec* bwd = op.backward.empty() ? nullptr : find(op.backward);
    if (!bwd || (&op != &added && bwd != &added)) continue;
    try {
      check_backward(op, *bwd);
    } catch (const Error& e) {
      errors_.push_back("op '" + op.name + "': " + e.what());
    }
  }
}

void Registry::resolve_library_rules(OpSpec& op) {
  for (ExportRule& r : op.export_as.rules) {
    if (!r.same_library() || !r.target_type.empty()) continue;
    const OpSpec* target = find(r.op_type);
    if (!target) continue;  // not registered yet; errors() reports it if it never is
    try {
      check_library_target(op, r, *target);
      r.target_domain = target->export_as.onnx_domain;
      r.target_type = target->export_as.onnx_name;
    } catch (const Error& e) {
      errors_.push_back("op '" + op.name + "': " + e.what());
      r.target_type = "?";  // reported once; never written
    }
  }
}

std::vector<std::string> Registry::errors() const {
  std::vector<std::string> all = errors_;
  for (const OpSpec& op : ops_)
    if (!op.backward.empty() && !find(op.backward))
      all.push_back("op '" + op.name + "': backward op '" + op.backward + "' is not defined in this library");
  for (const OpSpec& op : ops_)
    for (const ExportRule& r : op.export_as.rules)
      if (r.same_library() && r.target_type.empty())
        all.push_back("op '" + op.name + "': export rule names library op '" + r.op_type +
                      "', which this library does not define");
  return all;
}

const OpSpec* Registry::find(std::string_view name) const {
  for (const OpSpec& op : ops_)
    if (op.name == name) return &op;
  return nullptr;
}

}  // namespace opbridge
