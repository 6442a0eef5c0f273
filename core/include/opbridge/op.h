// What an op file includes: the builder that writes an OpSpec, the kernel context, and the
// registration macro. See docs/adding-an-op.md.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "opbridge/kernel_context.h"
#include "opbridge/op_spec.h"
#include "opbridge/registry.h"

namespace opbridge {

class OpBuilder {
 public:
  explicit OpBuilder(std::string name) { spec_.name = std::move(name); }

  OpBuilder& doc(std::string d) { spec_.doc = std::move(d); return *this; }
  // A named type variable: inputs and outputs that name it share one dtype at run time.
  OpBuilder& types(std::string name, std::initializer_list<DType> allowed) {
    spec_.types.push_back({std::move(name), allowed});
    return *this;
  }
  OpBuilder& input(std::string name, std::string type, std::string doc, int rank = -1) {
    spec_.inputs.push_back({std::move(name), std::move(type), std::move(doc), false, rank});
    return *this;
  }
  // Optional inputs come last; an absent one may be replaced by another input in shape rules
  // (dim_of_first({"new_xyz", "xyz"}, 0)) and is seen as absent by the kernel.
  OpBuilder& optional_input(std::string name, std::string type, std::string doc, int rank = -1) {
    spec_.inputs.push_back({std::move(name), std::move(type), std::move(doc), true, rank});
    return *this;
  }
  // Attributes, typed so that a literal default can never pick the wrong kind.
  OpBuilder& int_attr(std::string name, std::string doc) { return attr(std::move(name), AttrKind::Int, std::nullopt, std::move(doc)); }
  OpBuilder& int_attr(std::string name, int64_t def, std::string doc) { return attr(std::move(name), AttrKind::Int, AttrValue{def}, std::move(doc)); }
  OpBuilder& float_attr(std::string name, std::string doc) { return attr(std::move(name), AttrKind::Float, std::nullopt, std::move(doc)); }
  OpBuilder& float_attr(std::string name, double def, std::string doc) { return attr(std::move(name), AttrKind::Float, AttrValue{def}, std::move(doc)); }
  OpBuilder& ints_attr(std::string name, std::string doc) { return attr(std::move(name), AttrKind::Ints, std::nullopt, std::move(doc)); }
  OpBuilder& ints_attr(std::string name, std::vector<int64_t> def, std::string doc) { return attr(std::move(name), AttrKind::Ints, AttrValue{std::move(def)}, std::move(doc)); }
  OpBuilder& floats_attr(std::string name, std::vector<double> def, std::string doc) { return attr(std::move(name), AttrKind::Floats, AttrValue{std::move(def)}, std::move(doc)); }
  OpBuilder& bool_attr(std::string name, bool def, std::string doc) { return attr(std::move(name), AttrKind::Bool, AttrValue{def}, std::move(doc)); }
  OpBuilder& string_attr(std::string name, std::string def, std::string doc) { return attr(std::move(name), AttrKind::String, AttrValue{std::move(def)}, std::move(doc)); }
  OpBuilder& output(std::string name, std::string type, ShapeRule shape, std::string doc) {
    spec_.outputs.push_back({std::move(name), std::move(type), std::move(doc), std::move(shape)});
    return *this;
  }
  // An output with a fixed dtype (e.g. int32 indices) gets a type constraint of its own.
  OpBuilder& output(std::string name, DType dtype, ShapeRule shape, std::string doc) {
    std::string type = "T_" + name;
    spec_.types.push_back({type, {dtype}});
    return output(std::move(name), std::move(type), std::move(shape), std::move(doc));
  }
  OpBuilder& check(DimCheck c, std::string what) {
    c.what = std::move(what);
    spec_.checks.push_back(std::move(c));
    return *this;
  }
  OpBuilder& cpu(KernelFn fn) { spec_.cpu_kernel = fn; return *this; }

  // Export to a standard ai.onnx op (available from `min_opset`) instead of a custom node.
  OpBuilder& export_standard(std::string onnx_name, int min_opset) {
    spec_.export_as = {ExportSpec::Kind::Standard, "", std::move(onnx_name), min_opset};
    return *this;
  }
  // The op already exists in PyTorch ("aten::<name>"); opbridge only adds its export rule.
  OpBuilder& torch_op(std::string qualified) { spec_.torch_op = std::move(qualified); return *this; }

  OpSpec build() && { return std::move(spec_); }

 private:
  OpBuilder& attr(std::string name, AttrKind kind, std::optional<AttrValue> def, std::string doc) {
    spec_.attrs.push_back({std::move(name), kind, std::move(def), std::move(doc)});
    return *this;
  }
  OpSpec spec_;
};

struct OpRegistrar {
  OpRegistrar(OpBuilder& b) { registry().add(std::move(b).build()); }  // NOLINT: implicit by design
};

}  // namespace opbridge

#define OB_CONCAT_INNER(a, b) a##b
#define OB_CONCAT(a, b) OB_CONCAT_INNER(a, b)
// Registers an op when the library loads. init_priority makes every op registration run before
// the adapters' own static initialisers (which read the registry), whatever the link order.
#define OPBRIDGE_OP(NAME)                                                            \
  static ::opbridge::OpRegistrar OB_CONCAT(ob_op_registrar_, __COUNTER__)           \
      __attribute__((init_priority(200))) = ::opbridge::OpBuilder(#NAME)
