#include "opbridge/prepare.h"

#include <algorithm>

#include "opbridge/shape_infer.h"

namespace opbridge {

namespace {
std::string dtype_list(const TypeConstraint& t) {
  std::string s;
  for (size_t i = 0; i < t.allowed.size(); ++i)
    s += std::string(i == 0 ? "" : (i + 1 == t.allowed.size() ? " or " : ", ")) + std::string(dtype_name(t.allowed[i]));
  return s;
}
}  // namespace

std::vector<DType> resolve_types(const OpSpec& op, const std::vector<std::optional<DType>>& input_dtypes) {
  std::vector<DType> resolved;
  resolve_types(op, input_dtypes, resolved);
  return resolved;
}

void resolve_types(const OpSpec& op, const std::vector<std::optional<DType>>& input_dtypes, std::vector<DType>& resolved) {
  OB_CHECK(input_dtypes.size() == op.inputs.size(), "expected ", op.inputs.size(), " inputs, got ",
           input_dtypes.size());
  resolved.clear();
  for (const TypeConstraint& t : op.types) {
    std::optional<DType> chosen;
    std::string_view chosen_by;
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const InputSpec& in = op.inputs[i];
      if (in.type != t.name || !input_dtypes[i]) continue;
      DType d = *input_dtypes[i];
      bool allowed = std::find(t.allowed.begin(), t.allowed.end(), d) != t.allowed.end();
      OB_CHECK(allowed, "input '", in.name, "' has dtype ", dtype_name(d), "; expected ", dtype_list(t));
      OB_CHECK(!chosen || *chosen == d, "inputs '", chosen_by, "' (", dtype_name(*chosen), ") and '", in.name, "' (",
               dtype_name(d), ") must have the same dtype");
      chosen = d, chosen_by = in.name;
    }
    resolved.push_back(chosen.value_or(t.allowed.front()));
  }
}

std::vector<DType> output_dtypes(const OpSpec& op, const std::vector<DType>& resolved) {
  std::vector<DType> out;
  output_dtypes(op, resolved, out);
  return out;
}

void output_dtypes(const OpSpec& op, const std::vector<DType>& resolved, std::vector<DType>& out) {
  out.clear();
  for (const OutputSpec& o : op.outputs)
    for (size_t t = 0; t < op.types.size(); ++t)
      if (op.types[t].name == o.type) out.push_back(resolved[t]);
}

std::vector<AttrValue> resolve_attrs(const OpSpec& op, std::vector<std::optional<AttrValue>> given) {
  OB_CHECK(given.size() == op.attrs.size(), "expected ", op.attrs.size(), " attributes, got ", given.size());
  std::vector<AttrValue> out;
  for (size_t i = 0; i < op.attrs.size(); ++i) {
    const AttrSpec& a = op.attrs[i];
    if (!given[i]) {
      OB_CHECK(a.default_value, "required attribute '", a.name, "' (", attr_kind_name(a.kind), ") is missing");
      out.push_back(*a.default_value);
      continue;
    }
    AttrKind k = attr_kind_of(*given[i]);
    OB_CHECK(k == a.kind, "attribute '", a.name, "' must be ", attr_kind_name(a.kind), ", got ", attr_kind_name(k));
    out.push_back(std::move(*given[i]));
  }
  return out;
}

PreparedCall prepare_call(const OpSpec& op, const std::vector<const TensorView*>& inputs,
                          const std::vector<AttrValue>& attrs) {
  PreparedCall call;
  prepare_call(op, inputs, attrs, call);
  return call;
}

void prepare_call(const OpSpec& op, const std::vector<const TensorView*>& inputs, const std::vector<AttrValue>& attrs,
                  PreparedCall& call) {
  call.input_dtypes.clear();
  call.input_shapes.clear();
  for (const TensorView* t : inputs) {
    call.input_dtypes.push_back(t ? std::optional<DType>(t->dtype) : std::nullopt);
    call.input_shapes.push_back(t ? &t->shape : nullptr);
  }
  if (call.last_op == &op && call.input_dtypes == call.last_dtypes && attrs == call.last_attrs) {
    bool same = true;
    for (size_t i = 0; same && i < inputs.size(); ++i) same = !inputs[i] || inputs[i]->shape == call.last_shapes[i];
    if (same) return;  // output_dtypes and output_shapes still hold the last call's
  }
  call.last_op = nullptr;  // until this call's rules have passed
  resolve_types(op, call.input_dtypes, call.resolved);
  output_dtypes(op, call.resolved, call.output_dtypes);
  ShapeInference<int64_t>(op, call.input_shapes, attrs).run(call.output_shapes);
  call.last_dtypes = call.input_dtypes;
  call.last_shapes.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i]) call.last_shapes[i] = inputs[i]->shape;
    else call.last_shapes[i].clear();
  }
  call.last_attrs = attrs;
  call.last_op = &op;
}

}  // namespace opbridge
